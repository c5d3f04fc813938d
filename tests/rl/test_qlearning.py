"""Q-learning parts: the target comes from the frozen network until it is synchronised."""

from __future__ import annotations

import torch
from torch import nn

from rlattention.rl.qlearning import TargetNetwork, epsilon_greedy, q_loss, q_targets, softmax_exploration


def test_target_is_frozen_until_sync():
    torch.manual_seed(0)
    online = nn.Linear(4, 3)
    target = TargetNetwork(online)
    s_next = torch.randn(5, 4)
    y0 = q_targets(torch.zeros(5), target(s_next), gamma=0.9, terminal=False)
    with torch.no_grad():
        online.weight.add_(1.0)  # the online network changes...
    y1 = q_targets(torch.zeros(5), target(s_next), gamma=0.9, terminal=False)
    assert torch.equal(y0, y1)  # ...the target does not
    target.sync(online)
    y2 = q_targets(torch.zeros(5), target(s_next), gamma=0.9, terminal=False)
    assert not torch.equal(y1, y2)
    assert torch.allclose(y2, 0.9 * online(s_next).max(-1).values)


def test_target_network_has_no_trainable_parameters_and_stays_in_eval():
    online = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    target = TargetNetwork(online)
    assert all(not p.requires_grad for p in target.parameters())
    target.train()
    assert not target.training and not target.net[1].training
    assert not target(torch.randn(2, 3)).requires_grad


def test_terminal_target_is_the_reward_and_loss_uses_taken_action():
    r = torch.tensor([1.0, 0.0])
    assert torch.equal(q_targets(r, torch.ones(2, 4) * 5, 0.9, terminal=True), r)
    q = torch.tensor([[0.0, 2.0], [1.0, 0.0]], requires_grad=True)
    loss = q_loss(q, torch.tensor([1, 1]), torch.tensor([1.0, 1.0]))
    assert loss.item() == (1.0 + 1.0) / 2
    loss.backward()
    assert q.grad[:, 0].abs().sum() == 0  # only Q(s, a_taken) is regressed


def test_exploration():
    q = torch.tensor([[0.0, 1.0, 0.0]]).expand(2000, 3)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(epsilon_greedy(q, 0.0), torch.ones(2000, dtype=torch.long))
    a = epsilon_greedy(q, 0.3, g)
    frac_greedy = (a == 1).float().mean().item()
    assert abs(frac_greedy - (0.7 + 0.3 / 3)) < 0.04
    s = softmax_exploration(q * 10, temperature=1.0, generator=g)
    assert (s == 1).float().mean() > 0.99
