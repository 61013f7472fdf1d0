"""One source of truth for column names and units."""

from __future__ import annotations

import pyarrow as pa

from paraspace.explorer.sweep import result_schema, strategy_columns
from paraspace.kernels.event_tier import SIM_OUTPUTS
from paraspace.kernels.training import OUTPUTS
from paraspace.results import schema
from paraspace.spaces.encode import DIMENSION_NAMES

SUFFIX_UNITS = {"_s": "s", "_bytes": "bytes", "_per_s_per_gpu": "tokens/s", "_per_step": "FLOP"}


def test_kernel_outputs_are_the_metric_columns():
    """Every column the two tiers compute, and the band beside them, is described once
    in results.schema, and nothing else is."""
    assert not set(OUTPUTS) & set(SIM_OUTPUTS)
    assert set(OUTPUTS) | set(SIM_OUTPUTS) | set(schema.BAND_COLUMNS) == set(schema.METRIC_NAMES)
    assert len(schema.METRIC_NAMES) == len(set(schema.METRIC_NAMES))


def test_units_match_name_suffixes():
    for col in schema.METRICS:
        for suffix, unit in SUFFIX_UNITS.items():
            if col.name.endswith(suffix):
                assert col.unit == unit, col.name
        assert col.doc


def test_result_schema_layout():
    s = result_schema()
    assert s.names == ["row_id", *DIMENSION_NAMES, "n_microbatches", *schema.METRIC_NAMES]
    assert len(set(s.names)) == len(s.names)
    types = dict(zip(s.names, s.types))
    assert types["recompute"] == pa.dictionary(pa.int8(), pa.string())
    assert types["sequence_parallel"] == pa.bool_()
    assert types["tp"] == pa.int32()
    assert types["feasible"] == pa.bool_()


def test_strategy_columns_follow_the_dimension_table():
    assert [name for name, _, _ in strategy_columns()] == list(DIMENSION_NAMES)


def test_every_breakdown_column_names_the_kernels_that_produce_it():
    """Time and memory breakdown columns carry ``kernel``: the kernels/ functions
    behind them, each of which must exist (so the names cannot rot)."""
    import importlib
    import re

    from paraspace.results import schema

    breakdown = [c for c in schema.METRICS if c.unit in ("s", "bytes") and c.name not in ("mem_overhead_bytes",)]
    assert breakdown
    for col in breakdown:
        assert col.kernel, col.name
        module = None
        for ref in re.findall(r"kernels\.\w+(?:\.\w+)?|\b\w+_s\b|\b\w+_bytes\w*\b", col.kernel):
            if ref.startswith("kernels."):
                parts = ref.split(".")
                module = importlib.import_module("paraspace." + ".".join(parts[:2]))
                if len(parts) == 3:
                    assert hasattr(module, parts[2]), (col.name, ref)
            elif module is not None and ref in dir(module):
                assert callable(getattr(module, ref)), (col.name, ref)
