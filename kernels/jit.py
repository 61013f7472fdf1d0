"""The one JIT policy. Every kernel is compiled through ``jit`` so that caching,
the error model and fastmath are set in a single place
(``tests/test_jit_policy.py`` fails if a kernel calls ``numba.njit`` directly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numba

F = TypeVar("F", bound=Callable[..., Any])

#: cache: compiled code persists across processes (compile time counts);
#: error_model="numpy": division follows IEEE (inf/nan), no Python exception checks;
#: fastmath off: bit-identical results across runs are part of the contract.
OPTIONS: dict[str, Any] = {"cache": True, "error_model": "numpy", "nogil": True, "fastmath": False}


def jit(fn: F | None = None, *, parallel: bool = False) -> Any:
    """``numba.njit`` with the project policy; ``parallel=True`` for prange over rows."""

    def wrap(f: F) -> F:
        return numba.njit(parallel=parallel, **OPTIONS)(f)  # type: ignore[no-any-return]

    return wrap(fn) if fn is not None else wrap
