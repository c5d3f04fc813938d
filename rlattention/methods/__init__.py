"""One module per method; importing this package registers them all."""

from rlattention.methods import ram  # noqa: F401
