"""benchmarks/dcpg_figures.py: the reward curve from a run's logs (metrics.csv, else the TensorBoard events)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dcpg_figures.py"


@pytest.fixture(scope="module")
def figures():
    spec = importlib.util.spec_from_file_location("dcpg_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves its annotations in its module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def write_metrics(run: Path, rows: list[dict]) -> None:
    """A metrics.csv as Lightning's CSV logger writes it: step + every key, blank where a row lacks it."""
    keys = sorted({k for row in rows for k in row} - {"step"})
    lines = [",".join(["step", *keys])]
    lines += [",".join([str(row["step"]), *(str(row.get(k, "")) for k in keys)]) for row in rows]
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "metrics.csv").write_text("\n".join(lines) + "\n")


def dcpg_rows() -> list[dict]:
    rows = [
        {"step": s, "train/loss": 5.0 - s / 100, "train/reward": s / 400, "train/reward_image": s / 500}
        for s in (50, 100, 150, 200)
    ]
    rows.append({"step": 200, "val/rsum": 120.0})  # validation at the end of the epoch
    rows.append({"step": 150, "train/loss": 3.0, "train/reward": 0.9})  # re-logged after a resume: the last counts
    rows.append({"step": 250, "train/loss": 2.0, "train/reward": 0.7, "train/reward_image": 0.6})
    return rows


def test_read_metric_keeps_one_value_per_step_in_order(tmp_path, figures):
    write_metrics(tmp_path / "run", dcpg_rows())
    steps, values = figures.read_metric(tmp_path / "run", "train/reward")
    assert steps.tolist() == [50, 100, 150, 200, 250]
    np.testing.assert_allclose(values, [0.125, 0.25, 0.9, 0.5, 0.7])
    steps, values = figures.read_metric(tmp_path / "run", "val/rsum")
    assert steps.tolist() == [200] and values.tolist() == [120.0]
    assert len(figures.read_metric(tmp_path / "run", "train/nothing")[0]) == 0
    with pytest.raises(FileNotFoundError, match="metrics.csv"):
        figures.read_metric(tmp_path / "missing", "train/reward")


def test_reward_curve_png_for_dcpg_and_baseline_runs(tmp_path, figures):
    write_metrics(tmp_path / "dcpg", dcpg_rows())
    write_metrics(tmp_path / "baseline", [{"step": 50, "train/loss": 4.0}, {"step": 100, "val/rsum": 90.0}])
    out = figures.plot_reward_curves(
        figures.parse_runs([str(tmp_path / "dcpg"), f"base={tmp_path / 'baseline'}"]),
        tmp_path / "figs" / "reward.png",
        keys=["train/reward", "train/reward_image"],
        smooth=3,
    )
    assert out.is_file() and out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="train/reward"):  # a baseline alone has no reward to plot
        figures.plot_reward_curves([tmp_path / "baseline"], tmp_path / "none.png")


def test_command_line_and_helpers(tmp_path, figures, capsys):
    write_metrics(tmp_path / "run", dcpg_rows())
    assert figures.main([str(tmp_path / "run"), "--out", str(tmp_path / "r.png"), "--smooth", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "r.png") and (tmp_path / "r.png").is_file()
    assert figures.main([str(tmp_path / "run")]) == 0  # default: <run>/figures/dcpg_reward.png
    assert (tmp_path / "run" / "figures" / "dcpg_reward.png").is_file()
    assert list(figures.parse_runs(["a=/x/run1", "/y/run1", "/z/run1"])) == ["a", "run1", "run1 (2)"]
    np.testing.assert_allclose(figures.moving_average(np.arange(5.0), 3), [0.5, 1, 2, 3, 3.5])
    assert figures.first_caption_items([0, 0, 0, 1, 1, 2, 2, 3], 3) == [0, 3, 5]


def test_reads_the_tensorboard_events_of_a_run_in_progress(tmp_path, figures):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "run" / "tb"))
    for step in (50, 100, 150):
        writer.add_scalar("train/reward", step / 100, step)
    writer.close()
    steps, values = figures.read_metric(tmp_path / "run", "train/reward")
    assert steps.tolist() == [50, 100, 150]
    np.testing.assert_allclose(values, [0.5, 1.0, 1.5])


