"""The two networks of the recurrent attention model (Mnih et al. 2014) that read glimpses, shared by every method
with a glimpse sensor and a recurrent core (ram, unified, darp): the glimpse network f_g, which merges what a
glimpse sees with where it was taken, and the core network f_h, which integrates the glimpses over time."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class GlimpseNetwork(nn.Module):
    """G_t = ReLU(W_g h_g + W_l h_l), h_g = ReLU(Linear(patches)), h_l = ReLU(Linear(l))."""

    def __init__(self, in_features: int, glimpse_hidden: int, loc_hidden: int, out_features: int) -> None:
        super().__init__()
        self.fc_patch = nn.Linear(in_features, glimpse_hidden)
        self.fc_loc = nn.Linear(2, loc_hidden)
        self.fc_what = nn.Linear(glimpse_hidden, out_features)
        self.fc_where = nn.Linear(loc_hidden, out_features, bias=False)

    def forward(self, patches: Tensor, loc: Tensor) -> Tensor:
        """patches ``(B, k, C, g, g)``, loc ``(B, 2)`` -> ``(B, out_features)``."""
        h_g = F.relu(self.fc_patch(patches.flatten(1)))
        h_l = F.relu(self.fc_loc(loc))
        return F.relu(self.fc_what(h_g) + self.fc_where(h_l))


class CoreNetwork(nn.Module):
    """H_t = ReLU(W_h H_{t-1} + W_g G_t) (``rnn``) or an LSTM cell (``lstm``). State: tensor or (h, c)."""

    def __init__(self, kind: str, in_features: int, hidden: int) -> None:
        super().__init__()
        if kind not in ("rnn", "lstm"):
            raise ValueError(f"model.core must be 'rnn' or 'lstm', got {kind!r}")
        self.kind, self.hidden = kind, hidden
        if kind == "rnn":
            self.fc_in = nn.Linear(in_features, hidden)
            self.fc_h = nn.Linear(hidden, hidden, bias=False)
        else:
            self.cell = nn.LSTMCell(in_features, hidden)

    def initial_state(self, batch: int, like: Tensor):
        h = like.new_zeros(batch, self.hidden)
        return h if self.kind == "rnn" else (h, h.clone())

    def forward(self, g: Tensor, state) -> tuple[Tensor, object]:
        if self.kind == "rnn":
            h = F.relu(self.fc_in(g) + self.fc_h(state))
            return h, h
        h, c = self.cell(g, state)
        return h, (h, c)
