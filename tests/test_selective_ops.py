"""Per-op selective activation checkpointing (``recompute = selective-ops``):
torchtitan's ``op`` policy keeps every other GEMM output of a layer in forward
order (Q, K, V, O, gate, up, down: the 1st, 3rd, 5th and 7th) with the attention
output, and its early-stopping recompute redoes the rest the backward reads: the
K projection, the output projection (its output feeds the residual add under the
second norm), a gated MLP's up projection, the norms, residual adds and the
activation function. Activation bytes by hand, the time and memory order against
the other modes, a sweep over them, and ``validate``, which does not read rows as it."""

from __future__ import annotations

import csv

import polars as pl
import pytest
from click.testing import CliRunner
from test_memory_variants import llama, run  # noqa: F401  (the module's fixture)
from test_rows_as_data import ROW

from paraspace.explorer import validate
from paraspace.explorer.cli import main
from paraspace.kernels.codes import (
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    RECOMPUTE_NORMS,
    RECOMPUTE_SELECTIVE,
    RECOMPUTE_SELECTIVE_OPS,
)
from paraspace.kernels.training import activation_bytes_per_layer


def test_llama_layer_activation_bytes_by_hand(llama3_8b):
    """Llama 3 8B (h 4096, 32 heads, 8 KV heads of 128, gated ffn 14336, no
    dropout), one sequence of 4096 tokens, t = 1, FlashAttention, 2-byte
    activations: 4096 x 2 = 8,192 bytes per kept column.
    none: 4 h replicated (16,384) + Q, K, V, O 128 x (2 x 32 + 2 x 8) (10,240) +
    gate, up, product 3 x 14,336 (43,008) = 69,632 columns = 570,425,344 bytes;
    selective-ops: the layer input and the down projection's output 2 h (8,192) +
    Q, V, O 128 x (2 x 32 + 8) (9,216) + the gate output (14,336) = 31,744 columns
    = 260,046,848 bytes; both keep the fp32 log-sum-exp, 4 x 32 x 4096 = 524,288."""
    model = llama3_8b[0]
    none, ops = (activation_bytes_per_layer(1.0, 4096.0, 1.0, 1.0, False, r, True, model, 2.0)
                 for r in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE_OPS))
    assert none == 570_425_344 + 524_288
    assert ops == 260_046_848 + 524_288


def test_gpt3_layer_activation_bytes_by_hand(gpt3_175b):
    """GPT-3 (h 12288, 96 heads of 128, GeLU ffn 4h, dropout), s = 2048, b = 1, t = 1,
    no FlashAttention, in units of s b h bytes: the layer input 2 and the two
    dropout masks 2 (replicated), Q, V, O 3 h x 2 = 6, fc1's output 4 h x 2 = 8
    (fc2 is the 6th GEMM: not kept, and its output is not read by the backward),
    no scores (the unfused core runs again): 18, against none's 34 + 5 a s / h = 114."""
    sbh = 2048.0 * 12288.0
    model = gpt3_175b[0]
    ops = activation_bytes_per_layer(1.0, 2048.0, 1.0, 1.0, False, RECOMPUTE_SELECTIVE_OPS, False, model, 2.0)
    none = activation_bytes_per_layer(1.0, 2048.0, 1.0, 1.0, False, RECOMPUTE_NONE, False, model, 2.0)
    assert ops == pytest.approx(18 * sbh, rel=1e-14)
    assert none == pytest.approx(114 * sbh, rel=1e-14)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("flash", [False, True])
def test_selective_ops_keeps_less_than_the_partial_modes_and_more_than_full(gpt3_175b, llama3_8b, sp, flash):
    for model in (gpt3_175b[0], llama3_8b[0]):
        none, sel, norms, ops, full = (activation_bytes_per_layer(1.0, 4096.0, 8.0, 1.0, sp, r, flash, model, 2.0)
                                       for r in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_NORMS,
                                                 RECOMPUTE_SELECTIVE_OPS, RECOMPUTE_FULL))
        assert none >= sel > ops > full
        if not sp:
            assert norms > ops
        elif model.glu > 0 and flash:
            # t = 8 with SP: the down projection's output the policy keeps is TP's partial
            # sums, a whole h per token, against the norms' 2 h / 8
            assert norms < ops


