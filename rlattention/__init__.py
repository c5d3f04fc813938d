"""rlattention: visual attention trained with reinforcement learning."""

__version__ = "0.1.0"

from rlattention.vision.backbones import create_backbone, list_backbones  # noqa: E402

__all__ = ["create_backbone", "list_backbones"]
