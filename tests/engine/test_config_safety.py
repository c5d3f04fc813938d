"""Config safety: values are literal (no OmegaConf interpolation), every numeric setting is range-checked with a
one-line error naming the key, the value and the range, and a rejected config changes nothing (its file, the
output folder)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import re
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlattention.data.config import DataConfig
from rlattention.engine.config import (
    ConfigError,
    EvalConfig,
    OptimConfig,
    TrainerConfig,
    build_config,
    check_ranges,
    from_dict,
    load_config,
    parse_overrides,
    to_dict,
)
from rlattention.engine.ranges import MODEL_CHECKED_BY_METHOD, MODEL_RANGES, RANGES, Range
from rlattention.engine.registry import available_methods, get_method

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
SECTIONS = {"trainer": TrainerConfig, "optim": OptimConfig, "data": DataConfig, "eval": EvalConfig}
PROFILE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _numeric_kind(tp: typing.Any) -> str | None:
    """int / float / list / dict for a numeric field type (Optional stripped), None for any other type."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, type(int | None)) and len(args) == 1:
        tp, args = args[0], list(typing.get_args(args[0]))
    if tp in (int, float):
        return tp.__name__
    if typing.get_origin(tp) is list and args and args[0] in (int, float):
        return "list_" + args[0].__name__
    if typing.get_origin(tp) is dict and args and args[-1] in (int, float):
        return "dict_" + args[-1].__name__
    return None


def _numeric_fields(cls: type) -> dict[str, str]:
    hints = typing.get_type_hints(cls)
    out = {f.name: _numeric_kind(hints[f.name]) for f in dataclasses.fields(cls)}
    return {k: v for k, v in out.items() if v}


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# ------------------------------------------------------------------------------------------ shipped configs
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_loads_and_is_left_unchanged(path):
    before = _sha(path)
    cfg = load_config(path)
    assert cfg.method in available_methods()
    assert from_dict(to_dict(cfg)) == cfg  # a checkpoint's config loads back (ranges and all)
    assert _sha(path) == before


def _benchmark_overrides() -> list[str]:
    pattern = re.compile(r"""["']((?:trainer|model|optim|data|eval)\.[a-z_]+=[^"'{}]+)["']""")
    found = set()
    for script in sorted((REPO / "benchmarks").glob("*.py")):
        found.update(pattern.findall(script.read_text()))
    return sorted(found)


BENCH_OVERRIDES = _benchmark_overrides()
SHIPPED = {p.stem: to_dict(load_config(p)) for p in CONFIGS}


def test_benchmark_overrides_were_found():
    assert len(BENCH_OVERRIDES) > 30


@pytest.mark.parametrize("override", BENCH_OVERRIDES)
def test_every_benchmark_override_loads(override):
    """Each literal ``key=value`` override of benchmarks/*.py loads onto a shipped config that has the key (the
    first whose method takes that value: e.g. ``model.baseline`` is a bool of ram and a string of rarl)."""
    section, key = override.split("=", 1)[0].split(".")
    stems = [s for s, d in SHIPPED.items() if key in d[section]]
    assert stems, f"no shipped config has {section}.{key}"
    errors = []
    for stem in stems:
        try:
            load_config(REPO / "configs" / f"{stem}.yaml", [override])
            return
        except ConfigError as e:
            errors.append(str(e))
    pytest.fail(errors[0] + f" (and {len(errors) - 1} more configs)")


# ------------------------------------------------------------------------------------------ interpolation off
LITERALS = ["${oc.env:HOME}", "${trainer.seed}", "${model}", "${data.name}/x", "a${oc.env:HOME,${x}}b", "\\${x}"]


