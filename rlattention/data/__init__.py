"""Datasets: the shared parts here, the datasets in two subpackages.

* :mod:`rlattention.data.readers`: readers of data as it is distributed (MNIST, CIFAR-10, SVHN, VOC, COCO, the
  precomp features, sketch sets, re-id sets) and of a user's own folders.
* :mod:`rlattention.data.synthetic`: generators of synthetic stand-ins with a fixed seed (the embedded digits,
  cluttered MNIST, multi-label digit canvases, digit sequences, captioned digit scenes).
* Here, what both use: the containers (:mod:`~rlattention.data.base`), the registry, the ``data:`` config, input
  limits, splits and seeds, the cache folder, safe pickles, image decoding (:mod:`~rlattention.data.photos`),
  captions as word ids (:mod:`~rlattention.data.text`) and the layouts two datasets share
  (:mod:`~rlattention.data.image_text`, :mod:`~rlattention.data.sequence_targets`).

The one place that imports the built-in datasets: each module registers its datasets with ``@register_dataset``
when it is imported (:mod:`rlattention.data.registry`, which imports none of them), and Python runs this file
before any module of ``rlattention.data``, so the registry is complete whenever it is used.
"""

from rlattention.data import readers, synthetic  # noqa: F401  (registers the built-in datasets)
