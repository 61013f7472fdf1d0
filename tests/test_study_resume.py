"""Resuming a study answers the question it was created for: the same space definition,
memory cap and simulation setting (refused otherwise, in one line, before any trial), with
the cap honoured by the Parquet parts every reader ranks; serving files carry the training
files' provenance, so two serving spaces are never ranked together."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import polars as pl
import pytest
from click.testing import CliRunner, Result
from optuna.trial import TrialState

from paraspace.explorer.cli import main
from paraspace.explorer.serve import run_serve
from paraspace.explorer.study import default_storage, run_study
from paraspace.explorer.sweep import space_digest
from paraspace.results import rank
from paraspace.results.schema import META_DIGEST, META_SPACE
from paraspace.results.writer import read_metadata
from paraspace.spaces.catalog import CATALOG_DIR, load_space
from paraspace.spaces.serving import load_serving

SMALL = "llama3-8b-h100-64"


@pytest.fixture(autouse=True)
def quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def refused(result: Result, *fragments: str) -> None:
    """Exit status 2, one 'Error: ...' line, every fragment in it, no traceback."""
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert "Traceback" not in result.output and len(errors) == 1, result.output
    for fragment in fragments:
        assert fragment in errors[0], result.output


def study_of(out: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=default_storage(out, name))


def other_model(tmp_path: Path) -> Path:
    """The small space's TOML with Llama 3 70B: the same dimensions, another problem."""
    text = (CATALOG_DIR / "spaces" / f"{SMALL}.toml").read_text()
    path = tmp_path / "my70b.toml"
    path.write_text(text.replace('name = "llama3-8b-h100-64"', 'name = "my70b"')
                    .replace('model = "llama3-8b"', 'model = "llama3-70b"'))
    return path


def test_resuming_with_another_space_definition_is_refused(tmp_path):
    out = tmp_path / "out"
    args = ["--trials", "8", "--batch", "8", "--sampler", "random", "--out", str(out), "--study-name", "s",
            "--no-progress"]
    assert run("study", SMALL, *args).exit_code == 0
    other = other_model(tmp_path)
    digest = space_digest(load_space(str(other)))[:12]
    refused(run("study", str(other), *args),
            f"{out / 's.journal'}: study 's': SPACE = 'my70b (sha256 {digest})': expected the space definition the "
            f"study was created with, {SMALL} (sha256 {space_digest(load_space(SMALL))[:12]})")
    study = study_of(out, "s")
    assert len(study.trials) == 8 and study.user_attrs["space"] == SMALL  # nothing asked for the other space
    assert run("study", SMALL, *args).exit_code == 0  # its own space still resumes


def test_resuming_with_another_memory_cap_is_refused(tmp_path):
    args = ["study", SMALL, "--trials", "8", "--batch", "8", "--sampler", "random", "--out", str(tmp_path),
            "--no-progress"]
    assert run(*args, "--max-mem", "40").exit_code == 0
    refused(run(*args, "--max-mem", "30"),
            f"study '{SMALL}': --max-mem = '30 GiB': expected the memory cap the study was created with, 40 GiB")
    refused(run(*args), "--max-mem = '80 GiB'", "created with, 40 GiB")  # no cap: the device's HBM
    assert run(*args, "--max-mem", "40").exit_code == 0
    assert len(study_of(tmp_path, SMALL).trials) == 16


def test_resuming_a_serving_study_with_another_simulation_setting_is_refused(tmp_path):
    space = serving_space(tmp_path, "toy-serve", "llama3-8b")
    args = ["study", str(space), "--trials", "4", "--batch", "4", "--out", str(tmp_path / "out"), "--no-progress"]
    assert run(*args, "--no-simulate").exit_code == 0
    refused(run(*args), "study 'toy-serve': --simulate/--no-simulate = '--simulate': expected the simulation "
                        "setting the study was created with, --no-simulate")
    assert len(study_of(tmp_path / "out", "toy-serve").trials) == 4


def test_a_first_trial_cut_while_suggesting_does_not_block_the_resume(tmp_path):
    """A worker killed during its study's first trial leaves it RUNNING with only some parameters:
    its dimensions are not the study's, so the resume goes on (and reclaims the trial)."""
    storage = default_storage(tmp_path, SMALL)
    study = optuna.create_study(study_name=SMALL, storage=storage, directions=["minimize", "minimize"])
    trial = study.ask()
    trial.suggest_categorical("tp", [1, 2, 4, 8])  # killed here
    summary = run_study(load_space(SMALL), n_trials=4, out_dir=tmp_path, batch=4, sampler="random")
    assert summary.n_new == 4 and summary.n_recovered == 1
    assert study_of(tmp_path, SMALL).trials[0].state == TrialState.FAIL


