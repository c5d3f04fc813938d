"""The recipe search behind the Lite rows of ``sbir_backbones``: heads trained on frozen, cached features.

    python benchmarks/sbir_recipes.py --data-dir ../shared/data/qmul_chairv2 --backbone efficientnet_lite0

With a frozen backbone, ``darp_triplet`` trains only its heads, so a recipe (which features, which head, which
loss) can be compared in seconds: the features of every complete sketch and photo of ChairV2 (and their mirror
images) are computed once by the library's BatchNorm-folded frozen backbone (levels 3 and 4, pooled to grids);
then, per recipe and seed, a sketch head and a photo head (linear or MLP to unit embeddings) are trained
exactly as ``darp_triplet`` trains them (batches of 64 complete sketches with their photos, mirrored together with
probability 1/2; triplet loss with a random negative, or over all negatives of the batch, or the in-batch softmax),
validated every 5 epochs on the validation photos, and the test split is evaluated at the best validation epoch.
Writes ``<out>/recipes_<backbone>_<size>.json`` and ``.md``; every recipe tried is a row.

``--protocol cv`` (the selection behind the Lite rows): the test split is never read. The 300 training photos
(``data.val_size=0``) are cut, by photo, into ``--folds`` seeded folds; each recipe trains its heads on the other
folds' sketches and photos for ``--epochs`` epochs and is scored every 5 epochs on the held-out fold (its sketches
against its photos), one run per fold. A recipe's score at an epoch count is the mean over the folds; the chosen
recipe and epoch count are the best mean acc@5 (ties: acc@1). Writes ``cv_<backbone>_<size>.json`` / ``.md``
with every recipe's curve and the config overrides of the chosen one (``sbir_backbones.py`` then trains it on all
300 training photos for that many epochs and evaluates the test split once).

    python benchmarks/sbir_recipes.py --protocol cv --data-dir ../shared/data/qmul_chairv2 --backbone efficientnet_lite0
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rlattention.data.registry import build_dataset
from rlattention.engine.config import load_config
from rlattention.vision.trunk import Trunk, fold_batchnorm

ROOT = Path(__file__).resolve().parents[1]

# name -> (feature keys, options); keys: "l<level>g<grid>"
RECIPES: dict[str, tuple[list[str], dict]] = {
    "avg pool, linear, triplet (first try)": (["l4g1"], {}),
    "avg pool, MLP, triplet": (["l4g1"], {"head": "mlp"}),
    "avg pool, MLP, triplet, lr 3e-4, 60 ep": (["l4g1"], {"head": "mlp", "lr": 3e-4, "epochs": 60}),
    "avg pool, MLP, triplet hardest negative": (["l4g1"], {"head": "mlp", "negatives": "hardest"}),
    "avg pool, linear, triplet, 256-d": (["l4g1"], {"dim": 256}),
    "L4 2x2 grid, linear, triplet": (["l4g2"], {}),
    "L4 3x3 grid, linear, triplet": (["l4g3"], {}),
    "L3 avg pool, linear, triplet": (["l3g1"], {}),
    "L3 3x3 grid, linear, triplet": (["l3g3"], {}),
    "L3 3x3 + L4 2x2, linear, triplet": (["l3g3", "l4g2"], {}),
    "L3 3x3 + L4 3x3, linear, triplet": (["l3g3", "l4g3"], {}),
    "L3 3x3 + L4 2x2, MLP, triplet, lr 3e-4, 60 ep": (["l3g3", "l4g2"], {"head": "mlp", "lr": 3e-4, "epochs": 60}),
    "L3 3x3 + L4 2x2, linear, triplet, dropout 0.3": (["l3g3", "l4g2"], {"drop": 0.3}),
    "L3 3x3 + L4 2x2, linear, triplet all negatives": (["l3g3", "l4g2"], {"negatives": "all"}),
    "L3 3x3 + L4 2x2, linear, InfoNCE": (["l3g3", "l4g2"], {"loss": "infonce"}),
    "L3 3x3 + L4 2x2, linear, InfoNCE tau 0.05": (["l3g3", "l4g2"], {"loss": "infonce", "tau": 0.05}),
    "L3 3x3 + L4 2x2, linear 128-d, InfoNCE, lr 3e-4 (the config)": (
        ["l3g3", "l4g2"],
        {"loss": "infonce", "dim": 128, "lr": 3e-4, "epochs": 60},
    ),
    "avg pool, linear, InfoNCE": (["l4g1"], {"loss": "infonce"}),
}

GRID = ["l3g3", "l4g2"]
IN128 = {"loss": "infonce", "dim": 128, "lr": 3e-4}
# --protocol cv: only options the library has (each maps to a config override, see `library_overrides`)
CV_RECIPES: dict[str, tuple[list[str], dict]] = {
    "avg pool, linear 64-d, triplet, lr 1e-3 (first library run)": (["l4g1"], {}),
    "avg pool, linear 128-d, InfoNCE, lr 3e-4": (["l4g1"], IN128),
    "L3 3x3 + L4 2x2, linear 64-d, triplet, lr 1e-3": (GRID, {}),
    "L3 3x3 + L4 2x2, linear 64-d, triplet all negatives, lr 1e-3": (GRID, {"negatives": "all"}),
    "L3 3x3 + L4 2x2, linear 64-d, InfoNCE, lr 1e-3": (GRID, {"loss": "infonce"}),
    "L3 3x3 + L4 2x2, linear 128-d, InfoNCE, lr 1e-3": (GRID, {**IN128, "lr": 1e-3}),
    "L3 3x3 + L4 2x2, linear 128-d, InfoNCE, lr 3e-4": (GRID, IN128),
    "L3 3x3 + L4 2x2, linear 128-d, InfoNCE, lr 1e-4": (GRID, {**IN128, "lr": 1e-4, "epochs": 100}),
    "L3 3x3 + L4 2x2, linear 256-d, InfoNCE, lr 3e-4": (GRID, {**IN128, "dim": 256}),
    "L3 3x3 + L4 2x2, linear 128-d, InfoNCE tau 0.05, lr 3e-4": (GRID, {**IN128, "tau": 0.05}),
    "L3 3x3 + L4 2x2, linear 128-d, InfoNCE tau 0.2, lr 3e-4": (GRID, {**IN128, "tau": 0.2}),
    "L3 3x3 + L4 2x2, linear 128-d, InfoNCE, lr 3e-4, weight decay 1e-4": (GRID, {**IN128, "wd": 1e-4}),
    "L3 3x3 + L4 2x2, MLP 512 -> 128-d, InfoNCE, lr 3e-4": (GRID, {**IN128, "head": "mlp"}),
    "L3 2x2 + L4 2x2, linear 128-d, InfoNCE, lr 3e-4": (["l3g2", "l4g2"], IN128),
    "L3 3x3 + L4 3x3, linear 128-d, InfoNCE, lr 3e-4": (["l3g3", "l4g3"], IN128),
    "L3 4x4 + L4 2x2, linear 128-d, InfoNCE, lr 3e-4": (["l3g4", "l4g2"], IN128),
    "L3 3x3 + L4 1x1, linear 128-d, InfoNCE, lr 3e-4": (["l3g3", "l4g1"], IN128),
    "L2 4x4 + L3 3x3 + L4 2x2, linear 128-d, InfoNCE, lr 3e-4": (["l2g4", *GRID], IN128),
    # added after the first pass over Lite0 (tau 0.2 led): the temperature further, and with the other features
    "L3 3x3 + L4 2x2, linear 128-d, InfoNCE tau 0.3, lr 3e-4": (GRID, {**IN128, "tau": 0.3}),
    "L3 3x3 + L4 2x2, linear 128-d, InfoNCE tau 0.5, lr 3e-4": (GRID, {**IN128, "tau": 0.5}),
    "L3 3x3 + L4 2x2, linear 128-d, InfoNCE tau 0.2, lr 1e-3": (GRID, {**IN128, "tau": 0.2, "lr": 1e-3}),
    "L3 3x3 + L4 3x3, linear 128-d, InfoNCE tau 0.2, lr 3e-4": (["l3g3", "l4g3"], {**IN128, "tau": 0.2}),
    "L2 4x4 + L3 3x3 + L4 2x2, linear 128-d, InfoNCE tau 0.2, lr 3e-4": (["l2g4", *GRID], {**IN128, "tau": 0.2}),
}
FEATURE_KEYS = ("l2g4", "l3g1", "l3g2", "l3g3", "l3g4", "l4g1", "l4g2", "l4g3")
DEFAULTS = {"head": "linear", "hidden": 512, "lr": 1e-3, "margin": 0.2, "dim": 64, "loss": "triplet",
            "negatives": "random", "tau": 0.1, "wd": 0.0}  # fmt: skip


def library_overrides(keys: list[str], opts: dict, epochs: int) -> list[str]:
    """The ``rlattention fit`` overrides of ``configs/darp_triplet_chairv2_lite0.yaml`` that train this recipe
    (every option written out, so the config's own choices do not leak in)."""
    o = {**DEFAULTS, **opts}
    if keys == ["l4g1"]:  # the last map (level 4), average-pooled
        levels, grid = "[]", "[]"
    else:
        levels = "[" + ",".join(k[1] for k in keys) + "]"
        grid = "[" + ",".join(k[3] for k in keys) + "]"
    return [
        f"model.feature_levels={levels}", f"model.feature_grid={grid}", f"model.head={o['head']}",
        f"model.head_hidden={o['hidden']}", f"model.embed_dim={o['dim']}", f"model.loss={o['loss']}",
        f"model.negatives={o['negatives']}", f"model.margin={o['margin']}", f"model.temperature={o['tau']}",
        f"optim.lr={o['lr']}", f"optim.weight_decay={o['wd']}", f"trainer.epochs={epochs}",
    ]  # fmt: skip


@torch.no_grad()
def features(
    backbone: str, size: int, data_dir: str, seed: int, extra: list[str], splits_wanted=("train", "val", "test")
) -> dict:
    """Per split: sketch / mirrored sketch / photo / mirrored photo features for every key, and the targets: the
    frozen backbone's levels 2, 3 and 4 (one pass of its BatchNorm-folded copy), average-pooled to 1x1 .. 4x4."""
    cfg = load_config(
        ROOT / "configs/darp_triplet_chairv2_lite0.yaml",
        ["data.completion_steps=1", f"data.image_size={size}", f"trainer.seed={seed}", *extra],
    )
    splits = build_dataset(cfg.data.name, cfg.data, data_dir)
    trunk = Trunk(backbone, pretrained=True, freeze="all", in_chans=3)
    net = fold_batchnorm(trunk.net)

    def levels(x: torch.Tensor) -> dict[str, torch.Tensor]:
        out: dict[str, list[torch.Tensor]] = {}
        for i in range(0, len(x), 64):
            b = x[i : i + 64].float() / 255
            b = trunk.preprocess(b.expand(-1, 3, -1, -1)).contiguous(memory_format=torch.channels_last)
            maps = dict(zip((2, 3, 4), net.forward_levels(b, (2, 3, 4)), strict=True))
            for key in FEATURE_KEYS:
                out.setdefault(key, []).append(F.adaptive_avg_pool2d(maps[int(key[1])], int(key[3])).flatten(1))
        return {k: torch.cat(v) for k, v in out.items()}

    out: dict = {}
    for split in splits_wanted:
        ds = getattr(splits, split)
        s, p = ds.images[:, :1], ds.images[:, -3:]
        out[split] = {"y": ds.targets.clone(), "s": levels(s), "sf": levels(s.flip(-1)), "p": levels(p),
                      "pf": levels(p.flip(-1))}  # fmt: skip
    return out


def _ranks_at(es, ep, d: dict, keys: list[str]) -> dict[int, float]:
    y = d["y"]
    first: dict[int, int] = {}
    for i, t in enumerate(y.tolist()):
        first.setdefault(t, i)
    ids = sorted(first)
    gallery = ep(torch.cat([d["p"][k] for k in keys], 1)[[first[t] for t in ids]])
    query = es(torch.cat([d["s"][k] for k in keys], 1))
    row = {t: j for j, t in enumerate(ids)}
    target = torch.tensor([row[t] for t in y.tolist()])
    dist = torch.cdist(query, gallery)
    true = dist.gather(1, target[:, None])
    rank = (dist < true).sum(1) + (dist == true).sum(1)  # ties count against the query
    return {k: float((rank <= k).float().mean() * 100) for k in (1, 5, 10)}


def train_heads(data: dict, keys: list[str], seed: int, head="linear", hidden=512, lr=1e-3, margin=0.2, dim=64,
                epochs=40, bs=64, drop=0.0, loss="triplet", negatives="random", tau=0.1, wd=0.0,
                curve: list | None = None) -> dict:  # fmt: skip
    """Train the two heads; every 5 epochs score ``data["val"]`` (appended to ``curve`` as (epoch, {k: acc@k}))
    and, when ``data`` has a test split, evaluate it at each new best validation acc@5."""
    torch.manual_seed(seed)
    tr = data["train"]
    S, SF, P, PF = (torch.cat([tr[part][k] for k in keys], 1) for part in ("s", "sf", "p", "pf"))
    Y = tr["y"]

    def make() -> nn.Module:
        if head == "linear":
            return nn.Sequential(nn.Dropout(drop), nn.Linear(S.shape[1], dim))
        return nn.Sequential(nn.Dropout(drop), nn.Linear(S.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, dim))

    hs, hp = make(), make()

    def es(x):
        return F.normalize(hs(x), dim=-1)

    def ep(x):
        return F.normalize(hp(x), dim=-1)

    opt = torch.optim.Adam([*hs.parameters(), *hp.parameters()], lr=lr, weight_decay=wd)
    best = {"val": -1.0}
    for epoch in range(epochs):
        hs.train(), hp.train()
        perm = torch.randperm(len(Y))
        for b in range(len(Y) // bs):
            idx = perm[b * bs : (b + 1) * bs]
            flip = torch.rand(len(idx)) < 0.5
            a = es(torch.where(flip[:, None], SF[idx], S[idx]))
            p = ep(torch.where(flip[:, None], PF[idx], P[idx]))
            y = Y[idx]
            dist = torch.cdist(a, p)
            d_pos = dist.diagonal()
            other = y[None] != y[:, None]
            if loss == "infonce":
                same = ~other & ~torch.eye(len(idx), dtype=torch.bool)
                logits = (a @ p.T / tau).masked_fill(same, float("-inf"))
                t = torch.arange(len(idx))
                value = 0.5 * (F.cross_entropy(logits, t) + F.cross_entropy(logits.T, t))
            elif negatives == "all":
                value = (F.relu(margin + d_pos[:, None] - dist) * other).sum() / other.sum().clamp(min=1)
            else:
                if negatives == "hardest":
                    d_neg = dist.masked_fill(~other, float("inf")).min(1).values
                    valid = other.any(1)
                else:
                    j = (torch.arange(len(idx)) + torch.randint(1, len(idx), (len(idx),))) % len(idx)
                    d_neg = dist.gather(1, j[:, None]).squeeze(1)
                    valid = other.gather(1, j[:, None]).squeeze(1)
                hinge = F.relu(margin + d_pos - d_neg.masked_fill(~valid, 0.0)) * valid
                value = hinge.sum() / valid.sum().clamp(min=1)
            opt.zero_grad()
            value.backward()
            opt.step()
        if (epoch + 1) % 5 == 0:
            hs.eval(), hp.eval()
            with torch.no_grad():
                scores = _ranks_at(es, ep, data["val"], keys)
                if curve is not None:
                    curve.append((epoch + 1, scores))
                if scores[5] > best["val"]:
                    test = _ranks_at(es, ep, data["test"], keys) if "test" in data else None
                    best = {"val": scores[5], "test": test, "epoch": epoch + 1}
    return best


def photo_folds(y: torch.Tensor, k: int, seed: int) -> list[torch.Tensor]:
    """``k`` disjoint sets of photo ids covering the ids of ``y`` (a seeded permutation cut in k near-equal parts)."""
    ids = torch.unique(y)
    if not 2 <= k <= len(ids):
        raise ValueError(f"--folds must be in 2..{len(ids)} (photos of the training split), got {k}")
    perm = ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))]
    return [perm[i::k] for i in range(k)]


