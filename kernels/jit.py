"""The one JIT policy. Every kernel is compiled through ``jit`` so that caching,
the error model and fastmath are set in a single place
(``tests/test_jit_policy.py`` fails if a kernel calls ``numba.njit`` directly).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numba

F = TypeVar("F", bound=Callable[..., Any])


def _source_hash() -> str:
    """Hash of every kernel module's source."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


#: Numba invalidates a cached function only when its own file changes, not when
#: a kernel it calls from another file does, so an edit to pipeline.py could
#: leave event_tier.py running stale machine code. Caching into a folder named
#: by the hash of all kernel sources makes any edit start a fresh cache. A
#: NUMBA_CACHE_DIR set by the user wins.
if not os.environ.get("NUMBA_CACHE_DIR"):
    _base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    numba.config.CACHE_DIR = str(_base / "paraspace" / f"numba-{_source_hash()}")

#: cache: compiled code persists across processes (compile time counts);
#: error_model="numpy": division follows IEEE (inf/nan), no Python exception checks;
#: fastmath off: bit-identical results across runs are part of the contract.
OPTIONS: dict[str, Any] = {"cache": True, "error_model": "numpy", "nogil": True, "fastmath": False}


def jit(fn: F | None = None, *, parallel: bool = False, inline: bool = False) -> Any:
    """``numba.njit`` with the project policy; ``parallel=True`` for prange over rows.

    ``inline=True`` (numba's ``inline="always"``) splices the kernel into its
    callers at numba IR level: for the per-concept pieces a row kernel calls
    once per row or stage (``kernels.attention``, ``kernels.memory``, ...), so
    that splitting a kernel by concept costs no call, argument-passing or
    reference-count overhead (without it the analytic tier ran ~13% slower)."""

    def wrap(f: F) -> F:
        return numba.njit(parallel=parallel, inline="always" if inline else "never",  # type: ignore[no-any-return]
                          **OPTIONS)(f)

    return wrap(fn) if fn is not None else wrap
