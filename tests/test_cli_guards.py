"""Guards on user input and outputs found by the serving audit: outputs never written over
files that are not ours, rankings with unknown values last, the front's axes named as
used, a resumed study's objective, KV cache precisions, BOM-marked CSVs, whole-token
lengths and unknown labels in validation rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import polars as pl
import pyarrow as pa
import pytest
from click.testing import CliRunner, Result
from test_serving_study_trace import toy_space
from test_validate_inference import GPT13B, write

from paraspace.explorer import validate
from paraspace.explorer.cli import main
from paraspace.explorer.serve import run_serve
from paraspace.explorer.study import default_storage
from paraspace.results import rank
from paraspace.results.report import PAGE_START
from paraspace.results.writer import ResultWriter, check_replaceable
from paraspace.spaces.errors import CatalogError
from paraspace.spaces.serving import load_serving

TRAINING = "llama3-8b-h100-64"


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def refused(result: Result, *fragments: str) -> None:
    """Exit status 2, an 'Error: ...' line last, every fragment in the output, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.output.splitlines()[-1].startswith("Error: ")
    for fragment in fragments:
        assert fragment in result.output, result.output


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """A small serving result: 16 candidates, two simulated and feasible, most p90s unknown."""
    folder = tmp_path_factory.mktemp("served")
    out = folder / "toy.parquet"
    run_serve(load_serving(str(toy_space(folder))), out, simulate_top=2)
    return out


# --------------------------------------------------------------------------- 1: outputs


def _schema() -> pa.Schema:
    return pa.schema([pa.field("row_id", pa.int64())])


def test_result_writer_replaces_results_and_empty_files_only(tmp_path):
    """A Parquet target (an earlier result) and an empty file are replaced; a text file,
    e.g. a space TOML, is refused before anything is written, byte for byte intact."""
    table = pa.table({"row_id": [1, 2]}, schema=_schema())
    for name, content in (("new.parquet", None), ("empty.parquet", b"")):
        target = tmp_path / name
        if content is not None:
            target.write_bytes(content)
        with ResultWriter(target, _schema(), {}, {}) as writer:
            writer.write(table)
            writer.close()
        assert pl.read_parquet(target)["row_id"].to_list() == [1, 2]
        with ResultWriter(target, _schema(), {}, {}) as writer:  # an earlier result: replaced
            writer.write(table.slice(0, 1))
            writer.close()
        assert pl.read_parquet(target)["row_id"].to_list() == [1]
    space = tmp_path / "space.toml"
    space.write_text('name = "x"\n')
    with pytest.raises(rank.ResultsError, match=r"space\.toml: output file = .*expected a new file or an earlier "
                                                r"Parquet result to replace \(it is not one: it starts with b'name'"):
        ResultWriter(space, _schema(), {}, {})
    assert space.read_text() == 'name = "x"\n' and list(tmp_path.glob("*.partial")) == []


def test_result_writer_checks_again_before_it_publishes(tmp_path):
    """Notes written at the target while a result was being computed are kept; the partial
    file is removed."""
    target = tmp_path / "out.parquet"
    with ResultWriter(target, _schema(), {}, {}) as writer:
        writer.write(pa.table({"row_id": [1]}, schema=_schema()))
        target.write_text("my notes\n")
        with pytest.raises(rank.ResultsError, match="it is not one"):
            writer.close()
    assert target.read_text() == "my notes\n" and list(tmp_path.glob("*.partial")) == []


def test_serve_refuses_to_overwrite_its_space_or_notes(tmp_path):
    space = toy_space(tmp_path)
    before = space.read_bytes()
    refused(run("serve", str(space), "--out", str(space)), f"{space}: output file", "expected a new file or an "
            "earlier Parquet result to replace")
    assert space.read_bytes() == before
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    refused(run("serve", str(space), "--out", str(notes)), f"{notes}: output file")
    assert notes.read_text() == "keep me\n"