def test_rows_over_the_cap_are_written_infeasible_and_top_agrees(tmp_path):
    """Under --max-mem the Parquet's feasible column is the study's: rows over the cap are
    out_of_memory, the cap is in every part's footer, and ``top`` ranks the study's best first."""
    cap_gib = 30
    summary = run_study(load_space(SMALL), n_trials=48, out_dir=tmp_path, batch=16, sampler="random",
                        objective="time", max_mem_gib=cap_gib)
    folder = tmp_path / SMALL
    df = pl.read_parquet(folder / "*.parquet")
    over = df.filter(pl.col("mem_peak_bytes") > cap_gib * 1024**3)
    assert over.height and not over["feasible"].any()
    assert set(over["infeasible_reason"].to_list()) <= {"out_of_memory", "out_of_host_memory"}
    for part in folder.glob("*.parquet"):
        info = json.loads(read_metadata(part)["paraspace.study"])
        assert info["mem_cap_bytes"] == cap_gib * 1024**3 and info["space_sha256"] == space_digest(load_space(SMALL))
    assert summary.best and rank.top(folder, 1)["row_id"][0] == summary.best[0]["row_id"]
    trials = study_of(tmp_path, SMALL).get_trials(states=(TrialState.COMPLETE,))
    feasible = {t.user_attrs["row_id"] for t in trials if t.system_attrs["constraints"][0] <= 0}
    assert feasible == set(df.filter(pl.col("feasible"))["row_id"].to_list())  # one answer, Optuna's and Parquet's


def test_the_best_list_shows_each_configuration_once(tmp_path):
    """Trials that sampled one configuration again appear once in the summary's best list."""
    loaded = load_space(SMALL)
    first = run_study(loaded, n_trials=16, out_dir=tmp_path, batch=16, sampler="random")
    study = study_of(tmp_path, SMALL)
    best = next(t for t in study.trials if t.number == first.best[0]["trial"])
    for _ in range(3):
        study.enqueue_trial(best.params)
    again = run_study(loaded, n_trials=3, out_dir=tmp_path, batch=3, sampler="random")
    ids = [entry["row_id"] for entry in again.best]
    assert len(ids) == len(set(ids)) and again.best[0]["trial"] == best.number


def serving_space(tmp_path: Path, name: str, model: str) -> Path:
    lines = [f'name = "{name}"', 'description = "t"', f'model = "{model}"', 'hardware = "h100-sxm5-80gb"',
             "devices = 8", "[workload]", "input_len = 1024", "output_len = 64", "concurrency = 16", "[sla]",
             "ttft_s = 1.0", "[dimensions]", "tp = [4, 8]"]
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_serving_files_carry_the_training_provenance(tmp_path):
    """``paraspace serve`` and a serving study write the space as ``{"toml": ...}`` with its digest:
    ``top`` names the space, and refuses to rank two serving spaces' files together."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    spaces = [load_serving(str(serving_space(tmp_path, n, m))) for n, m in (("a", "llama3-8b"), ("b", "llama3-70b"))]
    for space in spaces:
        run_serve(space, folder / f"{space.spec.name}.parquet", simulate_top=0)
    meta = read_metadata(folder / "a.parquet")
    assert json.loads(meta[META_SPACE])["toml"]["name"] == "a" and meta[META_DIGEST] == space_digest(spaces[0])
    assert rank.open_results(folder / "a.parquet").space == "a"
    with pytest.raises(rank.ResultsError, match=f"{META_DIGEST} = 2 different space definitions"):
        rank.open_results(folder)
    summary = run_study_serving(spaces[1], tmp_path / "study")
    part = read_metadata(summary.parts[0])
    assert part[META_DIGEST] == space_digest(spaces[1]) and json.loads(part[META_SPACE])["toml"]["name"] == "b"


def run_study_serving(space, out: Path):
    from paraspace.explorer.serve_study import run_serving_study

    return run_serving_study(space, n_trials=2, out_dir=out, batch=2, sampler="random", simulate=False)
