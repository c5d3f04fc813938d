"""rlattention: visual attention trained with reinforcement learning.

The Python API (docs/api.md): ``load_model``, ``predict``, ``save_pretrained``, ``create_model`` and the
``Prediction`` they return live in :mod:`rlattention.api`, imported on first use so that ``import rlattention``
stays light (the engine and Lightning are imported only when a model is loaded or built).
"""

__version__ = "0.1.0"

from rlattention.vision.backbones import create_backbone, list_backbones  # noqa: E402

_API = ("Prediction", "create_model", "load_model", "predict", "save_pretrained")

__all__ = ["create_backbone", "list_backbones", *_API]


def __getattr__(name: str):
    if name in _API:
        from rlattention import api

        return getattr(api, name)
    raise AttributeError(f"module 'rlattention' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
