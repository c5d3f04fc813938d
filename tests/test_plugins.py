"""Plugins (``rlattention/plugins.py``): a user's module that registers a dataset and a method, imported through
``$RLATTENTION_IMPORT`` (a module in the working directory, or a ``.py`` path), through package entry points, or
through :func:`import_plugins`, then trained end to end through the command line; a plugin that fails is one line
naming it and the exception. The plugin is the one of docs/own-data.md, taken from the page."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlattention import plugins
from rlattention.cli import main
from rlattention.data import registry as data_registry
from rlattention.data.registry import available_datasets, build_dataset
from rlattention.engine import registry as method_registry
from rlattention.engine.registry import available_methods, get_method
from rlattention.plugins import PluginError, import_plugins

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "own-data.md"
PLUGIN = re.search(r"```python\n(# my_plugin\.py\n.*?)```", GUIDE.read_text(encoding="utf-8"), re.S).group(1)
#: the modules the tests write, forgotten after each test
TEST_MODULES = {"my_plugin", "path_plugin", "another_plugin", "my_package", "broken_plugin", "bad_ep", "clash_plugin"}
TRAIN = ["trainer.max_steps=2", "trainer.batch_size=4", "trainer.progress=false", "trainer.num_threads=1"]


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    """Registries, plugin state, ``sys.path`` and ``sys.modules`` as they were before the test."""
    data_registry._import_all()
    method_registry._load_all()
    monkeypatch.setattr(data_registry, "_DATASETS", dict(data_registry._DATASETS))
    monkeypatch.setattr(method_registry, "_METHODS", dict(method_registry._METHODS))
    monkeypatch.setattr(plugins, "_scanned", set())
    monkeypatch.setattr(plugins, "_imported", set())
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv(plugins.IMPORT_ENV, raising=False)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    for name in [m for m in sys.modules if m.split(".")[0] in TEST_MODULES]:
        del sys.modules[name]


def write_plugin(folder: Path, name: str = "my_plugin", text: str = PLUGIN) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(text)
    return path


def write_npz(folder: Path, n: int = 24) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "data.npz", images=rng.integers(0, 256, (n, 12, 12), dtype=np.uint8), labels=np.arange(n) % 3)
    return folder


def test_environment_module_in_working_dir_trains_end_to_end(tmp_path, monkeypatch, capsys):
    code_dir = tmp_path / "work"
    write_plugin(code_dir)
    data = write_npz(tmp_path / "data")
    monkeypatch.chdir(code_dir)
    monkeypatch.setenv(plugins.IMPORT_ENV, "my_plugin")
    assert "my_plugin" not in sys.modules
    argv = ["fit", "--data-dir", str(data), "data.name=my_npz", "method=smooth_cnn", "model.channels=[4,8]"]
    argv += ["model.hidden=8", "model.label_smoothing=0.2", *TRAIN, f"trainer.out_dir={tmp_path / 'runs'}"]
    assert main([*argv, "trainer.run_name=run", "eval.viz_images=0"]) == 0
    report = json.loads((tmp_path / "runs" / "run" / "report.json").read_text())
    assert report["dataset"] == "my_npz" and "final test accuracy" in capsys.readouterr().out
    assert "my_npz" in available_datasets() and "smooth_cnn" in available_methods()
    assert get_method("smooth_cnn").__module__ == "my_plugin"
    assert "" in sys.path or str(code_dir) in sys.path  # found in the working directory, which was then appended
    splits = build_dataset("my_npz", type("Cfg", (), {"seed": 0})(), data)
    assert (len(splits.train), len(splits.val), len(splits.test), splits.num_classes) == (12, 6, 6, 3)
    # the method's own config is checked like any other
    assert main([*argv[:-1], "model.label_smoothing=1.5", f"trainer.out_dir={tmp_path / 'runs'}"]) == 2
    assert "model.label_smoothing must be in [0, 1), got 1.5" in capsys.readouterr().err


def test_python_file_path_and_import_plugins(tmp_path, monkeypatch):
    path = write_plugin(tmp_path / "elsewhere", "path_plugin")
    monkeypatch.setenv(plugins.IMPORT_ENV, f" {path} , ")
    assert "my_npz" in available_datasets()
    assert sys.modules["path_plugin"].__file__ == str(path)
    assert "smooth_cnn" in available_methods()  # imported once: no "registered twice"
    assert import_plugins([str(path)]) == []  # already imported
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "another_plugin.py").write_text(
        "from rlattention.data.registry import register_dataset\n\n"
        "@register_dataset('another')\ndef build(cfg, data_dir):\n    raise ValueError('not built here')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "other"))
    assert import_plugins(["another_plugin", "another_plugin"]) == ["another_plugin"]
    assert "another" in available_datasets()


def _dist(site: Path, name: str, entry_points: str) -> None:
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


def test_entry_points(tmp_path, monkeypatch):
    site = tmp_path / "site"
    write_plugin(site / "my_package", "my_plugin")
    (site / "my_package" / "__init__.py").write_text("")
    (site / "my_package" / "hooks.py").write_text("CALLS = []\n\ndef register():\n    CALLS.append(1)\n")
    _dist(
        site,
        "my_package",
        "[rlattention.datasets]\nmy_npz = my_package.my_plugin\nhook = my_package.hooks:register\n\n"
        "[rlattention.methods]\nsmooth_cnn = my_package.my_plugin\n",
    )
    monkeypatch.syspath_prepend(str(site))
    assert "smooth_cnn" in available_methods()  # the methods group
    assert "my_npz" in available_datasets()  # the datasets group: the same module, imported once
    assert available_datasets() == available_datasets()
    assert sys.modules["my_package.hooks"].CALLS == [1]  # a function entry point is called, once


def test_failing_plugin_is_one_line(tmp_path, monkeypatch, capsys):
    write_plugin(tmp_path, "broken_plugin", "import torch\n\nraise RuntimeError('boom\\nsecond line')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(plugins.IMPORT_ENV, "broken_plugin")
    assert main(["fit", "data.name=digits", f"trainer.out_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "rlattention fit: error: $RLATTENTION_IMPORT: plugin module 'broken_plugin' failed to import: "
        "RuntimeError: boom"
    ]
    with pytest.raises(PluginError) as info:  # tried again at the next look-up, and chained to the cause
        available_datasets()
    assert isinstance(info.value.__cause__, RuntimeError)
    monkeypatch.setenv(plugins.IMPORT_ENV, "no_such_module_here")
    with pytest.raises(PluginError, match="'no_such_module_here' failed to import: ModuleNotFoundError"):
        available_methods()
    monkeypatch.setenv(plugins.IMPORT_ENV, "not a module!")
    with pytest.raises(PluginError, match="expected a dotted module name"):
        available_methods()


def test_failing_entry_point_names_it(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "bad_ep.py").write_text("raise ImportError('needs something')\n")
    _dist(site, "bad_dist", "[rlattention.datasets]\nbad = bad_ep\n")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(PluginError) as info:
        available_datasets()
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        "plugin entry point 'bad = bad_ep' (group rlattention.datasets, package bad_dist 0.1) failed to import: "
        "ImportError: needs something"
    )
    assert isinstance(info.value, ValueError)  # the command line reports it in one line


def test_name_registered_twice_is_a_plugin_error(tmp_path, monkeypatch):
    write_plugin(
        tmp_path,
        "clash_plugin",
        "from rlattention.engine.registry import register_method\nfrom rlattention.methods.cnn import CNN\n\n"
        "@register_method('cnn')\nclass Mine(CNN):\n    pass\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        PluginError, match="'clash_plugin' failed to import: ValueError: method 'cnn' is registered twice"
    ):
        import_plugins(["clash_plugin"])


def test_unknown_names_point_to_the_guide():
    with pytest.raises(KeyError, match="docs/own-data.md"):
        get_method("nope")
    with pytest.raises(KeyError, match="docs/own-data.md"):
        build_dataset("nope", None)


def test_import_option_of_the_command_line(tmp_path, monkeypatch, capsys):
    """``rlattention fit --import my_plugin`` (a module in the working folder) trains the plugin's dataset and method
    end to end, with no environment variable; ``data info --import FILE.py`` finds its dataset; an ``--import`` that
    fails is one line naming the option and the module, before any run folder exists."""
    code_dir = tmp_path / "work"
    path = write_plugin(code_dir)
    data = write_npz(tmp_path / "data")
    monkeypatch.chdir(code_dir)
    runs = tmp_path / "runs"
    argv = ["fit", "--import", "my_plugin", "--data-dir", str(data), "data.name=my_npz", "method=smooth_cnn"]
    argv += ["model.channels=[4,8]", "model.hidden=8", *TRAIN, f"trainer.out_dir={runs}", "eval.viz_images=0"]
    assert main([*argv, "trainer.run_name=run"]) == 0
    assert json.loads((runs / "run" / "report.json").read_text())["method"] == "smooth_cnn"
    capsys.readouterr()
    assert main(["data", "info", "my_npz", "--import", str(path), "--data-dir", str(data)]) == 0
    assert "my_npz" in capsys.readouterr().out
    (code_dir / "broken_plugin.py").write_text("raise RuntimeError('this plugin is broken')\n")
    assert main(["fit", "--import", "broken_plugin", *argv[3:], "trainer.run_name=broken"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--import" in err[0] and "broken_plugin" in err[0] and "this plugin is broken" in err[0]
    assert not (runs / "broken").exists()
