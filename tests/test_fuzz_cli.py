"""Hostile input through the command line (issue 16): random bad inputs of each
class reach ``paraspace`` as a user would give them, and every one ends in
exit status 0 or 2 with a one-line message, never a Python traceback.

Classes: TOML model, hardware and space files with one value mutated (huge,
negative, zero, inf, nan, denormal, wrong type, key removed, unknown key, bytes
that are not UTF-8, a truncated file); numbers on the command line; training
CSVs for ``validate`` with garbage cells. Where a run succeeds, its numbers must
be finite and physical (no "confident nonsense"). ``FUZZ_EXAMPLES`` raises the
number of examples per class (the default keeps each class to a few seconds).
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraspace.explorer.cli import main
from paraspace.spaces.catalog import CATALOG_DIR

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

MODEL_BASE = tomllib.loads((CATALOG_DIR / "models" / "llama3-8b.toml").read_text())
HARDWARE_BASE = tomllib.loads((CATALOG_DIR / "hardware" / "h100-sxm5-80gb.toml").read_text())
#: a space that sweeps in well under a second (32 combinations)
SPACE_BASE: dict[str, Any] = {
    "name": "fuzz", "description": "a small space to mutate", "model": "llama3-8b", "hardware": "h100-sxm5-80gb",
    "devices": 8, "global_batch": 16, "seq_len": 2048, "dtype": "bf16",
    "dimensions": {"tp": [1, 2, 4, 8], "pp": [1, 2], "micro_batch": [1, 2], "recompute": ["none", "full"]},
}
#: one configuration of Llama 3 8B on 8 H100 that fits (tp=8, dp=1)
EVAL_ARGS = ["--devices", "8", "--global-batch", "8", "--seq-len", "4096", "--set", "tp=8", "--json"]

TRAINING_CSV = Path(__file__).resolve().parents[1] / "shared" / "validation" / "training.csv"
if not TRAINING_CSV.is_file():
    TRAINING_CSV = Path("/work/shared/validation/training.csv")


# --------------------------------------------------------------------------- the contract


def run(args: list[str]) -> Result:
    return CliRunner().invoke(main, args, catch_exceptions=True)


def check_clean(result: Result, args: list[str]) -> None:
    """Exit 0 or 2, no uncaught exception, no traceback in the output."""
    shown = f"paraspace {' '.join(args)}\n{result.output[-2000:]}"
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), f"{shown}\nuncaught {type(exc).__name__}: {exc}"
    assert result.exit_code in (0, 2), f"{shown}\nexit status {result.exit_code}"
    assert "Traceback" not in result.output, shown
    if result.exit_code == 2:
        assert result.output.strip(), f"{shown}\nexit 2 without a message"


def check_json_row(output: str) -> None:
    """An eval row is finite and physical: positive step time, memory and throughput, MFU in (0, 1]."""
    row = json.loads(output.strip().splitlines()[-1])
    for key, value in row.items():
        if isinstance(value, float):
            assert math.isfinite(value), f"{key} = {value}"
    assert row["step_time_s"] > 0 and row["mem_peak_bytes"] > 0 and row["tokens_per_s_per_gpu"] > 0, row
    assert 0 < row["mfu"] <= 1, f"mfu = {row['mfu']}"


def check_parquet(path: Path) -> None:
    """Every float of a sweep's rows is finite; feasible rows have positive step time and memory."""
    frame = pl.read_parquet(path)
    floats = [c for c, t in frame.schema.items() if t.is_float()]
    bad = frame.select(pl.any_horizontal([~pl.col(c).is_finite() for c in floats]).alias("bad"))["bad"]
    assert not bad.any(), frame.filter(bad).head(3)
    fit = frame.filter(pl.col("feasible"))
    assert (fit["step_time_s"] > 0).all() and (fit["mem_peak_bytes"] > 0).all()
    assert (fit["mfu"] > 0).all() and (fit["mfu"] <= 1).all(), fit["mfu"].max()


# --------------------------------------------------------------------------- hostile values


HOSTILE_INTS = [0, -1, -(2**31), 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 2**63, 2**64, 10**30]
HOSTILE_FLOATS = [math.inf, -math.inf, math.nan, 5e-324, -5e-324, 1e-300, 1e308, -0.0, 0.5, 1e30]

hostile_values = st.one_of(
    st.sampled_from(HOSTILE_INTS),
    st.sampled_from(HOSTILE_FLOATS),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=8),
    st.booleans(),
    st.lists(st.integers(-(2**65), 2**65), max_size=3),
    st.just({"x": 1}),
)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def toml_text(data: dict[str, Any]) -> str:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in data.items())


def leaf_paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Paths (keys and list indices) to every value, tables and arrays included."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += leaf_paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += leaf_paths(v, (*prefix, i))
    return out


