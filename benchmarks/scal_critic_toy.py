"""scal's critic on the toy of the tests (issue 21): how well critics trained on explored attention predict the reward
of fresh perturbations, and where their gradient with respect to the maps points. Prints the two tables of
docs/scal.md ("The critic on the toy").

    python benchmarks/scal_critic_toy.py [--part online|fitted|both]

The toy (``tests/methods/test_scal_explore.py``: 16 x 16 images, 8 identities, the top-left quadrant carries the
image's identity, the other quadrants other identities'), a width-8 ResNet, batch 32, Adam 2e-3, one thread, seed 0.

* online: the critic trained beside the agents (agents by -V) for 300 steps, 4 explored passes of noise std 1.5; the
  critic's held-out R^2 (its prediction of each step's explored rewards before it learns from them, against their
  mean) averaged over the first and the last quarter of training, and the mean attention on the top-left quadrant
  against the rest on held-out images;
* fitted: 60 steps with the agents on the explored policy gradient (noise std 1), then the critic alone for 150 steps
  on explored passes; its R^2 on 16 fresh explored passes of held-out images, and the sign of top-left minus the
  rest of dV/d(spatial map) per module.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "methods"))
from test_scal_explore import K, make, top_left_minus_rest, toy  # noqa: E402

from rlattention.methods.scal import SCAL, attention_rewards  # noqa: E402


def train(m: SCAL, steps: int, seed0: int, params=None, term: str | None = None) -> list[float]:
    opt = torch.optim.Adam(params if params is not None else m.parameters(), lr=2e-3 if term is None else 3e-3)
    m.train()
    r2 = []
    for step in range(steps):
        x, y = toy(K, seed=seed0 + step)
        out = m(x, y)
        opt.zero_grad()
        (out.loss if term is None else out.terms[term]).backward()
        opt.step()
        if "critic_heldout_r2" in out.stats:
            r2.append(float(out.stats["critic_heldout_r2"]))
    return r2


def map_gradient_signs(m: SCAL, x: torch.Tensor, y: torch.Tensor) -> str:
    with torch.no_grad():
        _, records = m.feature_map(x)
    recs, leaves = [], []
    for xi, a, s in records:
        leaf = s.detach().requires_grad_(True)
        recs.append((xi.detach(), leaf * (a / s).detach(), leaf))
        leaves.append(leaf)
    assert m.critic is not None
    v = m.critic(m.critic.inputs(recs), y if m.cfg.critic_label else None)
    return " ".join(
        "+" if float(top_left_minus_rest(g).mean()) > 0 else "-" for g in torch.autograd.grad(v.sum(), leaves)
    )


def heldout_r2(m: SCAL, passes: int = 4) -> float:
    x, y = toy(K, seed=77)
    m.train()
    torch.manual_seed(3)
    labels = y if m.cfg.critic_label else None
    with torch.no_grad():
        _, fb, recs0 = m.embed(x)
        plain = m.classifier(m.embed(x, attend=False)[1])
        r0 = attention_rewards(m.classifier(fb), plain, y, m.cfg.reward)["reward"]
        v0 = m.critic_value(recs0, for_agent=False, labels=labels)
        preds, targets = [], []
        for _ in range(passes):
            for recs, r, _ in m.explore(x, plain, y):
                v = m.critic_value(recs, for_agent=False, labels=labels)
                advantage = m.cfg.critic_target == "advantage"
                preds.append(v - v0 if advantage else v)
                targets.append(r - r0 if advantage else r)
    p, t = torch.cat(preds), torch.cat(targets)
    return float(1 - (p - t).pow(2).mean() / (t - t.mean()).pow(2).mean())


def attention_top_left(m: SCAL) -> tuple[float, float]:
    x, _ = toy(K, seed=99)
    m.eval()
    att = m.attention_maps(x)
    h = att.shape[-1]
    tl = att[..., : h // 2, : h // 2].mean()
    rest = (att.sum((-1, -2)) - att[..., : h // 2, : h // 2].sum((-1, -2))).mean() / (h * h * 3 / 4)
    return float(tl), float(rest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("online", "fitted", "both"), default="both")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    grid = list(itertools.product(["absolute", "advantage"], [False, True], ["log_prob", "log_gain"]))
    if args.part in ("online", "both"):
        print(
            "| critic target | reads the identity | reward | R^2 first quarter | R^2 last quarter | top-left / rest |"
        )
        print("|---|---|---|---|---|---|")
        for target, label, reward in grid:
            m = make(explore=4, explore_std=1.5, reward=reward, critic_target=target, critic_label=label)
            r2 = train(m, 300, 1000)
            q = len(r2) // 4
            tl, rest = attention_top_left(m)
            print(f"| {target} | {'yes' if label else 'no'} | {reward} | {sum(r2[:q]) / q:.2f} | "
                  f"{sum(r2[-q:]) / q:.2f} | {tl:.3f} / {rest:.3f} |", flush=True)  # fmt: skip
    if args.part in ("fitted", "both"):
        print("| critic target | reads the identity | reward | R^2 | gradient toward the top-left, modules 0-4 |")
        print("|---|---|---|---|---|")
        for target, label, reward in grid:
            m = make(explore=4, explore_std=1.0, reward=reward, critic_label=label, critic_target=target,
                     agent_gradient="explored")  # fmt: skip
            train(m, 60, 1000)
            assert m.critic is not None
            train(m, 150, 5000, params=m.critic.parameters(), term="critic_mse")
            x, y = toy(K, seed=99)
            m.eval()
            print(f"| {target} | {'yes' if label else 'no'} | {reward} | {heldout_r2(m):.2f} | "
                  f"{map_gradient_signs(m, x, y)} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