def test_selective_ops_costs_between_selective_and_full(llama):
    """Llama 3 8B on one H100, one micro-batch of 4096 tokens: selective-ops redoes
    the attention's K and output projections, the up half of the gate + up GEMM
    and the elementwise work, more than the attention core alone (selective) and
    less than the whole forward (full); the step grows by exactly its recompute,
    and it keeps less than selective."""
    out = {r: run(*llama, recompute=r) for r in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_SELECTIVE_OPS,
                                                 RECOMPUTE_FULL)}
    rc = {r: o["recompute_s"] for r, o in out.items()}
    assert rc[RECOMPUTE_NONE] == 0.0
    assert rc[RECOMPUTE_SELECTIVE] < rc[RECOMPUTE_SELECTIVE_OPS] < rc[RECOMPUTE_FULL]
    # its GEMMs are 36.5% of the layer's GEMM FLOPs (k 4096 x 1024, o 4096^2, up 4096 x 14336 of
    # 218.1 M multiply-adds per token): well over a quarter of the forward, well under all of it
    assert 0.25 < rc[RECOMPUTE_SELECTIVE_OPS] / rc[RECOMPUTE_FULL] < 0.6
    gained = out[RECOMPUTE_SELECTIVE_OPS]["step_time_analytic_s"] - out[RECOMPUTE_NONE]["step_time_analytic_s"]
    assert gained == pytest.approx(rc[RECOMPUTE_SELECTIVE_OPS], rel=1e-9)
    assert out[RECOMPUTE_SELECTIVE_OPS]["mem_activations_bytes"] < out[RECOMPUTE_SELECTIVE]["mem_activations_bytes"]


def test_sweep_explores_selective_ops_end_to_end(tmp_path):
    """A TOML space over four recompute modes through ``paraspace sweep``: the
    column names the mode, and the rows order as the modes do (kept activations
    none = selective > selective-ops > full with FlashAttention; recompute time
    the other way round)."""
    toml = tmp_path / "ops.toml"
    toml.write_text('name = "ops"\ndescription = "recompute modes"\nmodel = "llama3-8b"\n'
                    'hardware = "h100-sxm5-80gb"\ndevices = 8\nglobal_batch = 32\nseq_len = 4096\n[dimensions]\n'
                    'tp = [1]\npp = [1]\nmicro_batch = [1]\nzero = [3]\n'
                    'recompute = ["none", "selective", "selective-ops", "full"]\n')
    out = tmp_path / "out" / "ops.parquet"
    result = CliRunner().invoke(main, ["sweep", str(toml), "--out", str(out), "--no-progress"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    frame = pl.read_parquet(out)
    by = {str(r["recompute"]): r for r in frame.iter_rows(named=True)}
    assert set(by) == {"none", "selective", "selective-ops", "full"}
    acts = {k: r["mem_activations_bytes"] for k, r in by.items()}
    assert acts["none"] == acts["selective"] > acts["selective-ops"] > acts["full"]
    rc = {k: r["recompute_s"] for k, r in by.items()}
    assert rc["none"] == 0.0 < rc["selective"] < rc["selective-ops"] < rc["full"]


def test_validate_does_not_read_selective_or_empty_as_the_per_op_policy(tmp_path):
    """The schema's ``selective`` is predicted as Megatron's attention-core recompute,
    and an EMPTY recompute is searched over every mode but selective-ops
    (docs/validation.md says why)."""
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(ROW))
        writer.writeheader()
        writer.writerow({**ROW, "id": "sel", "recompute": "selective"})
        writer.writerow({**ROW, "id": "empty", "recompute": "", "micro_batch": "6", "global_batch": "48"})
    sel, empty = validate.run(path)[1]
    assert "recompute" not in sel.chosen
    assert empty.chosen["recompute"] != "selective-ops"
    assert "selective-ops" not in validate.UNKNOWN_SEARCH["recompute"]
