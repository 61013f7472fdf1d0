"""``paraspace precompile``: each group of kernels compiled once, ahead of a run.

The claim worth testing is that a run after it compiles nothing: the groups call the
kernels with the signatures a sweep and a serving run use. Each check runs in a fresh
process (numba's cache is per process until it is loaded) and counts the kernels'
cache misses there. In the whole suite the cache is warm already (``conftest``'s
``pytest_configure``); run alone on a cold cache, the first test compiles (minutes).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from paraspace.explorer.cli import main
from paraspace.explorer.precompile import GROUPS, precompile

#: a child process: run one command line in-process, then print the number of
#: signatures every kernel of paraspace.kernels compiled there (not found in the cache)
MISSES = """
import importlib, json, pkgutil, sys
from click.testing import CliRunner
from numba.core.registry import CPUDispatcher
import paraspace.kernels as k
from paraspace.explorer.cli import main

result = CliRunner().invoke(main, sys.argv[1:])
assert result.exit_code == 0, result.output
misses = {}
for info in pkgutil.iter_modules(k.__path__):
    module = importlib.import_module(f"paraspace.kernels.{info.name}")
    for name, fn in vars(module).items():
        if isinstance(fn, CPUDispatcher) and fn.__module__ == module.__name__ and fn.stats.cache_misses:
            misses[f"{info.name}.{name}"] = sum(fn.stats.cache_misses.values())
print(json.dumps(misses))
"""


def _misses_after(args: list[str]) -> dict[str, int]:
    done = subprocess.run([sys.executable, "-c", MISSES, *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_run_after_precompile_compiles_nothing(tmp_path):
    """A sweep (analytic and event tiers) and a serving run (analytic tier and
    simulation) of catalog spaces the groups do not use, after ``precompile``: no
    kernel compiles. Fails if a group calls a kernel with other argument types than
    these runs (it did: a Poisson workload's simulation took other types than a
    closed loop's until the serving group ran one)."""
    precompile(jobs=2)
    sweep = _misses_after(["sweep", "gpt3-175b-a100-40gb-256", "--simulate-top", "8", "--no-progress", "-n", "0",
                           "--out", str(tmp_path / "sweep.parquet")])
    assert sweep == {}
    serving = _misses_after(["serve", "deepseek-v3-br166-decode", "--simulate-top", "2",
                             "--out", str(tmp_path / "serve.parquet")])
    assert serving == {}
    assert (tmp_path / "sweep.parquet").exists() and (tmp_path / "serve.parquet").exists()


def test_cli_compiles_a_chosen_group():
    result = CliRunner().invoke(main, ["precompile", "--group", "training", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert "compiling training in 1 processes" in result.output
    lines = [line.split() for line in result.output.splitlines()[1:]]
    assert [line[0] for line in lines] == ["training"]
    assert float(lines[0][1]) >= 0.0 and lines[0][2] == "s"


def test_unknown_group_is_refused():
    with pytest.raises(ValueError, match="unknown kernel groups \\['tensor'\\]; expected some of"):
        precompile(groups=("training", "tensor"))
    result = CliRunner().invoke(main, ["precompile", "--group", "tensor"])
    assert result.exit_code == 2
    assert "'tensor' is not one of" in result.output and all(g in result.output for g in GROUPS)
