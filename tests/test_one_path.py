"""One way from a space and a strategy to an evaluation (``explorer.evaluate.pin``).

For every catalog space, the best row of a sweep and ``paraspace eval --space
NAME --set ...`` of its strategy agree exactly, column for column (all but
``row_id``, the position in a different, one-row space): eval keeps every
setting of the space (``uneven_layers``, ``quantized_gemms``,
``attention_kernel``, ``moe_imbalance``, ...), and the rows that need uneven
layers (the published DeepSeek-V3 layout, Llama 3 405B) evaluate and trace.
The sweeps simulate only their few best candidates, so the suite stays cheap.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from paraspace.explorer.cli import main
from paraspace.explorer.evaluate import pack, pin
from paraspace.explorer.sweep import run_sweep
from paraspace.explorer.timeline import capture
from paraspace.results.rank import ranked, scan
from paraspace.spaces import catalog
from paraspace.spaces.encode import DIMENSION_NAMES, Encoder
from paraspace.spaces.errors import CatalogError

#: the sweeps' event tier runs on this many best candidates (by analytic step time)
SIMULATE_TOP = 4
#: catalog spaces whose best rows split the layers unevenly (eval and trace refused them before pin)
UNEVEN = ("llama3-405b-h100-256", "deepseek-v3-h800", "deepseek-v3-br166")


def invoke(*args: str):  # noqa: ANN201 - click's Result
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module", params=catalog.names("space"))
def best_row(request, tmp_path_factory) -> tuple[str, dict]:
    name = request.param
    out = tmp_path_factory.mktemp(name) / f"{name}.parquet"
    run_sweep(catalog.load_space(name), out, progress=False, simulate_top=SIMULATE_TOP)
    # the best of the simulated rows: eval simulates every feasible row it is given, while the sweep
    # leaves rows beyond its SIMULATE_TOP analytic best analytic (they may still rank above them)
    return name, ranked(scan(out).filter(pl.col("simulated"))).head(1).collect().row(0, named=True)


def strategy_args(row: dict) -> list[str]:
    """``--set KEY=VALUE`` for every strategy column of a result row (devices included)."""
    args = []
    for name in DIMENSION_NAMES:
        value = row[name]
        args += ["--set", f"{name}={str(value).lower() if isinstance(value, bool) else value}"]
    return args


def test_eval_reproduces_the_best_sweep_row(best_row):
    name, row = best_row
    assert row["feasible"] and row["simulated"]  # both tiers are compared
    result = invoke("eval", "--space", name, *strategy_args(row), "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert list(got) == list(row)
    assert got == row  # row_id included: eval gives the configuration's id in the space


def test_eval_with_devices_keys_the_row_as_the_sweep_of_every_size(best_row):
    """--devices D naming one of the space's cluster sizes picks that block of its sweep: the
    row_id is the sweep's, not the position in a space of size D alone (deepseek-v3-br166
    lists 256, 512 and 1024: its 512-device rows came back keyed as their 256-device twins)."""
    name, row = best_row
    args = [a for pair in zip(*[iter(strategy_args(row))] * 2) if not pair[1].startswith("devices=") for a in pair]
    result = invoke("eval", "--space", name, "--devices", str(row["devices"]), *args, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["row_id"] == row["row_id"]


def test_trace_captures_the_best_sweep_row(best_row, tmp_path):
    """The timeline trace captures is the sweep row's simulation: its task count and step time."""
    name, row = best_row
    if name not in UNEVEN:
        pytest.skip("traced where eval and trace used to refuse the row; the others share its path")
    one = pin(catalog.load_space(name), {k: row[k] for k in DIMENSION_NAMES})
    enc = Encoder(one).encode_all()
    timeline = capture(one, pack(one), {k: int(v[0]) for k, v in enc.columns.items()})
    assert timeline.start_s.size == row["n_tasks"]
    assert f"step {row['step_time_s'] * 1e3:.1f} ms" in timeline.title
    if name == UNEVEN[0]:  # the command itself (its Gantt picture takes minutes for the DeepSeek rows)
        result = invoke("trace", "--space", name, *strategy_args(row), "--out", str(tmp_path / "t"))
        assert result.exit_code == 0, result.output
        assert f"{int(row['n_tasks']):,} tasks; wrote" in result.output


def test_pin_keeps_every_setting_and_pins_each_dimension():
    space = catalog.load_space("deepseek-v3-h800")
    one = pin(space, {"pp": 16, "ep": 64, "schedule": "dualpipe"})
    assert one.spec.model_copy(update={"dimensions": space.spec.dimensions}) == space.spec
    dims = one.spec.dimensions
    assert (dims.pp, dims.ep, dims.schedule) == ((16,), (64,), ("dualpipe",))
    assert dims.zero == (1,)  # the space's single value, not the default 0
    assert dims.tp == (1,) and dims.tbo == (False,)  # several values in the space: the default
    assert dims.dp is None  # derived: 2048 / 16
    enc = Encoder(one).encode_all()
    assert enc.n_rows == 1 and int(enc.columns["dp"][0]) == 128


@pytest.mark.parametrize(
    ("space", "strategy", "needles"),
    [
        ("deepseek-v3-br166", {"pp": 4}, ["devices = [256, 512, 1024]", "one device count"]),
        ("llama3-8b-h100-64", {"tp": 3}, ["tp*pp*cp = 3", "a divisor of devices = 64"]),
        ("llama3-8b-h100-64", {"bogus": 1}, ["--set bogus = 1", "known keys"]),
    ],
)
def test_pin_refuses_with_one_line(space, strategy, needles):
    with pytest.raises(CatalogError) as err:
        pin(catalog.load_space(space), strategy)
    assert "\n" not in str(err.value)
    for needle in needles:
        assert needle in str(err.value)


def test_eval_refuses_two_device_counts():
    result = invoke("eval", "--space", "deepseek-v3-br166", "--devices", "256", "--set", "devices=512")
    assert result.exit_code == 2
    assert "--set devices=512" in result.output and "--devices value 256" in result.output


def test_eval_without_a_space_still_works(tmp_path: Path):
    result = invoke("eval", "--model", "llama3-8b", "--hardware", "h100-sxm5-80gb", "--devices", "8",
                    "--global-batch", "16", "--seq-len", "2048", "--set", "tp=8", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["dp"] == 1


def test_study_rows_are_the_sweep_rows(tmp_path):
    """A study's trials go through the same path: each row of its Parquet parts equals the sweep's row
    of that combination, every column (the sweep simulates all of this small space's feasible rows)."""
    import optuna

    from paraspace.explorer.study import run_study

    name = "llama3-8b-h100-64"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = catalog.load_space(name)
    run_sweep(space, tmp_path / "sweep.parquet", progress=False)
    run_study(space, n_trials=30, out_dir=tmp_path / "study", batch=15, sampler="random", seed=2)
    studied = pl.read_parquet(tmp_path / "study" / name / "*.parquet")
    assert studied.height > 0 and studied["simulated"].any()
    swept = pl.read_parquet(tmp_path / "sweep.parquet").filter(pl.col("row_id").is_in(studied["row_id"].implode()))
    key = studied.unique("row_id").sort("row_id")
    assert key.to_dicts() == swept.sort("row_id").to_dicts()
