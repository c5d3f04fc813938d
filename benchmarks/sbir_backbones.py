"""Study ``sbir_backbones``: complete-sketch -> photo retrieval on QMUL-Chair-V2 (test: 323 sketches against 100
photos; validation: 30 training photos and their sketches, carved from train by photo) with the phase-1 triplet
network of DARP on each backbone: from scratch (today's network) and ImageNet-pretrained EfficientNet-Lite0/1/2.

    python benchmarks/sbir_backbones.py --data-dir ../shared/data/qmul_chairv2 --seeds 0 1 2

Every row trains ``darp_triplet`` (complete sketch as anchor, its photo, another photo of the batch; triplet loss)
and is selected on validation acc@5. The Lite rows keep the backbone frozen (its features of every render and photo,
and of their mirror images, computed once and read from the cache: the seeds share them) or fine-tune its last
units on cached inputs, as each row says. Metrics: acc@1 / acc@5 / acc@10 of the complete sketch, in percent.
"""

from __future__ import annotations

import sys

from study import Row, main

STUDY = "sbir_backbones"
LITE = "configs/darp_triplet_chairv2_lite0.yaml"  # the Lite recipe; rows swap the backbone and input size
COMMON = ["data.completion_steps=1"]  # complete sketches only: the protocol of this study

LITE_RECIPE = "frozen; L3 3x3 + L4 2x2 grid features; linear 128-d; InfoNCE"
FIRST_TRY = [  # the recipe of the first library run: global average pooling, linear 64-d head, triplet loss
    "model.feature_levels=[]",
    "model.feature_grid=[]",
    "model.embed_dim=64",
    "model.loss=triplet",
    "optim.lr=0.001",
    "trainer.epochs=40",
]

ROWS = [
    Row("scratch", "configs/darp_triplet_chairv2.yaml", COMMON, "today's phase-1 network: 4-layer CNN, 64 px"),
    Row("efficientnet_lite0", LITE, COMMON, LITE_RECIPE + "; 224 px"),
    Row(
        "efficientnet_lite1",
        LITE,
        COMMON + ["model.backbone=efficientnet_lite1", "data.image_size=240"],
        LITE_RECIPE + "; 240 px",
    ),
    Row(
        "efficientnet_lite2",
        LITE,
        COMMON + ["model.backbone=efficientnet_lite2", "data.image_size=260"],
        LITE_RECIPE + "; 260 px",
    ),
    # variants tried through the library (the recipe search on cached features: recipes_*.md)
    Row("lite0_avgpool_triplet", LITE, COMMON + FIRST_TRY, "frozen; avg pool; linear 64-d; triplet", False),
    Row(  # the recipe of the search with the best validation acc@5 (98.2), chosen on validation only
        "lite0_validation_chosen",
        LITE,
        COMMON + ["model.embed_dim=64", "optim.lr=0.001", "trainer.epochs=40"],
        "frozen; L3 3x3 + L4 2x2 grid; linear 64-d; InfoNCE; lr 1e-3 (the search's best on validation)",
        False,
    ),
]


def metrics(report: dict) -> dict[str, float]:
    t = report["test"]
    return {k: 100.0 * t[k] for k in ("acc@1", "acc@5", "acc@10")}


def cache_note(doc: dict) -> str:
    lines = [
        "First epoch against the second (the first seed of each row; the first epoch includes `prepare_seconds`, in "
        "which a frozen backbone's features are computed, or read when an earlier run of the same backbone, input "
        "and weights left them in the cache, as for efficientnet_lite0 here):"
    ]
    for r in doc["rows"]:
        prep, epochs = r["prepare_seconds"][0], r["epoch_seconds"][0]
        if prep is None or not epochs or len(epochs) < 2:
            continue
        first = prep + epochs[0]
        lines.append(f"- {r['name']}: first {first:.1f} s, second {epochs[1]:.2f} s ({first / epochs[1]:.0f}x)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(
        main(
            STUDY,
            ROWS,
            metrics,
            "Complete-sketch retrieval on QMUL-Chair-V2 test (323 sketches x 100 photos), darp_triplet per backbone, "
            "selected on validation acc@5; percent",
            sys.argv[1:],
            extra_md=cache_note,
            primary="acc@5",
        )
    )
