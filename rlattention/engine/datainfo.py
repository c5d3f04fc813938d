"""What a model knows about its data (:class:`DataInfo`), and its plain-data record, which travels with the weights
in checkpoints and saved folders."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DataInfo:
    """What a model needs to know about its data to be built."""

    image_shape: tuple[int, int, int]  # (C, H, W)
    num_classes: int
    meta: dict = field(default_factory=dict)  # dataset-specific facts, e.g. {"vocab_size": V} for image-text

    def record(self, strict: bool = True) -> dict[str, Any]:
        """Plain data ``{"image_shape", "num_classes", "meta"}`` for a checkpoint or ``config.yaml`` (the words of
        an image-text vocabulary, the class names of a folder dataset travel with the model). ``strict``: a meta
        value that is not plain data (numbers, strings, booleans, None, lists, string-keyed mappings) is a
        ValueError naming it; otherwise such entries are left out with a warning naming them."""
        meta = {}
        for key, value in self.meta.items():
            try:
                meta[str(key)] = plain_data(value, f"data_info.meta.{key}")
            except ValueError as e:
                if strict:
                    raise
                warnings.warn(f"{e}: left out of the checkpoint's data_info", stacklevel=2)
        return {"image_shape": [int(s) for s in self.image_shape], "num_classes": int(self.num_classes), "meta": meta}

    @classmethod
    def from_record(cls, record: Any, where: str) -> DataInfo:
        """The DataInfo of a :meth:`record` (``meta`` may be absent: checkpoints written before it was kept); a
        one-line ValueError naming ``where`` and the bad value otherwise."""
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a mapping with image_shape and num_classes, got {record!r:.200}")
        shape, num_classes, meta = record.get("image_shape"), record.get("num_classes"), record.get("meta") or {}
        if (
            not isinstance(shape, list | tuple)
            or len(shape) != 3
            or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape)
        ):
            raise ValueError(f"{where}: image_shape must be three positive integers (C, H, W), got {shape!r:.200}")
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 0:
            raise ValueError(f"{where}: num_classes must be an integer >= 0, got {num_classes!r:.200}")
        if not isinstance(meta, dict):
            raise ValueError(f"{where}: meta must be a mapping, got {type(meta).__name__}")
        return cls(tuple(int(s) for s in shape), int(num_classes), dict(meta))


def plain_data(value: Any, key: str) -> Any:
    """``value`` as plain data (numbers, strings, booleans, None, lists, string-keyed mappings; NumPy scalars
    become numbers), or a ValueError naming ``key``."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list | tuple):
        return [plain_data(v, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: plain_data(v, f"{key}.{k}") for k, v in value.items()}
    raise ValueError(f"{key}: a {type(value).__name__} cannot be saved with the model (plain data only)")
