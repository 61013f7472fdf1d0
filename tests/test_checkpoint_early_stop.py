"""Full recompute under PyTorch's non-reentrant checkpoint (``SpaceSpec.checkpoint =
"early-stop"``): the recompute stops once the last tensor the backward reads is
rebuilt, the down projection's input, so the down projection is not rerun.
Megatron's and DeepSpeed's (reentrant) checkpointing rerun the whole forward, the
default. Measured whole on an H100 and an H200 (``docs/measurements``, ``layer.csv``):
0.68-0.94 of a forward on MPT-7B blocks, whose down projection is a third of the GEMMs.
``validate`` reads ZeRO-3 rows so (FSDP trainers' checkpoint; ``validate.FULLY_SHARDED``
says what it did to the figures) and every other row with the default."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_device_measurements import _layer_model, rows
from test_memory_variants import run
from test_validate import ROW

from paraspace.explorer import validate
from paraspace.kernels import params
from paraspace.kernels.attention import attention_s
from paraspace.kernels.codes import RECOMPUTE_FULL, RECOMPUTE_NONE, RECOMPUTE_NORMS, RECOMPUTE_SELECTIVE, \
    RECOMPUTE_SELECTIVE_OPS
from paraspace.kernels.mlp import dense_mlp_s
from paraspace.kernels.recompute import recompute_s
from paraspace.kernels.shape import shape_of



def layer_parts(h100, model, work):
    """(shape, Attention, Mlp, forward seconds) of one layer, t = 1, one sequence."""
    sh = shape_of(1, 1, 1, 1, 1, 1, 1, 0, model, h100.device[0], work)
    att = attention_s(sh, model, h100.device[0], h100.tiles, work)
    mlp = dense_mlp_s(sh, model, h100.device[0], h100.tiles)
    return sh, att, mlp, att.part_f + mlp.up_f + mlp.down_f + mlp.act


def test_early_stop_skips_the_down_projection(h100, llama3_8b, make_workload):
    """Llama 3 8B, one sequence of 4,096 tokens on one H100: full recompute adds the
    layer's forward, or with early stop the forward less the down projection's GEMM
    (4,096 x 4,096 x 14,336); its TP and CP traffic is the same. No other mode moves."""
    model = llama3_8b[0]
    sh, att, mlp, fwd = layer_parts(h100, model, make_workload()[0])
    dev = h100.device[0]
    full = recompute_s(RECOMPUTE_FULL, sh, fwd, 0.5, 0.25, att, mlp, model, dev, 0.0)
    early = recompute_s(RECOMPUTE_FULL, sh, fwd, 0.5, 0.25, att, mlp, model, dev, 1.0)
    assert full == (fwd, 0.75)
    assert early == (fwd - mlp.down_f, 0.75)
    assert 0.2 < mlp.down_f / fwd < 0.3  # 14,336 of the layer's 53,248 GEMM columns x k, plus attention
    for mode in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_NORMS, RECOMPUTE_SELECTIVE_OPS):
        assert recompute_s(mode, sh, fwd, 0.5, 0.25, att, mlp, model, dev, 1.0) == \
            recompute_s(mode, sh, fwd, 0.5, 0.25, att, mlp, model, dev, 0.0)


def test_early_stop_against_the_measured_mpt_blocks():
    """``layer.csv``'s MPT-7B blocks (1K-8K tokens, FlashAttention-2 and cuDNN, H100 and
    H200: 12 rows): what full recompute added to the step, over the forward, measured
    0.68-0.94, median 0.76. The kernels' reentrant recompute adds 1.0 (the whole
    forward), above 11 of the 12; early stop adds 1 - down projection / forward,
    0.70-0.73, inside the measured range and within 0.07 of its median."""
    measured, early = [], []
    for card in ("h100-sxm5-80gb", "h200-sxm-141gb"):
        by = {(r["seq"], r["backend"], r["recompute"]): r for r in rows(card, "layer.csv") if r["label"] == "mpt-7b"}
        for (seq, backend, mode), r in by.items():
            if mode != "none":
                continue
            measured.append((float(by[(seq, backend, "full")]["step_s"]) - float(r["step_s"])) / float(r["fwd_s"]))
            fwd, step, _ = _layer_model(card, r)
            whole = (_layer_model(card, by[(seq, backend, "full")])[1] - step) / fwd
            assert whole == pytest.approx(1.0, rel=1e-12)
            early.append((_layer_model(card, by[(seq, backend, "full")], early_stop=1.0)[1] - step) / fwd)
    assert len(measured) == 12
    assert 0.65 < min(measured) and max(measured) < 0.95 and sum(m < 1.0 for m in measured) == 12
    assert sum(m < 0.9 for m in measured) >= 11
    assert min(measured) < min(early) and max(early) < max(measured)
    assert abs(statistics.median(early) - statistics.median(measured)) < 0.07


@pytest.mark.parametrize("recompute", [RECOMPUTE_FULL, RECOMPUTE_SELECTIVE])
def test_a_step_saves_the_down_projection_per_recomputed_layer(h100, llama3_8b, make_workload, recompute):
    """Llama 3 8B's 32 layers on one H100, 16 micro-batches of one 4,096-token sequence:
    with full recompute early stop takes 32 x 16 down projections off the recompute
    column (and the step); selective recompute is unchanged."""
    model = llama3_8b[0]
    base, early = (run(llama3_8b, h100.device, h100.tiers, h100.tiles,
                       make_workload(global_batch=16.0, checkpoint_early_stop=e), recompute=recompute, n_micro=16)
                   for e in (0.0, 1.0))
    _, _, mlp, _ = layer_parts(h100, model, make_workload()[0])
    if recompute == RECOMPUTE_FULL:
        assert base["recompute_s"] - early["recompute_s"] == pytest.approx(32 * 16 * mlp.down_f, rel=1e-9)
        assert early["step_time_analytic_s"] < base["step_time_analytic_s"]
    else:
        assert early == base


@settings(max_examples=50, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), mb=st.integers(1, 4),
       recompute=st.sampled_from([RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL, RECOMPUTE_NORMS,
                                  RECOMPUTE_SELECTIVE_OPS]), rc_layers=st.sampled_from([0, 2, 8]))
def test_early_stop_is_never_slower_and_keeps_memory(h100, llama3_8b, make_workload, tp, pp, mb, recompute,
                                                     rc_layers):
    """Fuzz over the strategy: early stop never lengthens a step nor changes its memory
    (it recomputes less; what the layer keeps is the same)."""
    work = {e: make_workload(global_batch=16.0, checkpoint_early_stop=e) for e in (0.0, 1.0)}
    base, early = (run(llama3_8b, h100.device, h100.tiers, h100.tiles, work[e], tp=tp, pp=pp, mb=mb,
                       recompute=recompute, rc_layers=rc_layers, n_micro=16 // mb) for e in (0.0, 1.0))
    assert early["step_time_analytic_s"] <= base["step_time_analytic_s"]
    assert early["mem_peak_bytes"] == base["mem_peak_bytes"]


def test_the_default_reruns_the_whole_forward():
    from paraspace.spaces.schema import SpaceSpec

    assert SpaceSpec.model_fields["checkpoint"].default == "reentrant"
    assert params.DEFAULTS["checkpoint_early_stop"] == 0.0


@pytest.mark.parametrize(("zero", "checkpoint"), [("3", "early-stop"), ("2", "reentrant"), ("1", "reentrant"),
                                                  ("0", "reentrant")])
def test_validate_reads_zero3_rows_with_the_early_stopping_checkpoint(zero, checkpoint):
    """No column names the trainer; ZeRO-3 (FULL_SHARD) rows are FSDP trainers' (PyTorch's
    non-reentrant checkpoint, ``validate.FULLY_SHARDED``), the others rerun the whole
    forward as Megatron and DeepSpeed do."""
    row = {**ROW, "zero": zero, "recompute": "full", "attention": "flash2", "head_dim": "", "qk_nope_head_dim": "",
           "v_head_dim": ""}
    space, _ = validate.training_space(row, "test.csv")
    assert space.spec.checkpoint == checkpoint


def test_a_zero3_row_full_recompute_is_priced_without_the_down_projection():
    """A ZeRO-3 row with full recompute, evaluated as validate reads it and again with
    the reentrant checkpoint: every candidate is faster by the recompute's down
    projections, and its memory is the same."""
    import dataclasses

    from paraspace.explorer.evaluate import evaluate, pack
    from paraspace.spaces.encode import Encoder

    row = {**ROW, "zero": "3", "recompute": "full", "attention": "flash2", "head_dim": "", "qk_nope_head_dim": "",
           "v_head_dim": ""}
    space, _ = validate.training_space(row, "test.csv")
    assert space.spec.checkpoint == "early-stop"
    whole = dataclasses.replace(space, spec=space.spec.model_copy(update={"checkpoint": "reentrant"}))
    enc = Encoder(space).encode_all()
    early, base = evaluate(pack(space), enc.columns), evaluate(pack(whole), enc.columns)
    assert enc.n_rows > 0
    assert np.all(early["step_time_s"] < base["step_time_s"])
    np.testing.assert_array_equal(early["mem_peak_bytes"], base["mem_peak_bytes"])
