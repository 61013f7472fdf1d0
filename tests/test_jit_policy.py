"""Every kernel goes through kernels.jit (one JIT policy: cache, error model, no fastmath)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import numba.core.registry

from paraspace import kernels
from paraspace.kernels.jit import OPTIONS

KERNEL_DIR = Path(kernels.__file__).parent


def test_no_direct_numba_decorators():
    offenders = []
    for path in KERNEL_DIR.glob("*.py"):
        if path.name == "jit.py":
            continue
        text = path.read_text()
        if re.search(r"\bnjit\b|numba\.jit\b|@jit\(nopython|from numba import .*\bjit\b", text):
            offenders.append(path.name)
    assert offenders == [], f"kernels bypassing kernels.jit: {offenders}"


def test_every_dispatcher_caches():
    dispatchers = []
    for info in pkgutil.iter_modules([str(KERNEL_DIR)]):
        module = importlib.import_module(f"paraspace.kernels.{info.name}")
        for name, obj in vars(module).items():
            if isinstance(obj, numba.core.registry.CPUDispatcher) and obj.__module__ == module.__name__:
                dispatchers.append((module.__name__, name, obj))
    assert len(dispatchers) >= 10
    for mod, name, obj in dispatchers:
        assert type(obj._cache).__name__ != "NullCache", f"{mod}.{name} is not cached"
        assert obj.targetoptions.get("fastmath", False) is False, f"{mod}.{name} uses fastmath"


def test_policy_is_cache_and_numpy_errors():
    assert OPTIONS["cache"] is True
    assert OPTIONS["error_model"] == "numpy"
