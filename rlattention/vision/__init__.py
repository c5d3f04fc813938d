"""Method-independent sensors (glimpses, crops, pyramids) and backbones."""

from rlattention.vision import efficientnet, resnet  # noqa: F401  (register their backbones)
from rlattention.vision.backbones import backbone_info, create_backbone, list_backbones
from rlattention.vision.glimpse import GlimpseSensor, locations_to_pixels

__all__ = ["GlimpseSensor", "backbone_info", "create_backbone", "list_backbones", "locations_to_pixels"]
