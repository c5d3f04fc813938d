"""Readers of data as it is distributed, each checking what it reads (a bad file fails with one line naming it).

What belongs here: a module per distributed format or dataset family (MNIST idx, CIFAR-10 pickles, SVHN .mat,
Pascal VOC XML, COCO json, the VSE++/SCAN/VSRN precomp layout, QMUL / Omniglot strokes and the sketch retrieval
sets built on them, Sketchy folders, Market-1501 / DukeMTMC and Omniglot re-id), and a module per layout of a
user's own folders (``image_folder``, ``multilabel_csv``, ``image_captions``, ``reid_folder``; docs/own-data.md).
A reader turns files into tensors; it generates nothing and imports no module of
:mod:`rlattention.data.synthetic`. Parts several readers share and the generators use too live one level up in
:mod:`rlattention.data`.
"""

from rlattention.data.readers import (  # noqa: F401  (registers the datasets of each module)
    cifar,
    coco,
    image_captions,
    image_folder,
    mnist,
    multilabel_csv,
    precomp,
    reid,
    reid_folder,
    sketch_retrieval,
    sketchy,
    svhn,
    voc,
)