def _take(d: dict, mask: torch.Tensor) -> dict:
    return {
        "y": d["y"][mask],
        **{part: {key: v[mask] for key, v in d[part].items()} for part in ("s", "sf", "p", "pf")},
    }


def cross_validate(train: dict, keys: list[str], opts: dict, folds: list[torch.Tensor], seed: int) -> dict:
    """One run per fold: heads trained on the other folds, scored every 5 epochs on the held-out fold. Returns the
    per-fold curves and, per epoch count, the mean over the folds."""
    per_fold = []
    for i, held in enumerate(folds):
        out = torch.isin(train["y"], held)
        curve: list = []
        train_heads({"train": _take(train, ~out), "val": _take(train, out)}, keys, seed + i, curve=curve, **opts)
        per_fold.append(curve)
    epochs = [e for e, _ in per_fold[0]]
    mean = {e: {k: statistics.mean(c[j][1][k] for c in per_fold) for k in (1, 5, 10)} for j, e in enumerate(epochs)}
    best_epoch = max(epochs, key=lambda e: (mean[e][5], mean[e][1], -e))
    j = epochs.index(best_epoch)
    return {
        "epochs": epochs,
        "mean_acc@5": [round(mean[e][5], 2) for e in epochs],
        "mean_acc@1": [round(mean[e][1], 2) for e in epochs],
        "best_epoch": best_epoch,
        "cv_acc@5": round(mean[best_epoch][5], 2),
        "cv_acc@1": round(mean[best_epoch][1], 2),
        "cv_acc@10": round(mean[best_epoch][10], 2),
        "fold_acc@5": [round(c[j][1][5], 2) for c in per_fold],
    }


