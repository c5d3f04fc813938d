"""One module per method; importing this package registers them all."""

from rlattention.methods import cnn, darp, dcpg, ram, rarl, scal, unified  # noqa: F401
