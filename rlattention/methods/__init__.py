"""One module per method; importing this package registers them all."""

from rlattention.methods import cnn, ram, unified  # noqa: F401
