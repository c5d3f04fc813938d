"""rlattention: visual attention trained with reinforcement learning.

The Python API (docs/api.md): ``load_model``, ``predict``, ``save_pretrained``, ``create_model`` and the
``Prediction`` they return live in :mod:`rlattention.api`, imported on first use so that ``import rlattention``
stays light (Lightning is imported only when a model is trained or loaded).

Importing the package registers the built-in datasets and methods (``rlattention.data``, ``rlattention.methods``:
each module registers itself when imported; the registries import none of them), as ``import timm`` registers its
models, so every name resolves whichever module of the library is imported first.
"""

__version__ = "0.1.0"

from rlattention import data, methods  # noqa: E402, F401  (registers the built-in datasets and methods)
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
