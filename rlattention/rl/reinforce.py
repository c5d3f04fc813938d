"""The score-function (REINFORCE) policy-gradient loss."""

from __future__ import annotations

from torch import Tensor


def policy_gradient_losses(
    log_pi: Tensor,
    returns: Tensor,
    baseline: Tensor,
    weights: Tensor | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The REINFORCE term with a learned baseline and the baseline's own regression loss, as used by every
    method: ``(reinforce_loss, baseline_loss)``; both zero when there are no actions (``T = 0``)."""
    from rlattention.rl.baselines import baseline_loss

    if log_pi.numel() == 0:
        zero = log_pi.new_zeros(())
        return zero, zero
    return reinforce_loss(log_pi, returns, baseline, weights, mask), baseline_loss(baseline, returns, mask)


def reinforce_loss(
    log_pi: Tensor,
    returns: Tensor,
    baseline: Tensor | None = None,
    weights: Tensor | None = None,
    mask: Tensor | None = None,
) -> Tensor:
    """L = -(1/B) sum_b sum_t w_bt (G_bt - b_bt) log pi(a_bt | s_bt).

    Its gradient is the REINFORCE estimate of -grad J (Williams 1992; RAM eq. 2 with a baseline).
    log_pi, returns, baseline, weights, mask: ``(B, T)`` (or ``(B,)``). The advantage ``G - b`` and the
    weights are detached, so the policy term sends no gradient into the baseline or the reward.
    mask: 1 for steps whose action was actually taken, 0 for padding.
    """
    advantage = returns.detach()
    if baseline is not None:
        advantage = advantage - baseline.detach()
    if weights is not None:
        advantage = advantage * weights.detach()
    if mask is not None:
        advantage = advantage * mask.to(advantage.dtype)
    per_sample = -(log_pi * advantage)
    if per_sample.ndim > 1:
        per_sample = per_sample.sum(dim=tuple(range(1, per_sample.ndim)))
    return per_sample.mean()


def smoothing_gradient(rewards: Tensor, baseline: Tensor, draws: Tensor, sigma: float) -> Tensor:
    """The Gaussian-smoothing (evolution-strategies) estimate of ``d E[R] / d mu`` from ``E`` perturbed actions
    ``mu + sigma * n_e``: ``mean_e (R_e - b) n_e / sigma`` (detached), the score-function (REINFORCE) gradient of
    a Gaussian policy with respect to its mean (``d log N(a; mu, sigma^2) / d mu = n / sigma``).

    ``rewards`` ``(E, B)``; ``baseline`` ``(B,)``, any value that does not depend on the draws (e.g. the reward of
    ``mu`` itself: it leaves the mean unchanged and lowers the variance); ``draws`` ``(E, B, ...)`` standard
    normal. Returns ``(B, ...)``."""
    adv = (rewards - baseline[None]).detach()
    return (adv.view(*adv.shape, *([1] * (draws.ndim - 2))) * draws.detach()).mean(0) / sigma
