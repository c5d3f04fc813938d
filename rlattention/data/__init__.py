"""Dataset readers and generators.

The one place that imports the built-in ones: each module registers its datasets with ``@register_dataset`` when it
is imported (:mod:`rlattention.data.registry`, which imports none of them), and Python runs this file before any
module of ``rlattention.data``, so the registry is complete whenever it is used.
"""

from rlattention.data import (  # noqa: F401  (registers the built-in datasets)
    cifar,
    coco,
    digits,
    folders,
    image_text,
    mnist,
    multilabel_digits,
    reid,
    sequences,
    sketch_retrieval,
    sketchy,
    svhn,
    voc,
)
