"""Progress bars of the steps a user waits for outside the training loop: rendering sketch partials, decoding
images into the render cache, frozen-feature extraction, digit-scene generation, evaluation over a split.

A bar (:func:`progress_bar`) is shown only

* on rank 0 (the rank that builds the caches first; the others read them), from Lightning's
  ``rank_zero_only.rank`` once a Fabric is launched, else from ``RANK`` / ``LOCAL_RANK`` / ``SLURM_PROCID``;
* on a terminal: tqdm's ``disable=None`` hides it when stderr is not a TTY (a log file, a captured stream);
* while :func:`progress_bars` has not turned them off: ``fit`` runs data building and the model's preparation
  (``on_fit_start``: the feature caches) under ``progress_bars(trainer.progress)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from tqdm.auto import tqdm

_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("rlattention_progress_bars", default=True)


@contextlib.contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """Within the block, :func:`progress_bar` shows nothing unless ``enabled`` (``trainer.progress``)."""
    token = _ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def process_rank() -> int:
    """This process's global rank: Lightning's (set when a Fabric launches), else the launcher's environment, else 0."""
    rank_zero = sys.modules.get("lightning.fabric.utilities.rank_zero")
    if rank_zero is not None:
        return int(getattr(rank_zero.rank_zero_only, "rank", 0) or 0)
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    desc: str,
    total: int | None = None,
    unit: str = "it",
    enabled: bool = True,
) -> tqdm:
    """A tqdm bar (``leave=False``) shown when ``enabled``, on rank 0, on a terminal and not inside
    ``progress_bars(False)``; otherwise a silent one (``update`` and iteration still work)."""
    show = enabled and _ENABLED.get() and process_rank() == 0
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        leave=False,
        dynamic_ncols=True,
        mininterval=0.5,
        disable=None if show else True,  # None: tqdm disables the bar when its stream is not a TTY
    )
