"""The recipe search behind the Lite rows of ``sbir_backbones``: heads trained on frozen, cached features.

    python benchmarks/sbir_recipes.py --data-dir ../shared/data/qmul_chairv2 --backbone efficientnet_lite0

With a frozen backbone, ``darp_triplet`` trains only its heads, so a recipe (which features, which head, which
loss) can be compared in seconds: the features of every complete sketch and photo of ChairV2 (and their mirror
images) are computed once by the library's BatchNorm-folded frozen backbone (levels 3 and 4, pooled to grids);
then, per recipe and seed, a sketch head and a photo head (linear or MLP to unit embeddings) are trained
exactly as ``darp_triplet`` trains them (batches of 64 complete sketches with their photos, mirrored together with
probability 1/2; triplet loss with a random negative, or over all negatives of the batch, or the in-batch softmax),
validated every 5 epochs on the validation photos, and the test split is evaluated at the best validation epoch.
Writes ``<out>/recipes.json`` and ``<out>/recipes.md``; every recipe tried is a row.
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


@torch.no_grad()
def features(backbone: str, size: int, data_dir: str, seed: int, extra: list[str]) -> dict:
    """Per split: sketch / mirrored sketch / photo / mirrored photo features for every key, and the targets: the
    frozen backbone's levels 3 and 4 (one pass of its BatchNorm-folded copy), average-pooled to 1x1 .. 3x3."""
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
            l3, l4 = net.forward_levels(b, (3, 4))
            for key in ("l3g1", "l3g3", "l4g1", "l4g2", "l4g3"):
                m = l3 if key[1] == "3" else l4
                out.setdefault(key, []).append(F.adaptive_avg_pool2d(m, int(key[3])).flatten(1))
        return {k: torch.cat(v) for k, v in out.items()}

    out: dict = {}
    for split in ("train", "val", "test"):
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
                epochs=40, bs=64, drop=0.0, loss="triplet", negatives="random", tau=0.1) -> dict:  # fmt: skip
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

    opt = torch.optim.Adam([*hs.parameters(), *hp.parameters()], lr=lr)
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
                val = _ranks_at(es, ep, data["val"], keys)[5]
                if val > best["val"]:
                    best = {"val": val, "test": _ranks_at(es, ep, data["test"], keys), "epoch": epoch + 1}
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--backbone", default="efficientnet_lite0")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="benchmarks/results/sbir_backbones")
    ap.add_argument("overrides", nargs="*", help="data overrides for the renders, e.g. data.line_width=6")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
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
    cmd = "python benchmarks/sbir_recipes.py " + " ".join(sys.argv[1:] if argv is None else argv)
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
