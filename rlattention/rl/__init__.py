"""Method-independent RL parts: policies, returns, baselines, policy-gradient losses, rewards, schedules."""

from rlattention.rl.baselines import LearnedBaseline, baseline_loss, leave_one_out_baseline
from rlattention.rl.policies import GaussianPolicy, gaussian_log_prob
from rlattention.rl.reinforce import policy_gradient_losses, reinforce_loss
from rlattention.rl.returns import discounted_returns, terminal_returns
from rlattention.rl.rewards import classification_reward, topn_label_reward
from rlattention.rl.schedules import LinearSchedule

__all__ = [
    "GaussianPolicy",
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
