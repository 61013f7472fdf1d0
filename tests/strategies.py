"""Hypothesis strategies shared by the kernel tests."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def tier_stacks(draw):
    """1-3 link tiers, innermost first, as ``(domain_devices, bytes_per_s, latency_s)``:
    domains grow by 2-8x per tier, the outermost spans the cluster (0)."""
    n = draw(st.integers(1, 3))
    levels, domain = [], 1
    for i in range(n):
        domain *= 2 ** draw(st.integers(1, 3))
        levels.append((0.0 if i == n - 1 else float(domain), draw(st.floats(1e8, 1e13)), draw(st.floats(0.0, 1e-4))))
    return levels
