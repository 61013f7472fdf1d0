"""Shared fixtures: packed parameter records the kernels take.

Session-scoped (they are read-only arrays), so hypothesis tests may use them.
Toy records use round numbers for hand-derived expectations; catalog records
come through the same packing code the explorer uses.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import settings

from paraspace.explorer.evaluate import pack_hardware, pack_model
from paraspace.kernels import params
from paraspace.spaces.catalog import load_hardware, load_model

GIB = 2.0**30

#: Property tests draw the same examples on every run, so a suite that passed once passes on
#: CI too (fresh draws once found a faster GPU predicted slower, ZB-H1 with one micro-batch,
#: in one run of many). ``HYPOTHESIS_PROFILE=explore python -m pytest`` draws new examples
#: each run, as a nightly job exploring for such cases should; a failure it finds becomes an
#: ``@example`` of the test.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.hookimpl(trylast=True)  # after the terminal reporter is set up, to print its line
def pytest_configure(config: pytest.Config) -> None:
    """Before the whole suite's workers start, compile the kernels, each group once and
    the groups in parallel (``paraspace.explorer.precompile``): workers that start on a
    cold numba cache each compile every kernel they call, and on 2 cores about a third
    of the suite's compiling was the two workers compiling the same kernels. Only for a
    run of the whole suite (``python -m pytest``, the README's command) in the
    controlling process; a run of chosen files or tests compiles what it calls, and
    ``PARASPACE_PRECOMPILE=0`` turns it off. On a warm cache each group only loads."""
    if (hasattr(config, "workerinput") or os.environ.get("PARASPACE_PRECOMPILE") == "0"
            or config.args_source != pytest.Config.ArgsSource.TESTPATHS or config.option.collectonly):
        return
    import time

    from paraspace.explorer.precompile import GROUPS, precompile

    jobs = min(os.cpu_count() or 1, len(GROUPS))
    began = time.perf_counter()
    try:
        seconds = precompile(jobs)
        line = (f"kernels compiled in {jobs} processes in {time.perf_counter() - began:.0f} s ("
                + ", ".join(f"{name} {s:.0f} s" for name, s in seconds.items()) + ")")
    except Exception as err:  # noqa: BLE001 - the tests that call the failing kernels report it
        line = f"precompiling the kernels failed ({type(err).__name__}: {err}); each test compiles what it calls"
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


def _device(**overrides: float) -> np.ndarray:
    """A device with round numbers and ideal efficiencies: 100 TFLOP/s, 1 TB/s
    HBM, 100 compute units, no launch cost, no framework overhead."""
    values = dict(
        peak_flops_per_s=100e12, hbm_bytes_per_s=1e12, hbm_capacity_bytes=80 * GIB, compute_units=100.0,
        launch_s=0.0, gemm_max_efficiency=1.0, attention_efficiency=1.0, memory_efficiency=1.0,
        memory_overhead_bytes=0.0, host_link_bytes_per_s=25e9, host_memory_bytes_per_s=50e9,
        host_capacity_bytes=256 * GIB,
    )
    values.update(overrides)
    return params.record(params.DEVICE, **values)


def _tiers(*levels: tuple[float, float, float]) -> np.ndarray:
    """Tier records from ``(domain_devices, bytes_per_s, latency_s)``, innermost first."""
    return params.tier_table(levels)


def _workload(**overrides: float) -> np.ndarray:
    """A bf16 training workload with fp32 main gradients and Adam (2/2/4/12 bytes)."""
    values = dict(global_batch=64.0, seq_len=4096.0, act_bytes=2.0, weight_bytes=2.0, grad_bytes=4.0,
                  optimizer_bytes=12.0, flash_attention=1.0, gemm_cast_bytes=0.0)
    values.update(overrides)
    return params.record(params.WORKLOAD, **values)


@pytest.fixture(scope="session")
def make_device():
    """``make_device(**fields)``: the toy device with some fields changed."""
    return _device


@pytest.fixture(scope="session")
def make_tiers():
    """``make_tiers((domain_devices, bytes_per_s, latency_s), ...)``, innermost first."""
    return _tiers


@pytest.fixture(scope="session")
def make_workload():
    """``make_workload(**fields)``: the bf16 workload with some fields changed."""
    return _workload


@pytest.fixture(scope="session")
def toy_dev() -> np.ndarray:
    return _device()


@pytest.fixture(scope="session")
def toy_tiles() -> np.ndarray:
    """One 128 x 128 output tile."""
    return np.array([[128.0, 128.0]])


@pytest.fixture(scope="session")
def h100() -> SimpleNamespace:
    """H100 SXM5 80GB in bf16: ``device``, ``tiers`` (NVLink 8, IB) and ``tiles``."""
    device, tier_records, tiles = pack_hardware(load_hardware("h100-sxm5-80gb"), "bf16")
    return SimpleNamespace(device=device, tiers=tier_records, tiles=tiles)


@pytest.fixture(scope="session")
def llama3_70b() -> np.ndarray:
    return pack_model(load_model("llama3-70b"))


@pytest.fixture(scope="session")
def llama3_8b() -> np.ndarray:
    return pack_model(load_model("llama3-8b"))


@pytest.fixture(scope="session")
def gpt3_175b() -> np.ndarray:
    return pack_model(load_model("gpt3-175b"))
