"""The loss's memory (``SpaceSpec.cross_entropy``): Megatron's fused vocab-parallel
cross-entropy works in place on one fp32 copy of the logits (4 bytes per
element); PyTorch's ``cross_entropy`` over the upcast logits keeps the fp32
log-softmax for its backward, which then holds it with the fp32 gradient coming
in and the one going out (12). At long sequences and large vocabularies that is
tens of GiB: torchtitan's Llama 3.1 8B on 32K tokens per GPU measured 83.9 GiB
against 49 GiB predicted with the fused loss (docs/validation.md)."""

from __future__ import annotations

import polars as pl
import pytest
from click.testing import CliRunner
from test_memory_variants import run

from paraspace.explorer.cli import main
from paraspace.kernels import params
from paraspace.spaces.catalog import space_from_raw
from paraspace.spaces.errors import CatalogError

VOCAB = 128_256  # Llama 3


@pytest.fixture(scope="module")
def llama_32k(h100, llama3_8b):
    return llama3_8b, h100.device, h100.tiers, h100.tiles


@pytest.mark.parametrize("tp", [1, 4])
def test_unfused_loss_holds_eight_more_bytes_per_logit(llama_32k, make_workload, tp):
    """One sequence of 32,768 tokens on one pipeline stage: tokens x vocab / t logit
    elements per device, 32,768 x 128,256 = 4,202,692,608 at t = 1; the unfused loss
    holds 12 - 4 = 8 bytes more of each: 33,621,540,864 bytes (31.3 GiB) at t = 1,
    a quarter of it at t = 4. Nothing else changes, step time included."""
    model, dev, tiers, tiles = llama_32k
    fused, unfused = (run(model, dev, tiers, tiles, make_workload(seq_len=32768.0, global_batch=8.0,
                                                                  loss_bytes=params.LOSS_BYTES[k]), tp=tp)
                      for k in ("fused", "unfused"))
    extra = 8 * 32_768 * VOCAB / tp
    assert 8 * 32_768 * VOCAB == 33_621_540_864
    assert unfused["mem_activations_bytes"] - fused["mem_activations_bytes"] == pytest.approx(extra, rel=1e-12)
    assert unfused["mem_peak_bytes"] > fused["mem_peak_bytes"]
    assert unfused["step_time_analytic_s"] == fused["step_time_analytic_s"]


def test_only_the_last_stage_holds_the_loss(llama_32k, make_workload):
    """With four pipeline stages the loss lives on the last one: the peak stage's
    activations grow by at most the 8 extra bytes per logit element."""
    model, dev, tiers, tiles = llama_32k
    work = {k: make_workload(seq_len=8192.0, global_batch=32.0, loss_bytes=params.LOSS_BYTES[k])
            for k in ("fused", "unfused")}
    fused, unfused = (run(model, dev, tiers, tiles, work[k], pp=4) for k in ("fused", "unfused"))
    assert 0 < unfused["mem_peak_bytes"] - fused["mem_peak_bytes"] <= 8 * 8192 * VOCAB * (1 + 1e-12)


def test_the_schema_names_every_loss_the_kernels_size():
    """One list of losses: the space field's choices are LOSS_BYTES' keys."""
    from typing import get_args

    from paraspace.spaces.schema import SpaceSpec

    assert set(get_args(SpaceSpec.model_fields["cross_entropy"].annotation)) == set(params.LOSS_BYTES)
    assert params.DEFAULTS["loss_bytes"] == params.LOSS_BYTES[SpaceSpec.model_fields["cross_entropy"].default]


@pytest.mark.parametrize(("field", "good", "bad"), [("cross_entropy", "unfused", "chunked"),
                                                    ("elementwise", "eager", "compiled"),
                                                    ("checkpoint", "early-stop", "selective"),
                                                    ("zero3_shard", "master", "fp32")])
def test_a_space_sets_a_framework_setting_and_a_bad_value_is_named(tmp_path, field, good, bad):
    """The loss, the elementwise ops (``tests/test_eager_elementwise.py``), the
    checkpoint (``tests/test_checkpoint_early_stop.py``) and the ZeRO-3 shard
    (``tests/test_fsdp_shard_memory.py``): a space's value is kept, a value
    the schema does not name is refused with the field and value."""
    raw = {"name": "setting", "description": "a memory setting", "model": "llama3-8b", "hardware": "h100-sxm5-80gb",
           "devices": 8, "global_batch": 8, "seq_len": 8192, field: good, "dimensions": {"tp": [1], "pp": [1]}}
    assert getattr(space_from_raw(raw, "test", tmp_path).spec, field) == good
    with pytest.raises(CatalogError) as err:
        space_from_raw({**raw, field: bad}, "test", tmp_path)
    assert field in str(err.value) and bad in str(err.value)


def sweep_one(tmp_path, field: str, value: str, recompute: str) -> pl.DataFrame:
    """``paraspace sweep`` end to end of Llama 3 8B on 8 H100 with FSDP, one sequence of
    8,192 tokens a GPU at t = 1, the space's ``field`` set to ``value``: its Parquet rows."""
    toml = tmp_path / f"{field}-{value}.toml"
    toml.write_text(f'name = "{value}"\ndescription = "{field}"\nmodel = "llama3-8b"\nhardware = "h100-sxm5-80gb"\n'
                    f'devices = 8\nglobal_batch = 8\nseq_len = 8192\n{field} = "{value}"\n[dimensions]\n'
                    f'tp = [1]\npp = [1]\nmicro_batch = [1]\nzero = [3]\nrecompute = ["{recompute}"]\n')
    out = tmp_path / "out" / f"{field}-{value}.parquet"
    result = CliRunner().invoke(main, ["sweep", str(toml), "--out", str(out), "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return pl.read_parquet(out)


def test_sweep_with_the_unfused_loss_needs_more_memory(tmp_path):
    """End to end: the same space through ``paraspace sweep`` with either loss; the
    unfused one's rows hold 8 x 8,192 x 128,256 bytes more on the device (t = 1)."""
    peaks = {kind: sweep_one(tmp_path, "cross_entropy", kind, "full")["mem_activations_bytes"][0]
             for kind in ("fused", "unfused")}
    assert peaks["unfused"] - peaks["fused"] == pytest.approx(8 * 8192 * VOCAB, rel=1e-12)
