"""Targets of digit sequences, the layout the ``mnist_sequences`` and ``svhn_sequences`` datasets share: each row
the digits, then :data:`END_TOKEN`, then :data:`PAD_TOKEN` (:mod:`rlattention.metrics.sequence` scores them)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["END_TOKEN", "PAD_TOKEN", "encode_sequences"]

#: Target token after the last digit of a sequence (the 11th class).
END_TOKEN = 10
#: Target token after the end token; ignored by losses and :func:`rlattention.metrics.sequence.sequence_error`.
PAD_TOKEN = -1


def encode_sequences(sequences: Sequence[Sequence[int]], max_len: int) -> Tensor:
    """Digit lists -> target rows.

    sequences: N lists of digits (0..9), each of length 1..``max_len``.
    max_len: the longest allowed sequence.

    Returns int64 ``(N, max_len + 1)``: row ``i`` is ``sequences[i]``, then :data:`END_TOKEN`, then
    :data:`PAD_TOKEN` up to the end. Raises ``ValueError`` for an empty or too long sequence or a digit
    outside 0..9.
    """
    out = torch.full((len(sequences), max_len + 1), PAD_TOKEN, dtype=torch.int64)
    for i, digits in enumerate(sequences):
        if not 1 <= len(digits) <= max_len:
            raise ValueError(f"sequence {i} has {len(digits)} digits, expected 1..{max_len}: {list(digits)}")
        row = torch.as_tensor(list(digits), dtype=torch.int64)
        if bool(((row < 0) | (row > 9)).any()):
            raise ValueError(f"sequence {i} holds a digit outside 0..9: {list(digits)}")
        out[i, : len(digits)] = row
        out[i, len(digits)] = END_TOKEN
    return out
