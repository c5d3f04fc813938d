"""One module per method. The one place that imports the built-in ones: each registers itself with
``@register_method`` (:mod:`rlattention.engine.registry`, which imports no method) when imported here; ``import
rlattention`` imports this package."""

from rlattention.methods import cnn, darp, dcpg, ram, rarl, scal, unified  # noqa: F401
