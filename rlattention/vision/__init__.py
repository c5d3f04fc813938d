"""Method-independent sensors (glimpses, crops, pyramids) and backbones."""

from rlattention.vision.glimpse import GlimpseSensor, locations_to_pixels

__all__ = ["GlimpseSensor", "locations_to_pixels"]
