"""Config files, overrides and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlattention.engine.config import ConfigError, load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_config_file_loads(path):
    cfg = load_config(path)
    assert cfg.method and cfg.model is not None


def test_there_are_config_files():
    assert any(p.stem == "ram_mnist" for p in CONFIGS) and any(p.stem == "ram_digits" for p in CONFIGS)


def test_overrides_are_typed():
    cfg = load_config(None, ["model.num_glimpses=8", "optim.lr=3e-4", "model.core=lstm", "model.std_final=0.05"])
    assert cfg.model.num_glimpses == 8 and cfg.optim.lr == pytest.approx(3e-4) and cfg.model.core == "lstm"
    assert cfg.model.std_final == pytest.approx(0.05)


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model.num_glimpse=8"])
    msg = str(e.value)
    assert "model.num_glimpse" in msg and "num_glimpses" in msg and "glimpse_size" in msg and "Did you mean" in msg


def test_unknown_section():
    with pytest.raises(ConfigError, match="Valid keys: method, data, model, optim, trainer, eval"):
        load_config(None, ["trainr.epochs=3"])


def test_wrong_type_names_key():
    with pytest.raises(ConfigError, match="model.num_glimpses"):
        load_config(None, ["model.num_glimpses=many"])


def test_unknown_method():
    with pytest.raises(ConfigError, match="registered methods: .*ram"):
        load_config(None, ["method=nope"])


def test_bad_yaml_files(tmp_path):
    bad_key = tmp_path / "a.yaml"
    bad_key.write_text("model:\n  glimpse_sise: 8\n")
    with pytest.raises(ConfigError, match=r"a\.yaml.*glimpse_sise.*glimpse_size"):
        load_config(bad_key)
    not_yaml = tmp_path / "b.yaml"
    not_yaml.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"b\.yaml: not valid YAML"):
        load_config(not_yaml)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    listy = tmp_path / "c.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(listy)


def test_override_syntax():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["model.num_glimpses"])
