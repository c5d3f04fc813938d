"""Generators of synthetic data: faithful stand-ins for datasets too large for these machines, made with a fixed
seed (the same config gives the same images, targets and captions, byte for byte).

What belongs here: a module per generated dataset (the embedded ``digits``; ``cluttered_mnist``,
``multilabel_digits``, ``mnist_sequences`` and ``digit_scenes``, which compose real MNIST digits read by
:mod:`rlattention.data.readers.mnist`) and the parts of one generator (the scene drawing, caption grammar and
region features of the digit scenes). A generator may use a reader for its source digits; readers never import
a generator.
"""

from rlattention.data.synthetic import (  # noqa: F401  (registers the datasets of each module)
    cluttered,
    digit_scenes,
    digits,
    multilabel_digits,
    sequences,
)