def mutated(base: dict[str, Any], path: tuple, op: str, value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(base, allow_nan=True))  # a deep copy
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == "replace":
        parent[last] = value
    elif op == "remove":
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
    elif op == "add_key":
        target = parent[last] if isinstance(parent[last], dict) else data
        target["unknown_key"] = value
    return data


@st.composite
def hostile_toml(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    """``base`` with one value replaced, removed or joined by an unknown key, or
    its bytes corrupted (not UTF-8, truncated)."""
    path = draw(st.sampled_from(leaf_paths(base)))
    op = draw(st.sampled_from(["replace", "replace", "replace", "remove", "add_key", "bad_utf8", "truncate"]))
    if op in ("bad_utf8", "truncate"):
        text = toml_text(base).encode()
        cut = draw(st.integers(0, len(text)))
        if op == "truncate":
            return text[:cut]
        junk = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\x80", b"\xc3\x28", b"\xed\xa0\x80", b"\x00"]))
        return text[:cut] + junk + text[cut:]
    return toml_text(mutated(base, path, op, draw(hostile_values))).encode()


# --------------------------------------------------------------------------- TOML files


def run_model_file(folder: Path, content: bytes) -> tuple[list[str], Result]:
    path = folder / "model.toml"
    path.write_bytes(content)
    args = ["eval", "--model", str(path), "--hardware", "h100-sxm5-80gb", *EVAL_ARGS]
    return args, run(args)


def run_hardware_file(folder: Path, content: bytes) -> tuple[list[str], Result]:
    path = folder / "hardware.toml"
    path.write_bytes(content)
    args = ["eval", "--model", "llama3-8b", "--hardware", str(path), *EVAL_ARGS]
    return args, run(args)


def run_space_file(folder: Path, content: bytes) -> tuple[list[str], Result]:
    path = folder / "space.toml"
    path.write_bytes(content)
    out = folder / "space.parquet"
    out.unlink(missing_ok=True)
    args = ["sweep", str(path), "--out", str(out), "-n", "0", "--no-progress"]
    return args, run(args)


def check_toml_case(case: Callable[[Path, bytes], tuple[list[str], Result]], folder: Path, content: bytes) -> None:
    args, result = case(folder, content)
    check_clean(result, args)
    if result.exit_code == 0 and args[0] == "eval":
        check_json_row(result.output)
    if result.exit_code == 0 and args[0] == "sweep":
        check_parquet(folder / "space.parquet")


@FUZZ
@given(content=hostile_toml(MODEL_BASE))
def test_fuzz_model_toml(tmp_path_factory, content):
    check_toml_case(run_model_file, tmp_path_factory.mktemp("model"), content)


@FUZZ
@given(content=hostile_toml(HARDWARE_BASE))
def test_fuzz_hardware_toml(tmp_path_factory, content):
    check_toml_case(run_hardware_file, tmp_path_factory.mktemp("hardware"), content)


@FUZZ
@given(content=hostile_toml(SPACE_BASE))
def test_fuzz_space_toml(tmp_path_factory, content):
    check_toml_case(run_space_file, tmp_path_factory.mktemp("space"), content)


# --------------------------------------------------------------------------- command-line numbers

number_texts = st.one_of(
    st.sampled_from([str(v) for v in HOSTILE_INTS] + ["nan", "inf", "-inf", "1e400", "5e-324", "-0", "1.5", "x", ""]),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)

#: (command before the number, option, command after it); {out} is a fresh file, {results} a swept result
NUMBER_OPTIONS: list[tuple[list[str], str, list[str]]] = [
    (["eval", "--space", "llama3-8b-h100-64", "--set", "tp=8"], "--devices", ["--json"]),
    (["eval", "--space", "llama3-8b-h100-64", "--set", "tp=8"], "--global-batch", ["--json"]),
    (["eval", "--space", "llama3-8b-h100-64", "--set", "tp=8"], "--seq-len", ["--json"]),
    (["sweep", "{space}", "--out", "{out}", "-n", "0", "--no-progress", "--no-simulate"], "--devices", []),
    (["sweep", "{space}", "--out", "{out}", "--no-progress", "--no-simulate"], "-n", []),
    (["sweep", "{space}", "--out", "{out}", "-n", "0", "--no-progress", "--no-simulate"], "--chunk-rows", []),
    (["sweep", "{space}", "--out", "{out}", "-n", "0", "--no-progress"], "--max-tasks", []),
    (["sweep", "{space}", "--out", "{out}", "-n", "0", "--no-progress"], "--simulate-top", []),
    (["top", "{results}"], "-n", []),
    (["top", "{results}"], "--max-mem", []),
    (["top", "{results}"], "--max-tpot", []),
    (["report", "{results}", "--out", "{out}"], "-n", []),
    (["compare", "{results}", "--ids", "0"], "--ids", []),
    (["topology", "br166-ocs"], "--src", []),
    (["topology", "br166-ocs"], "--mib", []),
]


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> dict[str, str]:
    """A small space file and its swept result for the commands that read one."""
    folder = tmp_path_factory.mktemp("swept")
    space = folder / "space.toml"
    space.write_text(toml_text(SPACE_BASE))
    results = folder / "space.parquet"
    result = run(["sweep", str(space), "--out", str(results), "-n", "0", "--no-progress"])
    assert result.exit_code == 0, result.output
    return {"space": str(space), "results": str(results), "folder": str(folder)}


def run_number_option(swept: dict[str, str], case: int, text: str) -> tuple[list[str], Result]:
    before, option, after = NUMBER_OPTIONS[case]
    out = Path(swept["folder"]) / "out.file"
    out.unlink(missing_ok=True)
    fill = {"space": swept["space"], "results": swept["results"], "out": str(out)}
    args = [a.format(**fill) for a in before] + [f"{option}={text}" if option.startswith("--") else option, *(
        [] if option.startswith("--") else [text])] + after
    return args, run(args)


@FUZZ
@given(case=st.integers(0, len(NUMBER_OPTIONS) - 1), text=number_texts)
def test_fuzz_command_line_numbers(swept, case, text):
    args, result = run_number_option(swept, case, text)
    check_clean(result, args)
    if result.exit_code == 0 and args[0] == "eval":
        check_json_row(result.output)


# --------------------------------------------------------------------------- validate CSVs


CSV_LINES = TRAINING_CSV.read_bytes().splitlines()
CSV_HEADER, CSV_ROW = CSV_LINES[0], CSV_LINES[1]
GARBAGE_CELLS = [b"", b"0", b"-1", b"NaN", b"nan", b"inf", b"-inf", b"1e400", b"99999999999999999999", b"2147483648",
                 b"9223372036854775808", b"\xff\xfe", b"\x00", b"7", b"true", b"x", b'"', b"1.5"]


@st.composite
def hostile_csv(draw: st.DrawFn) -> bytes:
    """A training CSV: its header and 1-3 copies of a real row with some cells
    replaced by garbage, or a whole-file corruption (empty, binary, header only)."""
    kind = draw(st.sampled_from(["cells", "cells", "cells", "empty", "binary", "header-only", "short-row"]))
    if kind == "empty":
        return b""
    if kind == "binary":
        return draw(st.binary(min_size=1, max_size=64))
    if kind == "header-only":
        return CSV_HEADER + b"\n"
    import csv
    import io

    cells = next(csv.reader(io.StringIO(CSV_ROW.decode())))
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        row = [c.encode() for c in cells]
        for i in draw(st.lists(st.integers(0, len(row) - 1), min_size=1, max_size=4)):
            row[i] = draw(st.one_of(st.sampled_from(GARBAGE_CELLS), st.binary(max_size=6).filter(lambda b: b"," not in b
                                                                                               and b"\n" not in b)))
        if kind == "short-row":
            row = row[: draw(st.integers(0, len(row) - 1))]
        rows.append(b",".join(b'"' + c.replace(b'"', b'""') + b'"' if b"," in c or b'"' in c else c for c in row))
    return CSV_HEADER + b"\n" + b"\n".join(rows) + b"\n"


def run_validate_file(folder: Path, content: bytes, as_json: bool) -> tuple[list[str], Result]:
    path = folder / "training.csv"
    path.write_bytes(content)
    args = ["validate", str(path), *(["--json"] if as_json else [])]
    return args, run(args)


@FUZZ
@given(content=hostile_csv(), as_json=st.booleans())
def test_fuzz_validate_csv(tmp_path_factory, content, as_json):
    args, result = run_validate_file(tmp_path_factory.mktemp("validate"), content, as_json)
    check_clean(result, args)
    if result.exit_code == 0 and as_json:
        json.loads(result.stdout, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))


