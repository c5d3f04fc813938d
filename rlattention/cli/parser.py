"""The command line of ``rlattention``: one sub-parser per command."""

from __future__ import annotations

import argparse

EPILOG = """examples:
  rlattention fit --config configs/ram_digits.yaml
  rlattention fit --config configs/ram_mnist.yaml --data-dir ../shared/data/mnist model.num_glimpses=8
  rlattention fit --resume runs/ram_mnist                    # continue from runs/ram_mnist/checkpoints/last.ckpt
  rlattention eval runs/ram_mnist/checkpoints/best.ckpt --mc-samples 10   # also writes runs/ram_mnist/eval.json
  rlattention eval runs/ram_mnist/checkpoints/best.ckpt --devices 2 --json   # 2 processes, same metrics
  rlattention eval runs/darp_triplet_chairv2/checkpoints/best.ckpt --data sketchy --data-dir ../sketchy \
      data.sketchy_split=all_test                           # another dataset: the whole folder as test
  rlattention data info sketchy --data-dir ../sketchy        # counts sketches, photos, classes (no decoding)
  rlattention data info qmul_chairv2 --data-dir ../shared/data   # counts; sizes of the render cache (nothing written)
  rlattention viz runs/ram_mnist/checkpoints/best.ckpt --num-images 8    # into a new runs/ram_mnist/viz (viz-2...)
  rlattention backbones                                     # registered backbones, pretrained weights installed?
"""


def build_parser() -> argparse.ArgumentParser:
    """``rlattention <command> ...``: one sub-parser per command, in the order ``--help`` lists them."""
    p = argparse.ArgumentParser(
        prog="rlattention",
        description="Visual attention trained with reinforcement learning.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_fit, _eval, _viz, _data, _bench, _backbones):
        add(sub)
    return p


def _fit(sub) -> None:
    """``fit``: a config, overrides, or ``--resume``."""
    f = sub.add_parser("fit", help="train a method on a dataset", formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--config", "-c", help="experiment YAML (see configs/); defaults are used when omitted")
    f.add_argument("--data-dir", help="dataset folder (default: data.data_dir, then $RLATTENTION_DATA)")
    f.add_argument(
        "--resume",
        help="run folder, or any checkpoint inside one, to continue in that folder (its config and data folder "
        "are used; --data-dir still wins)",
    )
    f.add_argument(
        "--overwrite",
        action="store_true",
        help="start in trainer.run_name even if that folder is used: the old one is renamed aside to "
        "<name>.replaced-<time> (never deleted); default: a used name gets <name>-v2, -v3...",
    )
    f.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. model.num_glimpses=8")
    _add_import_option(f)


def _eval(sub) -> None:
    """``eval``: a checkpoint, the split, the data it is evaluated on, an attack, where results go."""
    e = sub.add_parser("eval", help="evaluate a checkpoint")
    e.add_argument("checkpoint")
    e.add_argument("--data-dir")
    e.add_argument(
        "--data",
        metavar="NAME",
        help="evaluate on another dataset: replaces the checkpoint's data.name, and its data.data_dir by --data-dir "
        "(or $RLATTENTION_DATA); its other data settings (image_size, ...) are kept, except completion_steps, "
        "which goes back to the new dataset's default",
    )
    e.add_argument(
        "overrides",
        nargs="*",
        metavar="data.key=value",
        help="override the checkpoint's data settings, e.g. data.sketchy_split=all_test data.skip_bad=true",
    )
    e.add_argument("--split", default="test", choices=["test", "val", "train"])
    e.add_argument("--mc-samples", type=int, default=0, help="average M stochastic episodes (0: mean actions)")
    e.add_argument("--seed", type=int, default=1234)
    e.add_argument("--batch-size", type=int, default=1000)
    e.add_argument("--accelerator", default="cpu")
    e.add_argument(
        "--devices", type=int, default=1, help="evaluate with N processes (their scores are gathered: same metrics)"
    )
    e.add_argument("--strategy", default="auto", help="Lightning strategy (auto: ddp when --devices > 1)")
    e.add_argument("--json", action="store_true", help="print the metrics as JSON")
    e.add_argument("--limit", type=int, default=0, help="evaluate only the first N images of the split")
    e.add_argument("--attack", choices=["pgd"], help="evaluate on adversarial images (L-inf PGD)")
    e.add_argument("--epsilon", type=float, default=0.1, help="PGD: radius of the L-inf ball (images in [0, 1])")
    e.add_argument("--step-size", type=float, default=0.01, help="PGD: step size")
    e.add_argument("--steps", type=int, default=20, help="PGD: number of steps")
    e.add_argument(
        "--out",
        metavar="FILE",
        help="write the results to FILE (a new file) instead of the run folder's eval.json (eval-2.json, ... when "
        "taken; next to the checkpoint outside a run folder)",
    )
    e.add_argument("--no-save", action="store_true", help="print the results only: write no eval.json")
    _add_import_option(e)


def _viz(sub) -> None:
    """``viz``: a checkpoint and the folder the figures go to."""
    v = sub.add_parser(
        "viz", help="write attention figures (glimpses, attention maps, ranked galleries) for a checkpoint"
    )
    v.add_argument("checkpoint")
    v.add_argument("--data-dir")
    v.add_argument("--split", default="test", choices=["test", "val", "train"])
    v.add_argument("--num-images", type=int, default=8)
    v.add_argument(
        "--out",
        metavar="DIR",
        help="output folder, new or empty (default: a new <run>/viz, viz-2, ...; never the training figures/)",
    )
    v.add_argument("--overwrite", action="store_true", help="let --out DIR be a folder that holds files already")
    v.add_argument("--seed", type=int, default=1234)
    _add_import_option(v)


def _data(sub) -> None:
    """``data list|info``."""
    d = sub.add_parser("data", help="list or inspect datasets")
    d.add_argument("action", choices=["list", "info"])
    d.add_argument("--data-dir")
    d.add_argument("rest", nargs="*", metavar="NAME [data.key=value ...]", help="info: the dataset and overrides")
    _add_import_option(d)


def _bench(sub) -> None:
    """``bench``: the speed benchmarks of a source checkout."""
    b = sub.add_parser("bench", help="run speed benchmarks (ratios against in-repo references)")
    b.add_argument("which", nargs="*", default=[], help="benchmarks to run (default: all)")
    b.add_argument("--out", default="benchmarks/results", help="folder for the JSON/markdown tables")
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--quick", action="store_true", help="fewer repetitions (smoke)")
    b.add_argument("--methods", nargs="+", metavar="METHOD", help="training: only these methods (default: all)")


def _backbones(sub) -> None:
    """``backbones``: the registered backbones."""
    k = sub.add_parser("backbones", help="list the registered backbones (parameters, pretrained weights, top-1)")
    k.add_argument("--json", action="store_true", help="print the table as JSON")


def _add_import_option(command: argparse.ArgumentParser) -> None:
    """``--import MODULE``: the commands that build a dataset or a method can register the user's own first."""
    command.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module that registers your own dataset or method first (a dotted name found on the path or "
        "in the working folder, or a .py file; repeatable; as RLATTENTION_IMPORT, see docs/own-data.md)",
    )