def test_table4_rows_from_run_folders(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("dcpg_table", SCRIPT.parent / "dcpg_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    import json

    import yaml

    from rlattention.engine.config import load_config, to_dict

    def current(name: str) -> dict:  # the model section of a run of the current config, as fit writes it
        return to_dict(load_config(SCRIPT.parents[1] / "configs" / f"dcpg_digit_scenes{name}.yaml"))["model"]

    test = {"i2t_r1": 60.6, "i2t_r5": 88.0, "i2t_r10": 94.3, "t2i_r1": 30.7, "t2i_r5": 56.2, "t2i_r10": 67.1}
    runs = [
        ("base", {"pg": "none"}),  # a run of the first scheme (its config predates the new keys)
        ("full", {"heads": 1, "pg_baseline": True, "reward": "ap"}),
        ("new_full", current("")),
        ("new_base", current("_baseline")),
        ("noise", current("_noise_matched")),
    ]
    for name, model in runs:
        run = tmp_path / name
        run.mkdir()
        report = {"test": {**test, "rsum": sum(test.values())}, "best_val_rsum": 390.0, "epochs": 2, "train_seconds": 9}
        (run / "report.json").write_text(json.dumps(report))
        (run / "config.yaml").write_text(yaml.safe_dump({"model": model}))
    assert table.main([str(tmp_path / name) for name, _ in runs]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("| `base` | triplet + instance + text decoding, no policy (features × 1) | 60.6 | 88.0")
    assert "PG discrete-continuous, 1 head, reward ap, λ = 20, PG baseline β = 0.5, relaxed estimator" in out[3]
    assert "logistic bins (eq. 3 as printed), σ init: PyTorch default |" in out[3]  # the first scheme, named
    assert "| 396.9 | 390.0 | 2 | 9 s |" in out[3]
    assert ", PG discrete-continuous, 2 heads, reward r1+ap, λ = 20 | 60.6" in out[4]  # the current scheme: no extras
    assert "| triplet + instance + text decoding, no policy (features × 10) |" in out[5]  # 20 * 0.5
    assert "noise-matched control" in out[6] and "PG discrete" not in out[6] and "reward" not in out[6]
    with pytest.raises(SystemExit, match="no report.json"):
        table.main([str(tmp_path)])


def tiny_dcpg(pg: str = "discrete_continuous"):
    """A small untrained dcpg model (4 regions of 12-d features, 20 tokens) with a vocabulary, in eval mode."""
    import torch

    from rlattention.engine.method import DataInfo
    from rlattention.methods.dcpg import DCPG, DCPGConfig

    torch.manual_seed(0)
    cfg = DCPGConfig(embed_dim=16, word_dim=8, num_bins=10, gcn_layers=1, pg=pg)
    meta = {"vocab_size": 20, "vocab": [f"w{i}" for i in range(16)]}
    model = DCPG(cfg, DataInfo((1, 4, 12), 6, meta)).eval()
    images = torch.randn(3, 1, 4, 12)
    targets = torch.tensor([[0, 1, 5, 9, 2, 0, 0], [1, 1, 7, 4, 11, 6, 2], [2, 1, 8, 2, 0, 0, 0]])
    return model, images, targets


def test_attention_pairs_figure_has_one_fixed_0_1_colour_scale(tmp_path, figures):
    from matplotlib.colorbar import Colorbar
    from matplotlib.image import AxesImage

    model, images, targets = tiny_dcpg()
    model.scene_roots = (tmp_path / "no_scenes",)  # never the user's cache
    pairs = figures.attention_pairs(model, images, targets)
    assert [p.words for p in pairs][2] == ["<start>", "w4", "<end>"]  # padding dropped
    assert [len(p.region_attention) for p in pairs] == [4, 4, 4]
    for p in pairs:
        assert len(p.word_attention) == len(p.words)
        for weights in (p.region_attention, p.word_attention):
            assert ((weights > 0) & (weights < 1)).all()
    region, words = model.attention(images, targets)
    np.testing.assert_allclose(pairs[1].region_attention, region[1].numpy(), atol=1e-6)
    np.testing.assert_allclose(pairs[1].word_attention, words[1, :6].numpy(), atol=1e-6)

    fig = figures.attention_pairs_figure(pairs, "tiny")
    cells = [im for ax in fig.axes for im in ax.get_images() if isinstance(im, AxesImage)]
    assert len(cells) == 2 * len(pairs)  # region and word cells of each pair (no scene: synthetic features)
    assert all((im.norm.vmin, im.norm.vmax) == (0.0, 1.0) for im in cells)
    bars = [ax._colorbar for ax in fig.axes if isinstance(getattr(ax, "_colorbar", None), Colorbar)]
    assert len(bars) == 1 and (bars[0].norm.vmin, bars[0].norm.vmax) == (0.0, 1.0)
    import matplotlib.pyplot as plt

    plt.close(fig)

    out = figures.plot_attention_pairs(pairs, tmp_path / "figs" / "pairs.png", "tiny")
    assert out.is_file() and out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"


def test_attention_pairs_of_a_baseline_raise(tmp_path, figures):
    from rlattention.methods.dcpg import NoAttentionPolicyError

    model, images, targets = tiny_dcpg(pg="none")
    with pytest.raises(NoAttentionPolicyError):
        figures.attention_pairs(model, images, targets)
