"""Method-independent RL parts: policies, returns, baselines, policy-gradient losses, rewards, schedules."""

from rlattention.rl.baselines import LearnedBaseline, baseline_loss, leave_one_out_baseline
from rlattention.rl.bootstrap import (
    BOOTSTRAP_UPDATES,
    MultiHeadGaussianPolicy,
    bootstrap_masks,
    bootstrapped_q_loss,
    bootstrapped_reinforce_loss,
    importance_weights,
    sample_heads,
)
from rlattention.rl.policies import (
    GaussianPolicy,
    LearnedStdGaussianPolicy,
    MapCategoricalPolicy,
    gaussian_entropy,
    gaussian_log_prob,
    grid_cell_centres,
)
from rlattention.rl.ppo import ppo_clip_loss
from rlattention.rl.reinforce import policy_gradient_losses, reinforce_loss
from rlattention.rl.returns import discounted_returns, terminal_returns
from rlattention.rl.rewards import (
    classification_reward,
    delta_inverse_rank,
    rank_percentile,
    rank_threshold_reward,
    topn_label_reward,
)
from rlattention.rl.schedules import THRESHOLD_SHAPES, LinearSchedule, RankThresholdSchedule, SigmoidThreshold

__all__ = [
    "BOOTSTRAP_UPDATES",
    "THRESHOLD_SHAPES",
    "MultiHeadGaussianPolicy",
    "RankThresholdSchedule",
    "SigmoidThreshold",
    "bootstrap_masks",
    "bootstrapped_q_loss",
    "bootstrapped_reinforce_loss",
    "delta_inverse_rank",
    "importance_weights",
    "rank_percentile",
    "ppo_clip_loss",
    "rank_threshold_reward",
    "sample_heads",
    "GaussianPolicy",
    "LearnedStdGaussianPolicy",
    "MapCategoricalPolicy",
    "grid_cell_centres",
    "gaussian_entropy",
    "LearnedBaseline",
    "LinearSchedule",
    "baseline_loss",
    "classification_reward",
    "discounted_returns",
    "gaussian_log_prob",
    "leave_one_out_baseline",
    "policy_gradient_losses",
    "reinforce_loss",
    "terminal_returns",
    "topn_label_reward",
]
