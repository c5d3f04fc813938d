"""``rlattention data list|info``: the registered datasets, and what one holds."""

from __future__ import annotations


def command(args) -> int:
    from rlattention.data.registry import available_datasets, build_dataset
    from rlattention.engine.config import load_config

    if args.action == "list":
        for name in available_datasets():
            print(name)
        return 0
    if not args.rest:
        raise SystemExit("rlattention data info NAME: give a dataset name (see `rlattention data list`)")
    name, overrides = args.rest[0], args.rest[1:]
    cfg = load_config(None, [f"data.name={name}", *overrides])
    describe = _describers().get(name)
    if describe is not None:  # scans and counts only: no image is decoded or rendered and no cache is written
        from rlattention.data.registry import resolve_data_dir

        for line in describe(cfg.data, resolve_data_dir(args.data_dir or cfg.data.data_dir)):
            print(line)
        return 0
    # the other datasets are built as fit builds them: a cache build says what it writes first, and one over
    # $RLATTENTION_CACHE_LIMIT stops before writing (rlattention.cache_limit)
    s = build_dataset(cfg.data.name, cfg.data, args.data_dir or cfg.data.data_dir)
    print(f"{name}: {s.num_classes} classes, image shape {s.image_shape}")
    for split in ("train", "val", "test"):
        ds = getattr(s, split)
        print(f"  {split}: {len(ds)} images")
    return 0


def _describers() -> dict:
    """``data info`` of the datasets whose build renders or decodes into the cache: counted from the files."""
    from rlattention.data.readers.sketch_info import describe_omniglot_sketch, describe_qmul_chairv2
    from rlattention.data.readers.sketchy import describe_sketchy

    return {
        "sketchy": describe_sketchy,
        "qmul_chairv2": describe_qmul_chairv2,
        "omniglot_sketch": describe_omniglot_sketch,
    }
