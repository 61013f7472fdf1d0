"""Hostile input (issue 16, items 6 and 8): every number of the catalog records is
bounded, extreme but valid numbers give finite, physical results, and each bad
input that used to end in a traceback or in confident nonsense is one line with
exit status 2."""

from __future__ import annotations

import json
import math
import tomllib
import types
import typing
from pathlib import Path

import annotated_types as at
import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from paraspace.explorer.cli import main
from paraspace.spaces import schema, topology
from paraspace.spaces.catalog import CATALOG_DIR, load_hardware, load_model, read_toml, space_from_raw
from paraspace.spaces.encode import MAX_COMBINATIONS, Encoder
from paraspace.spaces.errors import CatalogError

H100 = CATALOG_DIR / "hardware" / "h100-sxm5-80gb.toml"
LLAMA8B = CATALOG_DIR / "models" / "llama3-8b.toml"


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def error_of(load, path: Path) -> str:
    with pytest.raises(CatalogError) as info:
        load(str(path))
    return str(info.value)


def with_line(tmp_path: Path, source: Path, old: str, new: str) -> Path:
    """``source`` with one exact line replaced, as tmp_path/source.name."""
    text = source.read_text()
    assert text.count(old) == 1, old
    path = tmp_path / source.name
    path.write_text(text.replace(old, new))
    return path


# --------------------------------------------------------------------------- every number bounded