# --------------------------------------------------------------------------- valid extremes


def log_uniform(low: float, high: float) -> st.SearchStrategy[float]:
    """Floats spread evenly in log scale over [low, high], both ends included."""
    return st.one_of(st.sampled_from([low, high]), st.floats(math.log10(low), math.log10(high)).map(
        lambda e: min(max(10.0**e, low), high)))


def log_int(low: int, high: int) -> st.SearchStrategy[int]:
    return log_uniform(low, high).map(lambda v: min(max(round(v), low), high))


@st.composite
def extreme_configuration(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """A model, a hardware profile and eval's numbers, each drawn anywhere inside the
    schema's bounds (spaces.schema), ends included: what the bounds admit must compute."""
    from paraspace.spaces import schema

    heads = 2 ** draw(st.integers(0, 7))
    model = {**MODEL_BASE, "layers": draw(log_int(1, schema.MAX_LAYERS)), "heads": heads, "kv_heads": heads,
             "hidden": heads * 2 ** draw(st.integers(0, 13)), "ffn": draw(log_int(1, schema.MAX_WIDTH)),
             "vocab": draw(log_int(1, schema.MAX_COUNT))}
    device = dict(HARDWARE_BASE["device"])
    rate = log_uniform(schema.MIN_RATE, schema.MAX_RATE)
    device.update(peak_TFLOP_per_s={"bf16": draw(rate)}, hbm_bandwidth_GB_per_s=draw(rate),
                  hbm_capacity_GiB=draw(log_uniform(1e-3, schema.MAX_GIB)),
                  launch_overhead_us=draw(st.sampled_from([0.0, schema.MAX_LATENCY_US, 4.0])),
                  host_link_GB_per_s=draw(rate), host_memory_GB_per_s=draw(rate))
    for key in ("gemm_max_efficiency", "attention_efficiency", "memory_efficiency"):
        device[key] = draw(log_uniform(schema.MIN_FRACTION, 1.0))
    links = [{**link, "bandwidth_GB_per_s": draw(rate), "latency_us": draw(log_uniform(1e-3, schema.MAX_LATENCY_US)),
              "efficiency": draw(log_uniform(schema.MIN_FRACTION, 1.0))} for link in HARDWARE_BASE["links"]]
    hardware = {**HARDWARE_BASE, "device": device, "links": links}
    devices = 2 ** draw(st.integers(0, 4))
    args = ["--devices", str(devices), "--global-batch", str(devices * 2 ** draw(st.integers(0, 12))),
            "--seq-len", str(draw(log_int(1, schema.MAX_COUNT))), "--set", "tp=1", "--json"]
    return model, hardware, args


def run_extreme(folder: Path, case: tuple[dict[str, Any], dict[str, Any], list[str]]) -> tuple[list[str], Result]:
    model, hardware, numbers = case
    (folder / "model.toml").write_text(toml_text(model))
    (folder / "hardware.toml").write_text(toml_text(hardware))
    args = ["eval", "--model", str(folder / "model.toml"), "--hardware", str(folder / "hardware.toml"), *numbers]
    return args, run(args)


#: the event tier times tasks in int64 nanoseconds: a step beyond this overflows it
#: (tests/test_hostile_input.py::test_a_step_beyond_the_event_tier_range_is_not_simulated)
EVENT_TIER_MAX_S = 2**63 / 1e9


@FUZZ
@given(case=extreme_configuration())
def test_fuzz_extremes_inside_the_bounds(tmp_path_factory, case):
    args, result = run_extreme(tmp_path_factory.mktemp("extreme"), case)
    check_clean(result, args)
    if result.exit_code == 0 and json.loads(result.stdout)["step_time_analytic_s"] < EVENT_TIER_MAX_S:
        check_json_row(result.output)


# --------------------------------------------------------------------------- serving spaces

#: a serving space that evaluates in about a second: Llama 3 8B on 2 H100, 8 candidates, with and
#: without speculative decoding (draft_tokens, acceptance_rate)
SERVING_BASE: dict[str, Any] = {
    "name": "fuzz-serving", "description": "a small serving space to mutate", "model": "llama3-8b",
    "hardware": "h100-sxm5-80gb", "devices": 2, "host_overhead_us": 200.0, "simulate_top": 2,
    "workload": {"input_len": 512, "output_len": 64, "concurrency": 8, "n_requests": 64, "acceptance_rate": 0.7},
    "sla": {"ttft_s": 2.0, "tpot_s": 0.05},
    "dimensions": {"tp": [1, 2], "max_batch": [8, 16], "draft_tokens": [0, 2]},
}


def check_serving_parquet(path: Path) -> None:
    """Latencies and throughputs of feasible deployments are finite and positive; a decode
    step emits between 1 and draft_tokens + 1 tokens."""
    fit = pl.read_parquet(path).filter(pl.col("feasible"))
    for column in ("ttft_s", "tpot_s", "output_tokens_per_s_per_gpu", "mem_peak_bytes"):
        assert fit[column].is_finite().all() and (fit[column] > 0).all(), column
    steps = fit["tokens_per_step"]
    assert steps.is_finite().all() and (steps >= 1).all() and (steps <= fit["draft_tokens"] + 1).all()


@FUZZ
@given(content=hostile_toml(SERVING_BASE))
def test_fuzz_serving_toml(tmp_path_factory, content):
    folder = tmp_path_factory.mktemp("serving")
    path, out = folder / "serving.toml", folder / "serving.parquet"
    path.write_bytes(content)
    args = ["serve", str(path), "--out", str(out), "-n", "0"]
    result = run(args)
    check_clean(result, args)
    if result.exit_code == 0 and out.is_file():
        check_serving_parquet(out)