def test_sweep_refuses_to_overwrite_notes(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    refused(run("sweep", TRAINING, "--out", str(notes), "--no-progress"), f"{notes}: output file",
            "it starts with b'keep'")
    assert notes.read_text() == "keep me\n"


def test_report_replaces_reports_only(served, tmp_path):
    out = tmp_path / "report.html"
    assert run("report", str(served), "--out", str(out)).exit_code == 0
    assert out.read_text().startswith(PAGE_START)
    again = run("report", str(served), "--out", str(out))  # an earlier report: replaced
    assert again.exit_code == 0, again.output
    for name, content in (("notes.txt", "keep me\n"), ("page.html", "<!doctype html><html>mine</html>\n")):
        other = tmp_path / name
        other.write_text(content)
        refused(run("report", str(served), "--out", str(other)), f"{other}: output file",
                "expected a new file or an earlier paraspace report to replace")
        assert other.read_text() == content
    assert list(tmp_path.glob("*.partial")) == []


def test_check_replaceable_refuses_a_folder(tmp_path):
    with pytest.raises(rank.ResultsError, match="it is a folder or another non-file"):
        check_replaceable(tmp_path)


# --------------------------------------------------------------------------- 2: nulls and NaN last


def test_ranked_by_a_column_puts_null_and_nan_last():
    frame = pl.LazyFrame({"row_id": [0, 1, 2, 3, 4, 5], "feasible": [True, True, True, True, False, False],
                          "x": [None, float("nan"), 2.0, 1.0, None, 0.5]})
    order = rank.ranked(frame, ("x",)).collect()["row_id"].to_list()
    assert order[:2] == [3, 2] and set(order[2:4]) == {0, 1} and order[4:] == [5, 4]


def test_top_by_a_p90_ranks_unknown_values_last(served):
    best = rank.top(served, 100, ("tpot_p90_s", "mem_peak_bytes"))
    for feasible in (True, False):
        values = best.filter(pl.col("feasible") == feasible)["tpot_p90_s"].to_list()
        known = [v for v in values if v is not None and not np.isnan(v)]
        assert values[:len(known)] == sorted(known)  # the known values first, ascending
    shown = run("top", str(served), "--by", "tpot_p90_s", "-n", "1", "--columns", "row_id,tpot_p90_s")
    assert shown.exit_code == 0 and best["row_id"][0] is not None
    assert best["tpot_p90_s"][0] is not None


# --------------------------------------------------------------------------- 3: the front's axes


def test_pareto_names_the_serving_axes_it_used(served):
    result = run("pareto", str(served))
    assert result.exit_code == 0, result.output
    front = rank.pareto(served)
    assert result.output.splitlines()[0] == (f"{front.height} rows on the output_tokens_per_s_per_gpu / "
                                             "output_tokens_per_s_per_user front (both maximised):")
    assert rank.front_axes(rank.scan(served), "ttft_s", "tpot_s") == ("ttft_s", "tpot_s", False)
    asked = run("pareto", str(served), "--x", "ttft_s", "--y", "tpot_s")
    assert asked.exit_code == 0 and "rows on the ttft_s / tpot_s front:" in asked.output


# --------------------------------------------------------------------------- 4: a resumed study's objective


def test_resuming_a_serving_study_with_another_objective_is_refused(tmp_path):
    space = toy_space(tmp_path)
    args = ["study", str(space), "--trials", "4", "--batch", "4", "--no-simulate", "--out", str(tmp_path / "out"),
            "--no-progress"]
    assert run(*args).exit_code == 0
    refused(run(*args, "--objective", "throughput-user"),
            f"{tmp_path / 'out' / 'toy-serve.journal'}: study 'toy-serve': --objective = 'maximize "
            "output_tokens_per_s_per_gpu and maximize output_tokens_per_s_per_user': expected the objective the "
            "study was created with, maximize output_tokens_per_s_per_gpu")
    study = optuna.load_study(study_name="toy-serve", storage=default_storage(tmp_path / "out", "toy-serve"))
    assert len(study.trials) == 4 and all(t.state != optuna.trial.TrialState.FAIL for t in study.trials)
    assert run(*args).exit_code == 0  # the stored objective still resumes


def test_resuming_a_training_study_with_another_objective_is_refused(tmp_path):
    out = tmp_path / "out"
    storage = default_storage(out, TRAINING)
    optuna.create_study(study_name=TRAINING, storage=storage, directions=["minimize", "minimize"])
    refused(run("study", TRAINING, "--objective", "time", "--trials", "1", "--out", str(out), "--no-progress"),
            f"study '{TRAINING}': --objective = 'minimize step_time_s': expected the objective the study was "
            "created with, minimize value 0 and minimize value 1")


# --------------------------------------------------------------------------- 5, 6, 8: serving spaces


def serving_toml(tmp_path: Path, name: str, hardware: str = "h100-sxm5-80gb", input_len: str = "1024",
                 **dims: list) -> Path:
    lines = ['name = "t"', 'description = "t"', 'model = "llama3-8b"', f'hardware = "{hardware}"', "devices = 8",
             "[workload]", f"input_len = {input_len}", "output_len = 64", "concurrency = 16", "[sla]",
             "ttft_s = 1.0", "[dimensions]", "tp = [8]", *(f"{k} = {json.dumps(v)}" for k, v in dims.items())]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_kv_cache_precision_the_hardware_lacks_is_refused(tmp_path):
    path = serving_toml(tmp_path, "kv.toml", kv_dtype=["fp4"])
    with pytest.raises(CatalogError, match=r"kv\.toml: dimensions\.kv_dtype = 'fp4': expected a KV cache precision "
                                           r"h100-sxm5-80gb has a peak for: \['bf16', 'fp16', 'fp8', 'int8'\]"):
        load_serving(str(path))
    refused(run("serve", str(path), "--dry-run"), "dimensions.kv_dtype = 'fp4'")
    blackwell = serving_toml(tmp_path, "b200.toml", hardware="b200-sxm-180gb", kv_dtype=["fp4"])
    assert load_serving(str(blackwell)).spec.dimensions.kv_dtype == ("fp4",)


def test_an_empirical_length_csv_with_a_bom_is_read(tmp_path):
    (tmp_path / "lengths.csv").write_bytes("\ufeffinput_tokens\n100\n300\n".encode())
    path = serving_toml(tmp_path, "bom.toml",
                        input_len='{ distribution = "empirical", path = "lengths.csv", column = "input_tokens" }')
    loaded = load_serving(str(path))
    assert loaded.spec.workload.input_len.mean == 200.0
    assert loaded.empirical["input_len"].tolist() == [100.0, 300.0]


@pytest.mark.parametrize(("input_len", "field", "value"), [
    ("2048.7", "workload.input_len", "2048.7"),
    ("{ mean = 2048.7 }", "workload.input_len.mean", "2048.7"),
])
def test_a_fractional_fixed_length_is_refused(tmp_path, input_len, field, value):
    path = serving_toml(tmp_path, "len.toml", input_len=input_len)
    refused(run("serve", str(path), "--dry-run"),
            f"len.toml: {field} = {value}: expected a whole number of tokens for a fixed length")
    lognormal = serving_toml(tmp_path, "ln.toml",
                             input_len='{ distribution = "lognormal", mean = 2048.7, sigma = 0.5 }')
    assert load_serving(str(lognormal)).spec.workload.input_len.mean == 2048.7
    assert load_serving(str(serving_toml(tmp_path, "whole.toml", input_len="2048.0"))).spec.workload.input_len.mean \
        == 2048.0


# --------------------------------------------------------------------------- 7: validation rows


def test_validate_reports_unknown_mode_and_quality_as_unsupported(tmp_path):
    """One bad row never aborts the file: each is unsupported with the column, the value and
    the allowed values; the good row is still predicted."""
    rows = [GPT13B | {"id": "good", "source": "s", "metric": "prefill_latency_s", "value": "0.063"},
            GPT13B | {"id": "weird-mode", "source": "s", "metric": "prefill_latency_s", "value": "0.063",
                      "mode": "weird"},
            GPT13B | {"id": "great", "source": "s", "metric": "prefill_latency_s", "value": "0.063",
                      "quality": "great"}]
    path = write(tmp_path / "inference.csv", rows)
    _, results = validate.run(path)
    by_id = {r.id: r for r in results}
    assert by_id["good"].status == "ok" and by_id["good"].predicted is not None
    assert by_id["weird-mode"].status == "unsupported" and by_id["weird-mode"].predicted is None
    assert by_id["weird-mode"].reason == "row weird-mode: mode = 'weird': expected one of ['agg', 'prefill', " \
                                         "'decode', 'disagg'] or EMPTY (agg)"
    assert by_id["great"].status == "unsupported" and by_id["great"].predicted is None
    assert by_id["great"].reason == "row great: quality = 'great': expected one of ['ok', 'uncertain']"
    shown = run("validate", str(path), "--no-progress", "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["summary"]["status"]["unsupported"] == 2