def _numbers(annotation, constraints=()):
    """(type, constraints) of every int and float an annotation holds (inside tuples, dicts, unions)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        found = [m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e])]
        yield from _numbers(base, (*constraints, *found))
    elif annotation in (int, float):
        yield annotation, constraints
    elif origin is typing.Literal or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return
    elif origin in (tuple, dict, typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if arg is not Ellipsis:
                yield from _numbers(arg, constraints)


RECORDS = [cls for module in (schema, topology) for cls in vars(module).values()
           if isinstance(cls, type) and issubclass(cls, schema.Record) and cls.__module__ == module.__name__
           and cls is not schema.Record]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_every_number_of_every_record_has_finite_bounds(record):
    """Each int and float field (and each number inside a field's tuples and dicts)
    carries a lower and a finite upper bound; floats are finite by the Record config."""
    assert record.model_config["allow_inf_nan"] is False
    checked = 0
    for name, field in record.model_fields.items():
        for kind, constraints in _numbers(typing.Annotated[field.annotation, *field.metadata]
                                          if field.metadata else field.annotation):
            lows = [c for c in constraints if isinstance(c, at.Ge | at.Gt)]
            highs = [c for c in constraints if isinstance(c, at.Le | at.Lt)]
            assert lows, f"{record.__name__}.{name}: no lower bound"
            assert highs and all(math.isfinite(getattr(h, "le", getattr(h, "lt", None))) for h in highs), \
                f"{record.__name__}.{name}: no finite upper bound"
            checked += 1
    if record.__name__ in ("Model", "Device", "SpaceSpec", "Dimensions", "LinkTier"):
        assert checked >= 5, record.__name__


def test_the_bounds_keep_strategy_products_in_int64():
    """tp * pp * cp (each <= MAX_PARALLEL) times dp (<= MAX_COUNT): the encoder's
    device-count rule in int64 cannot wrap around."""
    assert schema.MAX_PARALLEL**3 * schema.MAX_COUNT < 2**63
    assert schema.MAX_COUNT < 2**31  # devices and strategy values are stored as int32


# --------------------------------------------------------------------------- item 6: extreme numbers


def test_layers_at_int64_max(tmp_path):
    """Used to rank first with memory -1 and MFU 1e22."""
    path = with_line(tmp_path, LLAMA8B, "layers = 32", "layers = 9223372036854775807")
    assert error_of(load_model, path) == f"{path}: layers = 9223372036854775807: expected less than or equal to 100000"


def test_hbm_capacity_inf(tmp_path):
    """Used to make every candidate fit."""
    path = with_line(tmp_path, H100, "hbm_capacity_GiB = 80.0", "hbm_capacity_GiB = inf")
    assert error_of(load_hardware, path) == f"{path}: device.hbm_capacity_GiB = inf: expected a finite number"


def test_denormal_bandwidth(tmp_path):
    """Used to give a NaN MFU on a row that fits."""
    path = with_line(tmp_path, H100, "bandwidth_GB_per_s = 450.0", "bandwidth_GB_per_s = 5e-324")
    assert error_of(load_hardware, path) == \
        f"{path}: links.0.bandwidth_GB_per_s = 5e-324: expected greater than or equal to 0.001"


@pytest.mark.parametrize(("old", "new", "field", "shown", "expected"), [
    ("memory_efficiency = 0.80", "memory_efficiency = nan", "device.memory_efficiency", "nan", "a finite number"),
    ("memory_efficiency = 0.80", "memory_efficiency = 1e-300", "device.memory_efficiency", "1e-300",
     "greater than or equal to 0.000001"),
    ("bf16 = 989.4", "bf16 = 1e300", "device.peak_TFLOP_per_s.bf16", "1e+300", "less than or equal to 1000000000"),
    ("latency_us = 3.0", "latency_us = -inf", "links.0.latency_us", "-inf", "a finite number"),
    ("launch_overhead_us = 4.0", "launch_overhead_us = 1e7", "device.launch_overhead_us", "10000000.0",
     "less than or equal to 1000000"),
    ("host_capacity_GiB = 256.0", "host_capacity_GiB = 1e20", "device.host_capacity_GiB", "1e+20",
     "less than or equal to 1048576"),
    ("compute_units = 132", "compute_units = 2147483648", "device.compute_units", "2147483648",
     "less than or equal to 16777216"),
    ("gemm_tiles = [[128, 128]", "gemm_tiles = [[128, 4294967296]", "device.gemm_tiles.0.1", "4294967296",
     "less than or equal to 1048576"),
    ("block = 0.19 }", "block = -0.19 }", "device.gemm_scaling_overhead.block", "-0.19",
     "greater than or equal to 0"),
])
def test_hardware_numbers_out_of_bounds(tmp_path, old, new, field, shown, expected):
    path = with_line(tmp_path, H100, old, new)
    assert error_of(load_hardware, path) == f"{path}: {field} = {shown}: expected {expected}"


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("hidden", 2**21, "less than or equal to 1048576"),
    ("heads", 2**63, "less than or equal to 16777216"),
    ("vocab", -1, "greater than 0"),
    ("sliding_window", 2**31, "less than or equal to 16777216"),
    ("mtp_depth", 10**6, "less than or equal to 100000"),
])
def test_model_numbers_out_of_bounds(tmp_path, key, value, expected):
    data = {**tomllib.loads(LLAMA8B.read_text()), key: value}
    path = tmp_path / "model.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in data.items()))
    assert error_of(load_model, path) == f"{path}: {key} = {value}: expected {expected}"


SPACE = {"name": "user-space", "description": "a user space", "model": "llama3-8b", "hardware": "h100-sxm5-80gb",
         "devices": 8, "global_batch": 16, "seq_len": 4096}


def space_message(tmp_path: Path, **changes) -> str:
    with pytest.raises(CatalogError) as info:
        Encoder(space_from_raw({**SPACE, **changes}, "spaces/user.toml", tmp_path))
    return str(info.value)


@pytest.mark.parametrize(("changes", "message"), [
    ({"devices": 2**31}, "devices = 2147483648: expected less than or equal to 16777216"),
    ({"seq_len": 2**63 - 1}, "seq_len = 9223372036854775807: expected less than or equal to 16777216"),
    ({"global_batch": 0}, "global_batch = 0: expected greater than 0"),
    ({"moe_imbalance": math.inf}, "moe_imbalance = inf: expected a finite number"),
    ({"moe_imbalance": 1e6}, "moe_imbalance = 1000000.0: expected less than or equal to 4096"),
    ({"dimensions": {"tp": [1, 8192]}}, "dimensions.tp.1 = 8192: expected less than or equal to 4096"),
    ({"dimensions": {"dp": [2**40]}}, "dimensions.dp.0 = 1099511627776: expected less than or equal to 16777216"),
    ({"dimensions": {"recompute_layers": [0, 10**9]}},
     "dimensions.recompute_layers.1 = 1000000000: expected less than or equal to 100000"),
    ({"fp8_scaling": "blockwise"}, "fp8_scaling = 'blockwise': expected 'tensor', 'row' or 'block'"),
])
def test_space_numbers_out_of_bounds(tmp_path, changes, message):
    assert space_message(tmp_path, **changes) == f"spaces/user.toml: {message}"


def test_combination_count_above_int64(tmp_path):
    """Used to wrap around in an int64 product; counted in Python ints and refused."""
    values = list(range(1, 4097))
    dims = {"tp": values, "pp": values, "cp": values, "vpp": values, "ep": values, "micro_batch": list(range(1, 17))}
    n = 4096**5 * 16
    assert n > MAX_COMBINATIONS
    shape = " x ".join(["1", "4096", "4096", "1", "4096", "4096", "16"] + ["1"] * 10 + ["4096"] + ["1"] * 4)
    assert space_message(tmp_path, dimensions=dims) == (
        f"spaces/user.toml: dimensions = {n}: expected at most 9,223,372,036,854,775,807 combinations (row ids are "
        f"int64): fewer values per dimension (they have {shape})")


def test_extreme_but_valid_numbers_give_finite_physical_rows(tmp_path):
    """At the bounds (the deepest model, the slowest link) a row that fits is
    simulated and finite: positive step time and memory, MFU in (0, 1]."""
    model = tmp_path / "deep.toml"
    model.write_text(f'name = "deep"\ndescription = "the deepest model the schema allows, narrow"\n'
                     f"layers = {schema.MAX_LAYERS}\nhidden = 64\nheads = 2\nkv_heads = 2\nffn = 128\nvocab = 32000\n"
                     "glu = true\n")
    hw = with_line(tmp_path, H100, "bandwidth_GB_per_s = 50.0", f"bandwidth_GB_per_s = {schema.MIN_RATE}")
    result = invoke("eval", "--model", str(model), "--hardware", str(hw), "--devices", "16", "--global-batch", "2",
                    "--seq-len", "512", "--set", "tp=2", "--set", "pp=4", "--set", "recompute=full", "--json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)
    assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
    assert row["feasible"] and row["simulated"]
    assert row["step_time_s"] > 0 and row["mem_peak_bytes"] > 0 and 0 < row["mfu"] <= 1


def eval_tiny_on_h100(tmp_path, changes: tuple[tuple[str, str], ...], seq_len: int) -> dict:
    """``paraspace eval --json`` of a 1-wide model (one layer, head, FFN column and
    vocabulary entry) on the H100 profile with ``changes`` made to its text."""
    model = tmp_path / "tiny.toml"
    model.write_text('name = "tiny"\ndescription = "one of everything"\nlayers = 1\nhidden = 1\nheads = 1\n'
                     "kv_heads = 1\nffn = 1\nvocab = 1\nglu = true\n")
    text = H100.read_text()
    for old, new in changes:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    hw = tmp_path / "changed.toml"
    hw.write_text(text)
    result = invoke("eval", "--model", str(model), "--hardware", str(hw), "--devices", "1", "--global-batch", "1",
                    "--seq-len", str(seq_len), "--json")
    return json.loads(result.stdout)


def test_a_step_beyond_the_event_tier_range_is_not_simulated(tmp_path):
    """Inside every bound, a 1-wide model over 2**24-token sequences on the slowest
    device takes 2e12 s analytically; simulated, its nanoseconds overflow int64 and
    the row claims a step of 4 microseconds, so a sweep would rank it first (found by
    test_fuzz_extremes_inside_the_bounds, there as 408 s with an MFU of 4139)."""
    row = eval_tiny_on_h100(tmp_path, (("bf16 = 989.4", "bf16 = 0.001"),
                                       ("gemm_max_efficiency = 0.65", "gemm_max_efficiency = 1e-6"),
                                       ("attention_efficiency = 0.36", "attention_efficiency = 1e-6")),
                            schema.MAX_COUNT)
    assert row["step_time_analytic_s"] > 2**63 / 1e9
    assert row["step_time_s"] == row["step_time_analytic_s"] and 0 < row["mfu"] <= 1


def test_a_step_under_the_event_tier_resolution_is_not_simulated(tmp_path):
    """Inside every bound, a 1-wide model on a device of 1e9 TFLOP/s and 1e9 GB/s with no
    launch overhead takes 0.7 ns analytically; the event tier times tasks in whole
    nanoseconds, so simulated every task rounded to 0 and the row claimed a 0 s step
    and infinite throughput and MFU (found by test_fuzz_extremes_inside_the_bounds).
    It keeps its closed form (``explorer.evaluate.SIM_FLOOR_S``)."""
    row = eval_tiny_on_h100(tmp_path, (("bf16 = 989.4", "bf16 = 1e9"),
                                       ("hbm_bandwidth_GB_per_s = 3350.0", "hbm_bandwidth_GB_per_s = 1e9"),
                                       ("launch_overhead_us = 4.0", "launch_overhead_us = 0.0")), 1)
    assert 0 < row["step_time_analytic_s"] < 1e-6
    assert row["step_time_s"] == row["step_time_analytic_s"] and row["simulated"] is False
    assert math.isfinite(row["tokens_per_s_per_gpu"]) and 0 < row["mfu"] <= 1


# --------------------------------------------------------------------------- item 8: files


def test_invalid_utf8_names_the_file_and_byte(tmp_path):
    path = tmp_path / "model.toml"
    path.write_bytes(b'name = "x"\ndescription = "caf\xe9"\n')
    assert error_of(load_model, path) == f"{path}: (file) = 'model.toml': expected UTF-8 text (byte 29 on line 2 is b'\\xe9')"


def test_invalid_utf8_on_the_command_line(tmp_path):
    path = tmp_path / "hw.toml"
    path.write_bytes(b"\xff\xfe" + H100.read_bytes())
    result = CliRunner().invoke(main, ["eval", "--model", "llama3-8b", "--hardware", str(path), "--devices", "8",
                                       "--global-batch", "8", "--seq-len", "4096"])
    assert result.exit_code == 2
    assert result.output == f"Error: {path}: (file) = 'hw.toml': expected UTF-8 text (byte 0 on line 1 is b'\\xff')\n"


def test_unreadable_file(tmp_path, monkeypatch):
    path = tmp_path / "x.toml"
    path.write_text('name = "x"\n')

    def refuse(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(CatalogError) as info:
        read_toml(path)
    assert str(info.value) == f"{path}: (file) = 'x.toml': expected a readable file (Permission denied)"


def test_shipped_catalog_is_utf8_toml():
    for path in sorted(CATALOG_DIR.rglob("*.toml")):
        assert read_toml(path) == tomllib.loads(path.read_text(encoding="utf-8")), path


# --------------------------------------------------------------------------- item 8: command-line numbers


@pytest.mark.parametrize(("args", "message"), [
    (["eval", "--devices", "2147483648"], "Invalid value for '--devices': 2147483648 is not in the range 1<=x<=16777216."),
    (["sweep", "--devices", "9223372036854775808"],
     "Invalid value for '--devices': 9223372036854775808 is not in the range 1<=x<=16777216."),
    (["eval", "--seq-len", "0"], "Invalid value for '--seq-len': 0 is not in the range 1<=x<=16777216."),
    (["eval", "--global-batch", "-1"], "Invalid value for '--global-batch': -1 is not in the range 1<=x<=16777216."),
    (["topology", "br166-ocs", "--mib", "nan"], "Invalid value for '--mib': nan is not in the range 0<=x<=1073741824."),
    (["topology", "br166-ocs", "--mib", "inf"], "Invalid value for '--mib': inf is not in the range 0<=x<=1073741824."),
    (["topology", "br166-ocs", "--src", "16777216"],
     "Invalid value for '--src': 16777216 is not in the range 0<=x<=16777215."),
    (["top", "x.parquet", "--max-mem", "nan"], "Invalid value for '--max-mem': nan is not in the range 0<=x<=1048576."),
    (["top", "x.parquet", "--max-ttft", "nan"], "Invalid value for '--max-ttft': nan is not in the range 0<x<=1000000.0."),
    (["top", "x.parquet", "-n", "4294967296"], "Invalid value for '-n': 4294967296 is not in the range 1<=x<=4294967295."),
    (["sweep", "-n", "9223372036854775808"],
     "Invalid value for '-n' / '--top': 9223372036854775808 is not in the range 0<=x<=4294967295."),
    (["compare", "x.parquet", "--ids", "1", "--ids", "-1"],
     "Invalid value for '--ids': -1 is not in the range 0<=x<=9223372036854775807."),
    (["sweep", "--chunk-rows", "99999999999"],
     "Invalid value for '--chunk-rows': 99999999999 is not in the range 1<=x<=16777216."),
    (["study", "--timeout", "nan"], "Invalid value for '--timeout': nan is not in the range 0<=x<=31536000.0."),
    (["study", "--trials", "2147483648"], "Invalid value for '--trials': 2147483648 is not in the range 1<=x<=16777216."),
])
def test_command_line_numbers_out_of_range(args, message):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == f"Error: {message}"


def test_combination_count_above_int64_on_the_command_line(tmp_path):
    values = ", ".join(str(v) for v in range(1, 4097))
    path = tmp_path / "huge.toml"
    path.write_text('name = "huge"\ndescription = "too many combinations"\nmodel = "llama3-8b"\n'
                    'hardware = "h100-sxm5-80gb"\ndevices = 8\nglobal_batch = 16\nseq_len = 4096\n[dimensions]\n'
                    + "".join(f"{k} = [{values}]\n" for k in ("tp", "pp", "cp", "vpp", "ep"))
                    + "micro_batch = [" + ", ".join(str(v) for v in range(1, 17)) + "]\n")
    result = CliRunner().invoke(main, ["sweep", str(path), "--dry-run"])
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: {path}: dimensions = {4096**5 * 16}: expected at most "
                                    "9,223,372,036,854,775,807 combinations")
