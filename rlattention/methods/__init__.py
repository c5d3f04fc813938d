"""One module per method; importing this package registers them all."""

from rlattention.methods import cnn, ram, rarl, unified  # noqa: F401
