"""The ``data:`` section of every experiment config."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DataConfig:
    """Which dataset to build and how. Fields a dataset does not use are ignored by it.

    name: a registered dataset (``rlattention data list``): ``digits`` (embedded, no download),
        ``mnist`` (real idx files), ``cluttered_mnist`` (real digits on a cluttered canvas).
    data_dir: folder holding the dataset files; ``null`` means ``--data-dir`` / ``$RLATTENTION_DATA``.
    val_size: images held out of the training split for model selection.
    seed: seed of the train/validation split and of every generator.
    num_train / num_test: generated datasets: how many images; real datasets: use only the first
        ``num_*`` images when > 0 (smoke runs), all when 0.
    canvas_size: side of the generated canvas in pixels (``digits``, ``cluttered_mnist``, ``mnist_sequences``).
    num_clutter / clutter_size: clutter fragments per canvas and their side (``cluttered_mnist``).
    max_digits: longest digit sequence (``mnist_sequences``, ``svhn_sequences``); targets have
        ``max_digits + 1`` positions (digits, end token 10, padding -1); longer SVHN numbers are dropped.
    svhn_extra: also train on the SVHN ``extra`` split (``svhn_cropped``: ``extra_32x32.mat``;
        ``svhn_sequences``: ``extra/digitStruct.mat``); validation stays drawn from ``train`` only.
    image_size: side of the square that photos are resized to (``voc2007``, ``coco``), and of the sketch renders
        and photos of ``qmul_chairv2`` / ``omniglot_sketch`` / ``sketchy``.
    test_fraction: share of the images held out as test when a dataset has no test split (``coco`` subset); of
        the characters for ``omniglot_sketch``; of the photos for ``sketchy``.
    digits_per_canvas / scale_range: how many distinct digits per canvas and their scale (``multilabel_digits``).
    layout_grid: ``multilabel_digits``: side g of the g x g grid of cells the digits are placed in, one digit per
        cell (g * g >= the largest number of digits); 0 (default): ceil(sqrt(largest number of digits)).
    clutter_scale: ``multilabel_digits``: clutter fragments are cut from digits resized to 28 x this (default 1.0,
        the digits as they are; 0.75 gives fragments the stroke width of 14-28 px digits).
    (``multilabel_digits`` uses ``num_clutter`` / ``clutter_size`` too; the cluttered task of the rarl study,
    ``configs/rarl_clutter.yaml``, sets all of these.)
    completion_steps: partial renders per sketch, S (``qmul_chairv2``, ``omniglot_sketch``; the DARP paper uses 17);
        step s shows the first ceil(s * points / S) points of the sketch. ``null`` (default): the dataset's own
        default, 17 for those two and 1 for ``sketchy``, which accepts only 1 (raster sketches have no stroke order).
    line_width: stroke thickness of the sketch renders, in output pixels (>= 1; 2 suits ``image_size: 64``).
    render_cache: folder of the on-disk cache of sketch renders (and resized ChairV2 / Sketchy images); ``null`` means
        ``$RLATTENTION_CACHE`` or ``~/.cache/rlattention``; ``""`` or ``"none"`` disables the cache.
    omniglot_subsets: which Omniglot small background sets ``omniglot_sketch`` uses: ``[1]``, ``[2]`` or ``[1, 2]``.
    test_split: the precomp split evaluated as test (``precomp``): ``test``, or ``testall`` for COCO 5K.
    max_caption_len: keep at most this many token ids per caption, ``<start>`` included (0: no limit).
    reid_size: ``[height, width]`` the re-id images are resized to (``market1501``, ``dukemtmc``, ``omniglot_reid``;
        default ``[256, 128]``, Market's usual size; the omniglot_reid configs use ``[64, 64]``).
    reid_val_ids: training identities held out (seeded) as the re-id validation query/gallery split (default 100);
        0 trains on all identities with an overlapping 10% monitoring split, not for model selection.
    reid_cameras: groups of drawers used as cameras by ``omniglot_reid`` (default 4; must divide 20 and be >= 2).
    (re-id datasets: ``num_train`` / ``num_test`` > 0 keep the first identities, they do not count images.)
    sketchy_split: how ``sketchy`` splits a folder: ``by_photo`` (default: a seeded ``test_fraction`` of the photos
        with all their sketches is test, ``val_size`` photos of the rest validation) or ``all_test`` (every sketch
        is test, train and validation are empty: evaluation only, e.g. of a model trained on ``qmul_chairv2``).
    sketchy_variant: the ``sketch/<variant>/`` folder ``sketchy`` reads when the tree has that level (e.g.
        ``tx_000000000000``); ``null``: the first in sorted order. An error if the tree has no variant level.
    sketchy_photo_variant: the same for ``photo/<variant>/`` (or ``image/<variant>/``); ``null``: the sketch
        variant's name if the photo folder has it, else its first variant in sorted order.
    skip_bad: ``sketchy``: skip bad input (sketches without a photo, photos without a sketch, non-image files,
        unreadable images) with a warning counting each kind, instead of stopping with an error that lists them.
    """

    name: str = "digits"
    data_dir: str | None = None
    val_size: int = 6000
    seed: int = 0
    num_train: int = 0
    num_test: int = 0
    canvas_size: int = 0
    num_clutter: int = 4
    clutter_size: int = 8
    max_digits: int = 5
    image_size: int = 224
    test_fraction: float = 0.25
    digits_per_canvas: list[int] = field(default_factory=lambda: [2, 4])
    scale_range: list[float] = field(default_factory=lambda: [1.0, 2.0])
    layout_grid: int = 0
    clutter_scale: float = 1.0
    svhn_extra: bool = False
    completion_steps: int | None = None  # null: the dataset's default (17; sketchy: 1)
    line_width: float = 2.0
    render_cache: str | None = None
    omniglot_subsets: list[int] = field(default_factory=lambda: [1])
    test_split: str = "test"
    max_caption_len: int = 0
    reid_size: list[int] = field(default_factory=lambda: [256, 128])
    reid_val_ids: int = 100
    reid_cameras: int = 4
    sketchy_split: str = "by_photo"  # by_photo | all_test
    sketchy_variant: str | None = None  # sketch/<variant>/; null: the first in sorted order
    sketchy_photo_variant: str | None = None  # photo/<variant>/; null: the sketch variant's name, else the first
    skip_bad: bool = False  # sketchy: skip bad files with a warning instead of an error
    # coco without val2017: k-fold cross-validation; cv_folds > 0 makes part cv_fold (in 0..cv_folds-1) of one
    # seeded, fold-independent permutation the test split (test_fraction is then ignored); 0 = off
    cv_folds: int = 0
    cv_fold: int = 0