def main_cv(args: argparse.Namespace, cmd: str) -> int:
    t0 = time.time()
    scratch = Path(args.keep_features) if args.keep_features else None
    if scratch is not None and scratch.is_file():
        train = torch.load(scratch, weights_only=True)
    else:
        train = features(args.backbone, args.size, args.data_dir, 0, ["data.val_size=0", *args.overrides], ("train",))
        train = train["train"]
        if scratch is not None:
            torch.save(train, scratch)
    print(f"features: {time.time() - t0:.0f} s ({len(train['y'])} sketches)", flush=True)
    folds = photo_folds(train["y"], args.folds, args.fold_seed)
    recipes = dict(CV_RECIPES)
    if args.top_from:  # the best `--top` recipes of another backbone's selection, and the first library run's
        earlier = json.loads(Path(args.top_from).read_text())["rows"]
        best = [r["recipe"] for r in sorted(earlier, key=lambda r: (-r["cv_acc@5"], -r["cv_acc@1"]))[: args.top]]
        recipes = {k: v for i, (k, v) in enumerate(CV_RECIPES.items()) if i == 0 or k in best}
    rows = []
    for name, (keys, opts) in recipes.items():
        opts = {"epochs": args.epochs, **opts}
        t1 = time.time()
        res = cross_validate(train, keys, opts, folds, args.fold_seed)
        row = {"recipe": name, "features": keys, "options": opts, **res, "seconds": round(time.time() - t1, 1)}
        row["overrides"] = library_overrides(keys, {k: v for k, v in opts.items() if k != "epochs"}, res["best_epoch"])
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("recipe", "cv_acc@5", "cv_acc@1", "best_epoch", "fold_acc@5")}),
              flush=True)  # fmt: skip
    chosen = max(rows, key=lambda r: (r["cv_acc@5"], r["cv_acc@1"]))
    tag = f"{args.backbone}_{args.size}" + "".join(f"_{o}" for o in args.overrides)
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "command": cmd,
        "protocol": f"{args.folds}-fold cross-validation over the training photos (fold seed {args.fold_seed}); "
        "test split not read",
        "sketches": len(train["y"]),
        "photos_per_fold": [len(f) for f in folds],
        "chosen": chosen["recipe"],
        "chosen_overrides": chosen["overrides"],
        "rows": rows,
    }
    (out / f"cv_{tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        f"# Recipe selection by cross-validation, {args.backbone} at {args.size} px {' '.join(args.overrides)}",
        "",
        f"`{cmd}`",
        "",
        f"{doc['protocol']}: {len(train['y'])} training sketches of {sum(doc['photos_per_fold'])} photos, "
        f"{len(folds)} folds of {min(doc['photos_per_fold'])}-{max(doc['photos_per_fold'])} photos; each fold's "
        "sketches are queries against its own photos. Score: the mean over the folds at the best epoch count "
        "(checked every 5). Percent.",
        "",
        "| recipe | CV acc@5 | per fold | CV acc@1 | CV acc@10 | epochs |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: -r["cv_acc@5"]):
        mark = " **(chosen)**" if r is chosen else ""
        lines.append(
            f"| {r['recipe']}{mark} | {r['cv_acc@5']:.1f} | {', '.join(f'{v:.1f}' for v in r['fold_acc@5'])} | "
            f"{r['cv_acc@1']:.1f} | {r['cv_acc@10']:.1f} | {r['best_epoch']} |"
        )
    lines += ["", "Chosen recipe as `rlattention fit` overrides: `" + " ".join(chosen["overrides"]) + "`"]
    (out / f"cv_{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--backbone", default="efficientnet_lite0")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="benchmarks/results/sbir_backbones")
    ap.add_argument("--protocol", choices=("holdout", "cv"), default="holdout",
                    help="holdout: the first search (test at the best validation epoch, 30 validation photos); "
                    "cv: selection by cross-validation over the training photos, test never read")  # fmt: skip
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--top-from", help="cv: only the best --top recipes of this cv_*.json (another backbone's)")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--keep-features", help="cv: a .pt file for the training features (read if it exists)")
    ap.add_argument("--fold-seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=60, help="cv: the longest run (scored every 5 epochs)")
    ap.add_argument("overrides", nargs="*", help="data overrides for the renders, e.g. data.line_width=6")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cmd = "python benchmarks/sbir_recipes.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.protocol == "cv":
        return main_cv(args, cmd)
    t0 = time.time()
    data = features(args.backbone, args.size, args.data_dir, 0, args.overrides)
    print(f"features: {time.time() - t0:.0f} s", flush=True)
    rows = []
    for name, (keys, opts) in RECIPES.items():
        res = [train_heads(data, keys, s, **opts) for s in args.seeds]
        row = {
            "recipe": name,
            "features": keys,
            "options": opts,
            "seeds": args.seeds,
            "val_acc@5": [round(r["val"], 2) for r in res],
            "test_acc@5": [round(r["test"][5], 2) for r in res],
            "test_acc@1": [round(r["test"][1], 2) for r in res],
            "best_epoch": [r["epoch"] for r in res],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    tag = f"{args.backbone}_{args.size}" + "".join(f"_{o}" for o in args.overrides)
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / f"recipes_{tag}.json").write_text(json.dumps({"command": cmd, "rows": rows}, indent=1) + "\n")
    lines = [
        f"# Recipe search, {args.backbone} at {args.size} px {' '.join(args.overrides)}",
        "",
        f"`{cmd}` (heads on cached frozen features; test at the best validation epoch; percent)",
        "",
        "| recipe | test acc@5 mean ± sd | per seed | test acc@1 | val acc@5 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["test_acc@5"]
        lines.append(
            f"| {r['recipe']} | {statistics.mean(t):.1f} ± {statistics.stdev(t) if len(t) > 1 else 0:.1f} | "
            f"{', '.join(f'{v:.1f}' for v in t)} | {statistics.mean(r['test_acc@1']):.1f} | "
            f"{statistics.mean(r['val_acc@5']):.1f} |"
        )
    (out / f"recipes_{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