def test_yaml_file_values_are_literal(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(
        "method: ram\n"
        "trainer:\n  run_name: '${trainer.seed}'\n  out_dir: '${oc.env:HOME}/runs'\n"
        "data:\n  render_cache: '${oc.env:HOME}'\n  name: '${model}'\n"
        "model:\n  core: '${model.core}'\n"
    )
    before = _sha(path)
    cfg = load_config(path)
    assert cfg.trainer.run_name == "${trainer.seed}"
    assert cfg.trainer.out_dir == "${oc.env:HOME}/runs"
    assert cfg.data.render_cache == "${oc.env:HOME}"
    assert cfg.data.name == "${model}"
    assert cfg.model.core == "${model.core}"  # a self-reference: kept, no loop
    assert _sha(path) == before


@pytest.mark.parametrize("text", LITERALS)
def test_override_and_checkpoint_values_are_literal(text):
    cfg = load_config(None, [f"trainer.run_name={text}", f"data.render_cache={text}"])
    expected = parse_overrides([f"x={text}"])["x"]  # what YAML makes of the override's text
    assert cfg.trainer.run_name == expected and cfg.data.render_cache == expected
    again = from_dict(to_dict(cfg))  # a checkpoint's config: still literal, and stable across round trips
    assert again.trainer.run_name == expected and to_dict(again) == to_dict(cfg)
    cfg = from_dict({"method": "ram", "trainer": {"run_name": text}, "optim": {"lr_scale": {"core": 2.0}}})
    assert cfg.trainer.run_name == text


@given(st.text(alphabet="${}\\:.a ,'", max_size=16))
@PROFILE
def test_any_string_comes_out_verbatim(text):
    cfg = build_config({"trainer": {"run_name": text}, "data": {"render_cache": "${" + text + "}"}})
    assert cfg.trainer.run_name == text and cfg.data.render_cache == "${" + text + "}"
    parsed = parse_overrides([f"x={text}"])["x"]  # YAML may make a mapping or a number of it: strings only here
    if isinstance(parsed, str):
        assert load_config(None, [f"trainer.run_name={text}"]).trainer.run_name == parsed


def test_any_string_comes_out_verbatim_in_lists():
    cfg = build_config({"method": "scal", "model": {"attention_types": ["${model.attention}", "\\\\${x}"]}})
    assert cfg.model.attention_types == ["${model.attention}", "\\\\${x}"]


@pytest.mark.parametrize(
    "how",
    ["yaml", "override", "checkpoint"],
)
@pytest.mark.parametrize("text", ["${oc.env:HOME}", "${trainer.seed}", "${model}"])
def test_interpolation_in_a_numeric_field_is_a_clear_error(tmp_path, how, text):
    with pytest.raises(ConfigError) as e:
        if how == "yaml":
            path = tmp_path / "cfg.yaml"
            path.write_text(f"trainer:\n  epochs: '{text}'\n")
            load_config(path)
        elif how == "override":
            load_config(None, [f"trainer.epochs={text}"])
        else:
            from_dict({"method": "ram", "trainer": {"epochs": text}})
    msg = _one_line(e)
    assert "trainer.epochs" in msg and text in msg and "interpolation is off" in msg


def test_self_referencing_model_section_is_refused_at_once():
    with pytest.raises(ConfigError, match=r"'model' must be a mapping.*got '\$\{model\}'"):
        build_config({"method": "ram", "model": "${model}"})


def test_interpolation_is_an_explicit_opt_in_from_code_only():
    raw = {"trainer": {"seed": 7, "run_name": "run_${trainer.seed}"}}
    assert build_config(raw).trainer.run_name == "run_${trainer.seed}"
    assert build_config(raw, interpolation=True).trainer.run_name == "run_7"
    assert load_config(None, ["trainer.max_steps=${trainer.seed}"], interpolation=True).trainer.max_steps == 0
    with pytest.raises(ConfigError, match="(?i)recursive"):  # even then a loop is an error, not a hang
        build_config({"trainer": {"run_name": "${trainer.run_name}"}}, interpolation=True)
    with pytest.raises(ConfigError, match="unknown key 'interpolation'"):  # not a config key
        build_config({"interpolation": True})


# ------------------------------------------------------------------------------------------------- ranges
def test_every_numeric_field_of_the_shared_sections_has_a_range():
    for section, cls in SECTIONS.items():
        for name in _numeric_fields(cls):
            assert f"{section}.{name}" in RANGES, f"{section}.{name} has no range in RANGES"
    assert "trainer.devices" in RANGES  # typed Any: an int or "auto"
    for dotted in RANGES:
        section, name = dotted.split(".")
        assert name in {f.name for f in dataclasses.fields(SECTIONS[section])}, dotted


@pytest.mark.parametrize("method", available_methods())
def test_every_numeric_model_field_has_a_range_or_a_method_check(method):
    fields = _numeric_fields(get_method(method).Config)
    table, checked = MODEL_RANGES[method], set(MODEL_CHECKED_BY_METHOD[method])
    assert not set(table) & checked
    assert set(fields) == set(table) | checked, f"{method}: {set(fields) ^ (set(table) | checked)}"


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("trainer.epochs=-3", "trainer.epochs=-3 is out of range: it must be >= 1"),
        ("trainer.batch_size=0", "trainer.batch_size=0 is out of range: it must be >= 1"),
        ("trainer.log_every=0", "trainer.log_every=0 is out of range: it must be >= 1"),
        ("trainer.val_every=0", "trainer.val_every=0 is out of range: it must be >= 1"),
        ("trainer.devices=0", "trainer.devices=0 is out of range: it must be >= 1 or -1"),
        ("trainer.seed=-1", "trainer.seed=-1 is out of range: it must be in [0, 4294967295]"),
        ("trainer.collective_timeout_minutes=0", "trainer.collective_timeout_minutes=0.0 is out of range"),
        ("optim.lr=-1e-3", "optim.lr=-0.001 is out of range: it must be >= 0"),
        ("optim.lr=.nan", "optim.lr=nan is out of range: it must be >= 0"),
        ("optim.weight_decay=.inf", "optim.weight_decay=inf is out of range"),
        ("optim.momentum=1.5", "optim.momentum=1.5 is out of range: it must be in [0, 1]"),
        ("optim.step_gamma=0", "optim.step_gamma=0.0 is out of range: it must be in (0, 1]"),
        ("optim.lr_scale={core: -1}", "optim.lr_scale={'core': -1.0} is out of range: every value must be >= 0"),
        ("data.image_size=0", "data.image_size=0 is out of range: it must be >= 1"),
        ("data.reid_size=[64, 0]", "data.reid_size=[64, 0] is out of range: every element must be >= 1, got 0"),
        ("data.test_fraction=1.0", "data.test_fraction=1.0 is out of range: it must be in (0, 1)"),
        ("eval.mc_samples=-1", "eval.mc_samples=-1 is out of range: it must be >= 0"),
        ("model.hidden_size=0", "model.hidden_size=0 is out of range: it must be >= 1"),
        ("model.gamma=1.01", "model.gamma=1.01 is out of range: it must be in [0, 1]"),
        ("model.std=-0.1", "model.std=-0.1 is out of range: it must be > 0"),
    ],
)
def test_out_of_range_is_one_line_naming_key_value_and_range(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    msg = _one_line(e)
    assert msg.startswith("defaults: ") and fragment in msg, msg


def _base(method: str) -> str | None:
    return next((p.stem for p in CONFIGS if SHIPPED[p.stem]["method"] == method), None)


def _case(section: str, cls: type, method: str) -> list[tuple[str, str, str, Range]]:
    kinds = _numeric_fields(cls)
    table = {k.split(".")[1]: r for k, r in RANGES.items() if k.startswith(section + ".")}
    if section == "model":
        table = MODEL_RANGES[method]
    return [(method, f"{section}.{k}", kinds.get(k, "int"), r) for k, r in table.items()]


CASES = [c for s, cls in SECTIONS.items() for c in _case(s, cls, "ram")] + [
    c for m in available_methods() for c in _case("model", get_method(m).Config, m)
]

NUMBERS = st.one_of(
    st.integers(-5, 300),
    st.floats(-2.0, 2.0, allow_nan=False),
    st.sampled_from([0, 1, -1, 0.0, 1.0, 2**32, 180.0, 181.0, math.nan, math.inf, -math.inf]),
)


@functools.cache
def _default(method: str):
    return build_config({"method": method})


@pytest.mark.parametrize("method, key, kind, allowed", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
@given(number=NUMBERS)
@settings(max_examples=40, deadline=None)
def test_a_value_passes_iff_it_is_in_range(method, key, kind, allowed, number):
    """check_ranges (the last step of build_config) on a config with one value changed."""
    if kind.endswith("int") or key == "trainer.devices":
        if not (isinstance(number, int) or (math.isfinite(number) and float(number).is_integer())):
            return
        number = int(number)
    value: typing.Any = [number] if kind.startswith("list") else {"core": number} if kind.startswith("dict") else number
    section, name = key.split(".")
    cfg = _default(method)
    cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: value})})
    if number in allowed:
        check_ranges(cfg, "test")
    else:
        with pytest.raises(ConfigError) as e:
            check_ranges(cfg, "test")
        msg = _one_line(e)
        assert msg.startswith(f"test: {key}={value!r} is out of range: ") and msg.count(str(allowed)) == 1, msg


