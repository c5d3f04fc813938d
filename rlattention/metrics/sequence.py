"""Whole-sequence recognition metrics for digit sequences (SVHN house numbers, multi-digit MNIST).

Sequences are encoded as rows of tokens ``(N, L)``: the digits ``0..9`` left to right, then the end token
(``10`` by default) right after the last digit, then padding (``-1``). This is the encoding of the
``mnist_sequences`` and ``svhn_sequences`` datasets (``rlattention.data.sequence_targets``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["END_TOKEN", "PAD_TOKEN", "decode_sequence", "sequence_error"]

#: Token that ends a sequence (the 11th class after the digits 0..9).
END_TOKEN = 10
#: Token that fills a target row after the end token; ignored by the metrics.
PAD_TOKEN = -1

TokenRows = Tensor | np.ndarray | Sequence[Sequence[int]]


def _as_2d(tokens: TokenRows, what: str) -> Tensor:
    """``tokens`` as an int64 CPU tensor of shape ``(N, L)``; a 1-D input is one row."""
    t = tokens.detach() if isinstance(tokens, Tensor) else torch.as_tensor(np.asarray(tokens))
    if t.ndim == 1:
        t = t.unsqueeze(0)
    if t.ndim != 2:
        raise ValueError(f"{what} must be (N, L) token rows, got shape {tuple(t.shape)}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{what} must hold integer tokens, got dtype {t.dtype}")
    return t.to(device="cpu", dtype=torch.int64)


def sequence_error(pred: TokenRows, target: TokenRows, pad_token: int = PAD_TOKEN) -> float:
    """Whole-sequence error rate: the fraction of rows, in ``[0, 1]``, that are not entirely right.

    pred: ``(N, L_pred)`` predicted tokens (e.g. the argmax of each step).
    target: ``(N, L)`` target tokens: digits, then the end token, then ``pad_token`` padding.
    pad_token: the padding value of ``target``; those positions are ignored.

    A row is right only if every non-padding target position (every digit *and* the end token) equals the
    prediction at that position; whatever is predicted under padding does not count. If ``L_pred`` differs
    from ``L``, the shorter side is padded with ``pad_token`` (so a prediction that stops early is wrong,
    and extra predicted steps beyond the target are ignored). Returns ``nan`` for ``N == 0``.
    Multiply by 100 for the percentage that papers report.
    """
    p, t = _as_2d(pred, "pred"), _as_2d(target, "target")
    if len(p) != len(t):
        raise ValueError(f"pred and target differ in rows: {len(p)} vs {len(t)}")
    if len(t) == 0:
        return float("nan")
    width = max(p.shape[1], t.shape[1])
    p = torch.nn.functional.pad(p, (0, width - p.shape[1]), value=pad_token)
    t = torch.nn.functional.pad(t, (0, width - t.shape[1]), value=pad_token)
    wrong = ((p != t) & (t != pad_token)).any(dim=1)
    return float(wrong.double().mean())


def decode_sequence(tokens: TokenRows, end_token: int = END_TOKEN) -> list[list[int]]:
    """Token rows -> digit lists, each cut at its first end token.

    tokens: ``(N, L)`` integer tokens (a 1-D row is treated as ``N = 1``).
    end_token: the token that ends a sequence.

    Each row keeps the tokens before its first ``end_token``; a negative token (padding) also ends the row,
    so ``[[3, 1, 10, -1], [7, 10, 4, 4], [2, 5, 8, 1]]`` gives ``[[3, 1], [7], [2, 5, 8, 1]]``.
    """
    t = _as_2d(tokens, "tokens")
    stop = (t == end_token) | (t < 0)
    has_stop = stop.any(dim=1)
    lengths = torch.where(has_stop, stop.int().argmax(dim=1), torch.full_like(has_stop, t.shape[1], dtype=torch.int64))
    return [row[:n] for row, n in zip(t.tolist(), lengths.tolist(), strict=True)]
