"""The encoders of DCPG (Yan, Yu and Xie, CVPR 2021) that are not its attention: the GCN reasoning over the
region graph (eq. 1, after VSRN) and the causal convolutional caption decoder of the text-decoding loss (eq. 13),
which trains on the packed caption positions only (:meth:`CaptionDecoder.loss_sum`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class GCNReasoning(nn.Module):
    """V* = V + W_r (softmax_j(phi(V_i)^T psi(V_j)) V W_g), stacked ``layers`` times (VSRN's region reasoning)."""

    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.phi = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.psi = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.g = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(layers))
        self.r = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, v: Tensor) -> Tensor:
        for phi, psi, g, r in zip(self.phi, self.psi, self.g, self.r, strict=True):
            affinity = torch.einsum("bid,bjd->bij", phi(v), psi(v)) / v.shape[-1] ** 0.5  # eq. 1
            v = v + r(F.relu(affinity.softmax(-1) @ g(v)))
        return v


class CaptionDecoder(nn.Module):
    """A causal convolutional caption decoder (the text-decoding loss), conditioned on an embedding: word
    embedding of the previous tokens + a projection of the embedding -> gated causal conv layers -> logits."""

    def __init__(self, vocab_size: int, embed_dim: int, width: int, layers: int, kernel: int = 3) -> None:
        super().__init__()
        self.words = nn.Embedding(vocab_size, width, padding_idx=0)
        self.cond = nn.Linear(embed_dim, width)
        self.convs = nn.ModuleList(nn.Conv1d(width, 2 * width, kernel) for _ in range(layers))
        self.kernel = kernel
        self.out = nn.Linear(width, vocab_size)

    def loss(self, embedding: Tensor, tokens: Tensor) -> Tensor:
        """Teacher-forced cross-entropy of ``tokens`` ``(B, L)`` (0 = padding) given ``embedding`` ``(B, E)``:
        the mean over the non-padding targets ``tokens[:, 1:]``."""
        return self.loss_sum((embedding,), tokens)

    def loss_sum(self, embeddings: Sequence[Tensor], tokens: Tensor) -> Tensor:
        """``sum_k loss(embeddings[k], tokens)`` in one pass (the image and the text branch share the captions).

        Equal up to float rounding to the dense computation (``nn.Conv1d`` over all ``L - 1`` positions of every
        branch, cross-entropy with ``ignore_index=0``; tests/methods/test_dcpg_speed.py keeps it as the
        reference), with less work:

        * packed positions only: the position t of a caption is kept when some target at or after t is not
          padding (for captions padded at the end, the positions of its real targets). The convolutions are
          causal, so a kept position reads kept positions only; the others carry no loss;
        * a convolution is one matrix product of the ``kernel`` shifted copies of the packed rows;
        * the first convolution is linear in its input words + cond(embedding): its words part is computed once
          for all branches, its cond part once per caption (the same at every position once all taps lie inside
          the caption).
        """
        inp, target = tokens[:, :-1], tokens[:, 1:]
        valid = target != 0  # (B, L-1)
        positions = torch.arange(valid.shape[1], device=tokens.device)
        lengths = (valid * (positions + 1)).amax(1)  # 1 + the last real target of each caption (0: none)
        b_idx, t_idx = (positions < lengths[:, None]).nonzero(as_tuple=True)  # packed rows, caption-major (N,)
        K, N, k = len(embeddings), len(b_idx), self.kernel
        keep = [(t_idx >= shift).unsqueeze(-1) for shift in range(k)]  # the row `shift` back is in the caption
        ids = inp[b_idx, t_idx]
        words = self.words(ids)  # (N, W)
        cond = self.cond(torch.stack(tuple(embeddings)))  # (K, B, W)
        first = self.convs[0]
        if self.words.num_embeddings < N:  # tap j of every word of the vocabulary, then a sum of k rows per position
            y_words = self._first_taps_by_word(ids, keep) + first.bias
        else:
            y_words = F.linear(_causal_taps(words, keep), _tap_major(first.weight), first.bias)  # (N, 2W)
        q = torch.einsum("kbc,ocj->kbjo", cond, first.weight)  # (K, B, k, 2W): tap j applied to cond
        q = q.flip(2).cumsum(2)  # [:, :, m]: the sum of the taps that read inside the caption at position m
        y_cond = q.reshape(K, -1, q.shape[-1]).index_select(1, b_idx * k + t_idx.clamp(max=k - 1))  # (K, N, 2W)
        x = words + cond[:, b_idx] + F.glu(y_words + y_cond, dim=-1)  # (K, N, W)
        x = x.reshape(K * N, -1)  # branch-major
        keep = [m.repeat(K, 1) for m in keep]
        for conv in self.convs[1:]:
            x = x + F.glu(F.linear(_causal_taps(x, keep), _tap_major(conv.weight), conv.bias), dim=-1)
        logits = self.out(x)  # (K N, V)
        nll = F.cross_entropy(logits, target[b_idx, t_idx].repeat(K), ignore_index=0, reduction="sum")
        return nll / valid.sum()

    def _first_taps_by_word(self, ids: Tensor, keep: list[Tensor]) -> Tensor:
        """The words part of the first convolution without its bias, ``(N, 2W)``, from the packed ids ``(N,)``:
        ``sum_j W_j words[id at t - (k-1-j)]`` over the taps inside the caption, as ``k`` rows of the table
        ``W_j words[v]`` (``(k V, 2W)``, one product with the vocabulary instead of one with every position)."""
        V, k, weight = self.words.num_embeddings, self.kernel, self.words.weight
        pad = self.words.padding_idx
        if pad is not None:  # the padding word gets no gradient, as in nn.Embedding
            weight = torch.cat((weight[:pad], weight[pad : pad + 1].detach(), weight[pad + 1 :]))
        first = self.convs[0].weight  # (2W, W, k)
        table = torch.einsum("vc,ocj->jvo", weight, first).reshape(k * V, -1)  # row j V + v: W_j words[v]
        table = torch.cat((table, table.new_zeros(1, table.shape[1])))  # row k V: nothing (before the start)
        index = []
        for j in range(k):
            shift = k - 1 - j
            back = ids if shift == 0 else F.pad(ids, (shift, 0))[: len(ids)]  # the id `shift` positions back
            index.append(torch.where(keep[shift].squeeze(-1), j * V + back, k * V))
        return F.embedding_bag(torch.stack(index, 1), table, mode="sum")


def _tap_major(weight: Tensor) -> Tensor:
    """A ``Conv1d`` weight ``(O, C, k)`` as the matrix ``(O, k C)`` of :func:`_causal_taps`' columns."""
    return weight.permute(0, 2, 1).reshape(weight.shape[0], -1)


def _causal_taps(x: Tensor, keep: list[Tensor]) -> Tensor:
    """Packed rows ``(M, C)`` (each caption's positions consecutive) -> ``(M, k C)``: for tap j = 0..k-1 the row
    k-1-j places back, 0 where that lies before the caption's start (``keep[shift]`` ``(M, 1)`` bool: the
    position is >= shift), i.e. the input windows of a causal convolution with left padding k-1."""
    k = len(keep)
    return torch.cat([x if s == 0 else F.pad(x, (0, 0, s, 0))[: len(x)] * keep[s] for s in range(k - 1, -1, -1)], -1)