@pytest.mark.parametrize("override", ["trainer.epochs=0", "model.hidden_size=0", "data.reid_size=[0, 1]"])
def test_checkpoint_configs_are_range_checked_too(override):
    key, value = override.split("=")
    section, name = key.split(".")
    raw = to_dict(load_config(None))
    raw[section][name] = parse_overrides([override])[key]
    with pytest.raises(ConfigError, match=re.escape(f"checkpoint: {key}=")):
        from_dict(raw)


# ------------------------------------------------------------------------------------ nothing is changed
def test_a_rejected_config_creates_no_run_folder(tmp_path, capsys):
    from rlattention.cli import main

    out = tmp_path / "out"
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"method: ram\ntrainer:\n  epochs: -1\n  out_dir: '{out}'\n  run_name: bad\n")
    before = _sha(bad)
    for argv in (
        ["fit", "--config", str(bad)],
        ["fit", "--config", str(CONFIGS[0]), f"trainer.out_dir={out}", "trainer.log_every=0"],
        ["fit", f"trainer.out_dir={out}", "trainer.run_name=${oc.env:HOME}", "trainer.batch_size=${trainer.seed}"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err and ("out of range" in err or "interpolation is off" in err)
        assert not out.exists(), sorted(out.rglob("*"))
    assert _sha(bad) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]
