"""``paraspace validate`` on the published measurements and on bad files."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from paraspace.explorer import validate
from paraspace.explorer.cli import main
from paraspace.explorer.evaluate import evaluate, pack
from paraspace.spaces.encode import Encoder
from paraspace.spaces.enums import Dispatch, Recompute, label

VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"
TRAINING = VALIDATION / "training.csv"
#: mean absolute error of the `ok` training rows may not exceed this; it only
#: moves down (24.5% with the datasheet profiles, 16.1% once gemm_max_efficiency
#: was calibrated on the MosaicML rows: see explorer/fit_published.py; 16.0% with
#: the FP8 cast passes, 15.3% once tp_overlap is searched as an unknown field,
#: 8.3% with the attention core at the 16-bit peak, llm-foundry's FA1-class
#: kernel and GEMM + FA1 efficiency fitted per family, and the NIC shared
#: without head-of-line blocking; 8.7% once attention's backward runs at 0.87 of its
#: forward rate: a correct kernel rate the catalog's gemm_max_efficiency, fitted
#: in sample under the old rate, does not yet absorb; held out, where the knob is
#: refitted, MosaicML improves 14.5% -> 13.4% and Narayanan 13.9% -> 13.6%); 8.2% once
#: fused attention's rate follows the keys per call and its plateaus are the ones
#: measured on an H100 (docs/measurements/; kernels.ops.loop_fill) and the GEMM
#: and FA1 knobs are refitted under it (H100 family 0.575 -> 0.625, A100 0.65 -> 0.675);
#: 8.0% once Hopper GEMMs pay the measured fill of their reduction length (128 BF16 /
#: 256 FP8 elements of k, the profile's gemm_k_fill_bytes) and the H100 family's GEMM
#: knob is refitted under it (0.625 -> 0.65); 6.9% once ZeRO-3 rows (MosaicML's
#: FSDP runs among them) price full recompute as PyTorch's non-reentrant checkpoint runs it,
#: without the down projection (validate.FULLY_SHARDED)
MAPE_OK_THRESHOLD = 0.070
#: the sources of the first version of training.csv (202 rows), whose ok rows the
#: threshold above was set on; the attention kernel now comes from the rows'
#: ``attention`` column, not from source names, and gives the same figure
FIRST_SOURCES = ("narayanan2021", "megatron-lm-readme-gpt3-example", "megatron-core-h100-table",
                 "megatron-core-moe-readme", "nemo-24.07-performance-summary", "megatron-lm-llama-fp8-table",
                 "mosaicml-llm-foundry")
#: every ok row of the second version (266 rows: torchtitan, KempnerForge, NeMo
#: Automodel, fms-fsdp added), in sample: 10.0%; 9.94% with the 500 W H100's sustained
#: clock and attention's backward rate; 9.52% with the measured attention rates; 9.41%
#: with the Hopper GEMMs' measured reduction fill; 9.30% once a MoE row silent on its
#: dispatcher may run DeepEP's hierarchical kernels; 9.27% once MLA attention runs the
#: FlashAttention-3 class, FA2 having no path for its unequal head dims; 8.71% once a ZeRO-3
#: row with tensor parallelism is priced without TP overlap (validate.FULLY_SHARDED: FSDP
#: trainers issue those collectives in line) rather than searched for it; 7.87% once ZeRO-3
#: rows price full recompute with PyTorch's early-stopping checkpoint (only moves down);
#: 7.81% over 233 rows once rows that say they ran without torch.compile price eager
#: PyTorch's elementwise ops and torchtitan's rows that name per-op SAC its policy (four
#: rows the attention-core reading put out of memory now predicted: validate.eager_ops,
#: validate.recompute_mode). One exception to "only down", said here: 8.01% over 236 rows
#: once ZeRO-3 rows store their shard as FSDP does (validate.FULLY_SHARDED): three rows that
#: ran, priced out of memory before, are predicted (-8%, +18%, -44%); the others unchanged;
#: 7.94% once ZeRO-3 rows whose notes name DeepSpeed are read as DeepSpeed runs them; 7.90%
#: once rows whose notes name FSDP are FSDP trainers' at any ZeRO stage (validate.fsdp_trainer).
#: One more exception, said here: 8.08% once an FSDP trainer's row defers its gradient
#: reduction over its micro-batches where the gradient fits (validate.FSDP_DEFER), as those
#: trainers do: memory MAPE 42.0% -> 25.5%, but KempnerForge's five Llama 3 70B rows, already
#: fast, lose three of their four reductions (-12..-18% -> -20..-24%). 7.94% once the LM head
#: runs in 16 bits under FP8 (layer_costs.end_stage_costs, gemm_passes_16bit_s; measured on whole
#: steps, docs/measurements train_fp8.csv): NeMo 24.07 7.8% -> 5.6%, torchtitan 2412 12.8% ->
#: 12.2%, the Megatron FP8 table's two rows +9% and +0% -> +12% and +7%
MAPE_OK_ALL_THRESHOLD = 0.0795
#: the issue's per-source target: no source's ok rows above this mean error
SOURCE_MAPE_OK_TARGET = 0.15

needs_data = pytest.mark.skipif(not TRAINING.is_file(), reason=f"{TRAINING} not present (shared/ beside the checkout)")

ROW = {
    "id": "t-1", "source": "test", "ref": "here", "quality": "ok", "model": "GPT small", "layers": "24",
    "hidden": "2048", "heads": "16", "kv_heads": "16", "ffn": "8192", "vocab": "51200", "seq": "2048", "glu": "0",
    "n_experts": "", "topk": "", "expert_ffn": "", "n_shared_experts": "", "first_dense_layers": "", "mla": "0",
    "q_lora_rank": "", "kv_lora_rank": "", "rope_head_dim": "", "gpu": "a100-sxm4-80gb", "n_gpus": "16",
    "gpus_per_node": "8", "tp": "2", "pp": "2", "dp": "4", "cp": "1", "ep": "1", "vpp": "1", "micro_batch": "",
    "global_batch": "64", "sequence_parallel": "0", "recompute": "none", "zero": "1", "dtype": "bf16",
    "metric": "step_time_s", "value": "1.0", "step_time_s": "1.0", "derivation": "published", "notes": "",
}


def write(tmp_path: Path, rows: list[dict], name: str = "t.csv", drop: str | None = None,
          fields: list[str] | None = None) -> Path:
    path = tmp_path / name
    fields = [k for k in (fields or ROW) if k != drop]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def training_results():
    if not TRAINING.is_file():
        pytest.skip(f"{TRAINING} not present (shared/ beside the checkout)")
    return validate.run(TRAINING)[1]


def test_published_training_rows_within_threshold(training_results):
    results = training_results
    assert len(results) == 266
    stats = validate.summary(results)
    assert stats["ok"]["n"] >= 225
    assert stats["ok"]["mape"] <= MAPE_OK_ALL_THRESHOLD, stats["ok"]
    first = validate.summary([r for r in results if r.source in FIRST_SOURCES])
    assert first["ok"]["n"] >= 180
    assert first["ok"]["mape"] <= MAPE_OK_THRESHOLD, first["ok"]
    # every row is predicted (MLA, MoE, 4-GPU nodes and the 96 GB H100 included), some out of memory
    assert sum(stats["status"].values()) == 266
    assert stats["status"]["unsupported"] == 0 and stats["status"]["no-candidate"] == 0


#: in sample, the sources above issue 14's 15%: KempnerForge 13.5% -> 15.29% once its rows
#: defer their gradient reduction as its trainer does (validate.FSDP_DEFER; an exception, said
#: here: its Llama 3 70B rows, already predicted fast, lose three of four reductions)
SOURCE_CEILINGS = {"kempnerforge-h200": 0.153}


def test_every_source_within_the_target(training_results):
    """In sample, every source's ok rows within issue 14's 15% but those ``SOURCE_CEILINGS``
    names (torchtitan on the 500 W H100 came under it, 17.1% -> 12.8%, once its rows run eager
    ops and per-op SAC where their notes say so; held out, ``LOSO_SOURCE_CEILINGS`` names the
    ones above it)."""
    stats = validate.summary(training_results)
    ok_sources = {k: v for k, v in stats["by_source"].items() if not k.endswith("(uncertain)")}
    assert len(ok_sources) >= 10
    assert all(v["mape"] <= SOURCE_CEILINGS.get(k, SOURCE_MAPE_OK_TARGET) for k, v in ok_sources.items()), ok_sources


@pytest.mark.parametrize(("zero", "overlap", "searched"), [("3", [False], False), ("1", [False, True], True),
                                                          ("", [False, True], True)])
def test_a_fully_sharded_tp_row_runs_its_tp_collectives_in_line(tmp_path, zero, overlap, searched):
    """A row silent on sequence parallelism may run it, and with it Megatron-Core's TP
    overlap, which the search considers. A ZeRO-3 (FSDP) row with TP is not searched for
    the overlap: FSDP trainers issue their TP collectives in line (validate.FULLY_SHARDED).
    The same row under ZeRO-1, or silent on its ZeRO stage, is. Priced in line, the ZeRO-3
    row is no faster than the same row would be with the overlap searched."""
    row = {**ROW, "zero": zero, "sequence_parallel": ""}
    space, found = validate.training_space(row, "test")
    assert list(space.spec.dimensions.tp_overlap) == overlap
    assert ("tp_overlap" in found) == searched
    if zero == "3":
        (in_line,) = validate.run(write(tmp_path, [row]))[1]
        assert in_line.status == "ok" and "tp_overlap" not in in_line.chosen
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(validate, "FULLY_SHARDED", -1)
            (searched_row,) = validate.run(write(tmp_path, [row], name="s.csv"))[1]
        assert in_line.predicted >= searched_row.predicted


@pytest.mark.parametrize(("notes", "fsdp"), [("FSDP2; TP via DTensor with SequenceParallel on norms", True),
                                             ("PyTorch FSDP FULL_SHARD (Composer)", True),
                                             ("Megatron-LM, distributed optimizer", False), ("", False)])
def test_a_row_whose_notes_name_fsdp_is_an_fsdp_trainers_at_any_zero_stage(notes, fsdp):
    """KempnerForge's "fsdp1" runs have one data-parallel rank, so their ``zero`` column is 0,
    but their notes say FSDP2 with DTensor TP: an FSDP trainer's row, whose TP collectives run
    in line (not searched for Megatron's overlap) and whose full recompute is PyTorch's
    early-stopping checkpoint, as its ZeRO-3 rows are (validate.fsdp_trainer)."""
    assert validate.fsdp_trainer(notes) == fsdp
    row = {**ROW, "n_gpus": "2", "tp": "2", "pp": "1", "dp": "1", "zero": "0", "sequence_parallel": "1",
           "recompute": "full", "notes": notes}
    space, found = validate.training_space(row, "test")
    assert list(space.spec.dimensions.tp_overlap) == ([False] if fsdp else [False, True])
    assert ("tp_overlap" in found) != fsdp
    assert space.spec.checkpoint == ("early-stop" if fsdp else "reentrant")


#: the GPT small of ``ROW``: 24 layers of 12 h^2 + 13 h parameters, the V x h embedding and
#: the final norm's 2 h, h = 2048, V = 51,200
GPT_SMALL_PARAMS = 24 * (12 * 2048**2 + 13 * 2048) + 51200 * 2048 + 2 * 2048


def test_an_fsdp_trainers_row_reduces_its_accumulated_gradient_once_where_it_fits(tmp_path):
    """FSDP trainers accumulate their micro-batches' gradients unsharded and reduce them after
    the last (validate.FSDP_DEFER). The row: GPT small, FSDP over 16 ranks, micro-batches of 2
    in a batch of 64, so 64 / (2 x 16) = 2 per step. Deferred, the whole gradient is held in
    fp32: 4 x 1,313,460,224 = 5,253,840,896 bytes, against its 1/16 shard, 328,365,056, reduced
    every micro-batch; the step is no slower (it drops a reduction), so the deferred candidate
    is the prediction. With 160 layers on a 40 GB A100 the deferred gradient (8.16e9
    parameters, 32.6 GB) does not fit and the row falls back to reducing every micro-batch; at
    one micro-batch per step there is nothing to defer (the space's rule drops it)."""
    assert GPT_SMALL_PARAMS == 1_313_460_224
    row = {**ROW, "tp": "1", "pp": "1", "dp": "16", "zero": "3", "micro_batch": "2", "notes": "PyTorch FSDP2"}
    space, found = validate.training_space(row, "t")
    assert found["defer_grad_sync"] == [True, False]
    enc = Encoder(space).encode_all()
    out = evaluate(pack(space), enc.columns)
    deferred = enc.columns["defer_grad_sync"] == 1
    assert out["mem_grads_bytes"][deferred] == pytest.approx([4.0 * GPT_SMALL_PARAMS], rel=1e-12)
    assert out["mem_grads_bytes"][~deferred] == pytest.approx([4.0 * GPT_SMALL_PARAMS / 16], rel=1e-12)
    assert out["step_time_s"][deferred][0] <= out["step_time_s"][~deferred][0]
    (result,) = validate.run(write(tmp_path, [row]))[1]
    assert result.status == "ok" and result.chosen == {"defer_grad_sync": True}
    assert result.mem_peak_bytes == pytest.approx(float(out["mem_peak_bytes"][deferred][0]), rel=1e-12)

    big = {**row, "id": "t-big", "layers": "160", "gpu": "a100-sxm4-40gb", "recompute": "full"}
    one = {**row, "id": "t-one", "micro_batch": "4"}  # 64 / (4 x 16) = 1 micro-batch a step
    fallback, single = validate.run(write(tmp_path, [big, one], name="b.csv"))[1]
    assert fallback.status == "ok" and fallback.chosen == {"defer_grad_sync": False}
    assert single.status == "ok" and single.chosen == {"defer_grad_sync": False}
    # a row whose notes name no FSDP trainer (ZeRO-1 here) is not read so
    assert "defer_grad_sync" not in validate.training_space(ROW, "t")[1]


def test_unknown_micro_batch_is_searched_and_the_fastest_chosen(tmp_path):
    (result,) = validate.run(write(tmp_path, [ROW]))[1]
    assert result.status == "ok" and set(result.chosen) == {"micro_batch"}
    space, searched = validate.training_space(dict(ROW), "t")
    assert searched == {"micro_batch": [1, 2, 4, 8]}
    enc = Encoder(space).encode_all()
    out = evaluate(pack(space), enc.columns)
    fits = out["feasible"] > 0
    assert result.predicted == pytest.approx(float(np.min(out["step_time_s"][fits])), rel=1e-12)
    assert result.chosen["micro_batch"] == int(enc.columns["micro_batch"][fits][np.argmin(out["step_time_s"][fits])])
    assert result.error == pytest.approx(result.predicted - 1.0, rel=1e-12)


def test_moe_rows_are_predicted_with_the_expert_layout_searched(tmp_path):
    """EP EMPTY: searched over the sizes that divide the experts and the stage's
    ranks; the dispatcher (Megatron-Core's all-to-all or all-gather) too."""
    moe = {**ROW, "id": "moe", "n_experts": "8", "topk": "2", "expert_ffn": "8192", "n_shared_experts": "0",
           "first_dense_layers": "0", "ep": ""}
    kind, results = validate.run(write(tmp_path, [ROW, moe]))
    assert [r.status for r in results] == ["ok", "ok"]
    assert {"ep", "dispatch"} <= set(results[1].chosen)
    assert results[1].chosen["dispatch"] in validate.UNKNOWN_SEARCH["dispatch"]


def test_a_moe_row_silent_on_its_dispatcher_may_run_deepep_across_nodes(tmp_path):
    """No column names the token dispatcher, so a MoE row is searched over all-to-all,
    all-gather and DeepEP's hierarchical kernels (Megatron-Core's ``flex`` dispatcher,
    NeMo Automodel). EP16 over two nodes of 8 with 64 experts (4 a rank), top-8:
    all-to-all sends a token over the NIC once per rank of the other node holding one of
    its experts, 8 (1 - C(60,8) / C(64,8)) = 3.4 copies on average; DeepEP once per
    destination node, 1 - C(32,8) / C(64,8) = 0.997, and forwards inside it over NVLink.
    So the fastest layout, the prediction, is the hierarchical one, and it beats the best
    of the other two."""
    moe = {**ROW, "id": "moe16", "n_gpus": "16", "tp": "1", "pp": "1", "dp": "16", "n_experts": "64", "topk": "8",
           "expert_ffn": "2048", "n_shared_experts": "0", "first_dense_layers": "0", "ep": "16", "micro_batch": "1",
           "global_batch": "64", "zero": "1"}
    kind, results = validate.run(write(tmp_path, [moe]))
    assert results[0].status == "ok" and results[0].chosen["dispatch"] == "hierarchical"
    space, searched = validate.training_space(dict(moe), "t")
    assert searched["dispatch"] == ["alltoall", "allgather", "hierarchical"]
    enc = Encoder(space).encode_all()
    out = evaluate(pack(space), enc.columns)
    fits = out["feasible"] > 0
    flat = fits & (enc.columns["dispatch"] != int(Dispatch.HIERARCHICAL))
    assert results[0].predicted == pytest.approx(float(np.min(out["step_time_s"][fits])), rel=1e-12)
    assert results[0].predicted < float(np.min(out["step_time_s"][flat]))


def test_a_row_run_without_torch_compile_prices_eager_elementwise_ops():
    """torchtitan's and KempnerForge's rows say whether they compiled ("torch.compile=no",
    "torch.compile disabled for this experiment"): such a row runs its elementwise work as
    eager PyTorch ops (``SpaceSpec.elementwise = "eager"``, ``kernels.elementwise``), slower
    and keeping more than the fused default, which a row that says nothing keeps. Read
    from the notes, never the source: the same row is slower eager, with a higher peak."""
    assert validate.eager_ops("FSDP2 1D; torch.compile=no; Float8")
    assert validate.eager_ops("bf16; torch.compile; fused AdamW; torch.compile disabled for this experiment")
    assert validate.eager_ops("trained without torch.compile")
    assert validate.eager_ops("torch.compile: off")
    assert not validate.eager_ops("FSDP2 1D; torch.compile=yes")
    assert not validate.eager_ops("torch.compile + Float8 + AsyncTP")
    assert not validate.eager_ops("")
    fsdp = {**ROW, "id": "e", "tp": "1", "pp": "1", "dp": "16", "zero": "3", "micro_batch": "1",
            "recompute": "none", "glu": "1", "kv_heads": "4", "ffn": "5632"}
    spaces = {k: validate.training_space({**fsdp, "notes": notes}, "t")[0]
              for k, notes in (("fused", "torch.compile=yes"), ("eager", "torch.compile=no"))}
    assert spaces["fused"].spec.elementwise == "fused" and spaces["eager"].spec.elementwise == "eager"
    out = {k: evaluate(pack(sp), Encoder(sp).encode_all().columns) for k, sp in spaces.items()}
    assert out["eager"]["step_time_s"][0] > out["fused"]["step_time_s"][0]
    assert out["eager"]["mem_peak_bytes"][0] > out["fused"]["mem_peak_bytes"][0]


def test_selective_named_per_op_in_the_notes_is_torchtitans_policy():
    """``selective`` covers Megatron's attention-core recompute and torchtitan's per-op
    policy; torchtitan's rows name theirs ("per-op SAC", "AC=selective op") and are priced
    as ``selective-ops``; every other selective row stays the attention core, and no
    other mode is reread."""
    ops = label(Recompute.SELECTIVE_OPS)
    assert validate.recompute_mode("selective", "selective activation checkpointing (per-op SAC, default)") == ops
    assert validate.recompute_mode("selective", "FSDP2 on 64 A100 80GB; AC=selective op") == ops
    assert validate.recompute_mode("selective", "AC per llama3_8b.toml default (selective op)") == ops
    assert validate.recompute_mode("selective", "Megatron selective recompute") == "selective"
    assert validate.recompute_mode("selective", "AC=selective layer") == "selective"
    assert validate.recompute_mode("full", "per-op SAC") == "full"
    space, _ = validate.training_space({**ROW, "recompute": "selective", "notes": "AC=selective op"}, "t")
    assert space.spec.dimensions.recompute == (ops,)


def test_a_row_whose_router_was_forced_to_balance_routes_with_no_imbalance(tmp_path):
    """NeMo Automodel's rows say "fake balanced gate" (its ``fake_balanced_gate``: every
    expert gets the same tokens): such a row is priced with ``moe_imbalance`` 1.0, the
    others with natural top-k routing's busiest rank (``kernels.routing``). The same MoE
    row, a micro-batch of 1,024 tokens on each of 16 ranks (EP16, 64 experts, top-8):
    16,384 x 8 / 16 = 8,192 routed rows on the mean rank, more on the busiest; forced,
    exactly the mean, so faster. The phrase is read from the row's notes, not its source; a
    load-balancing loss is natural routing, and a dense row has nothing to balance."""
    assert validate.forced_balance("mock data; fake balanced gate; no grad clipping")
    assert validate.forced_balance("Forced-balanced router")
    assert not validate.forced_balance("load-balanced router, aux loss 1e-3")
    assert not validate.forced_balance("aux-loss-free balanced gate")
    moe = {**ROW, "id": "moe16", "n_gpus": "16", "tp": "1", "pp": "1", "dp": "16", "n_experts": "64", "topk": "8",
           "expert_ffn": "2048", "n_shared_experts": "0", "first_dense_layers": "0", "ep": "16", "micro_batch": "1",
           "global_batch": "64", "zero": "1", "seq": "1024"}
    forced = {**moe, "id": "forced", "notes": "fake balanced gate"}
    natural_space, _ = validate.training_space(dict(moe), "t")
    forced_space, _ = validate.training_space(dict(forced), "t")
    assert natural_space.spec.moe_imbalance is None and forced_space.spec.moe_imbalance == 1.0
    assert validate.training_space({**ROW, "notes": "fake balanced gate"}, "t")[0].spec.moe_imbalance is None
    kind, results = validate.run(write(tmp_path, [moe, forced]))
    assert [r.status for r in results] == ["ok", "ok"]
    assert results[1].predicted < results[0].predicted


def test_a_bad_header_is_an_error_for_the_file(tmp_path):
    path = write(tmp_path, [ROW], drop="global_batch")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert "header" in result.output and "training.csv columns" in result.output


@pytest.mark.parametrize(("header", "kind", "missing"), [
    ("id,source,quality,ep,tokens_per_rank,metric", "comm", "value"),
    ("id,source,quality,layers,hidden,heads,kv_heads,ffn,vocab,glu,n_gpus,tp,pp,input_len,output_len,value",
     "inference", "metric"),
    ("id,source,quality,metric,value,layers,hidden,heads,kv_heads,ffn,vocab,glu,n_gpus,tp,input_len,output_len",
     "inference", "pp"),
])
def test_a_comm_or_inference_file_without_a_needed_column_is_refused(tmp_path, header, kind, missing):
    """Without its measured value (or the metric, or a model column) a comm or inference
    file used to validate as "2 ok" rows with nothing compared: now one error naming the
    file, the first missing column and the columns expected."""
    path = tmp_path / "f.csv"
    path.write_text(header + "\n" + ",".join("1" for _ in header.split(",")) + "\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert str(path) in result.output and f"header = '{missing}'" in result.output
    assert f"{kind}.csv columns" in result.output


@pytest.mark.parametrize(("change", "needles"), [
    ({"gpu": "b200"}, ["row t-1", "gpu", "'b200'", "a100-sxm4-80gb"]),
    ({"tp": "two"}, ["row t-1", "tp", "'two'", "number"]),
    ({"dp": "3"}, ["row t-1", "dp = 3", "tp*pp*dp*cp == n_gpus = 16"]),
    ({"recompute": "partial"}, ["row t-1", "recompute", "'partial'"]),
    ({"glu": "7"}, ["row t-1: glu", "'7'", "0 or 1"]),
    ({"layers": ""}, ["row t-1", "layers", "EMPTY is not allowed"]),
    ({"step_time_s": "0"}, ["row t-1: step_time_s", "'0'", "a positive number"]),
    ({"step_time_s": "-2"}, ["row t-1: step_time_s", "'-2'", "a positive number"]),
    ({"step_time_s": "nan"}, ["row t-1: step_time_s", "'nan'", "a finite number"]),
    ({"hidden": "1e300"}, ["row t-1: hidden", "a whole number from 0 to 2^53"]),
    ({"attention": "flash9"}, ["row t-1", "attention", "'flash9'", "unfused"]),
    ({"metric": "bogus"}, ["row t-1: metric = 'bogus'", "expected one of ['step_time_s', 'tokens_per_s_per_gpu', "
                                                        "'tflops_per_gpu', 'mfu']"]),
])
def test_a_bad_row_is_unsupported_with_its_reason_and_the_rest_predicted(tmp_path, change, needles):
    """A row the schema refuses gets status unsupported and the reason (field, value,
    what was expected); the other rows of the file are still predicted."""
    path = write(tmp_path, [{**ROW, **change}, {**ROW, "id": "t-2"}], fields=[*ROW, "attention"])
    bad, good = validate.run(path)[1]
    assert bad.status == "unsupported" and good.status == "ok"
    for needle in needles:
        assert needle in bad.reason
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "unsupported: " + bad.reason in result.output and "Traceback" not in result.output
    data = json.loads(CliRunner().invoke(main, ["validate", str(path), "--json"]).stdout)
    assert data["rows"][0]["status"] == "unsupported" and data["rows"][0]["reason"] == bad.reason


@pytest.mark.parametrize(("change", "rule"), [
    ({"micro_batch": "3"}, "dp*micro_batch does not divide global_batch (rule batch)"),
    ({"tp": "3", "pp": "1", "dp": "1", "n_gpus": "3"}, "tp does not divide heads, kv_heads and ffn (rule tp_heads)"),
])
def test_a_row_without_a_valid_configuration_says_which_rule_dropped_it(change, rule):
    """A row whose columns no configuration can run (a micro-batch that does not divide the
    batch, a tp the heads cannot split) is no-candidate, the reason naming the rule that
    dropped its combinations (it was empty)."""
    result = validate.predict_row(validate.predict_training, {**ROW, **change}, "inline.csv")
    assert result.status == "no-candidate" and result.predicted is None
    assert result.reason == f"no configuration of the row's columns is valid: {rule}"


@pytest.mark.parametrize(("contents", "needle"), [
    (b"", "(empty)"),
    (b"\xff\xfe\x00garbage\x00", "UTF-8"),
    (b"just one line with no id column\n1\n", "header"),
    # a file cut inside a quoted field (the audit's head -c 3000 of training.csv): the line, not the field
    (b'id,source,notes\nr1,s,n\nr2,s,"a note that is cut', "line 3 = 'unexpected end of data': expected a "
     "comma-separated row"),
    (b"id,source,notes\nr1,s,n\nr2,s,n,x,y\n", "line 3 = '5 fields (the header has 3)'"),
])
def test_unreadable_files_are_one_clear_error(tmp_path, contents, needle):
    path = tmp_path / "bad.csv"
    path.write_bytes(contents)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and needle in result.output and "Traceback" not in result.output


def test_cli_json_and_table(tmp_path):
    path = write(tmp_path, [ROW])
    result = CliRunner().invoke(main, ["validate", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (row,) = data["rows"]
    assert set(row) >= {"id", "metric", "measured", "predicted", "error", "band"}
    lo, hi = row["band"]
    assert lo < row["predicted"] < hi
    assert data["summary"]["ok"]["n"] == 1
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert "MAPE" in result.output and "t-1" in result.output


#: mean absolute error of the DeepEP ok rows (committed; only moves down): 20.6%,
#: then 13.9% once internode bandwidth counts the own node as DeepEP's test does
COMM_MAPE_OK_THRESHOLD = 0.14


@needs_data
def test_deepep_rows_are_predicted_by_the_dispatch_kernels():
    kind, results = validate.run(VALIDATION / "comm.csv")
    assert kind == "comm" and len(results) == 24 and {r.status for r in results} == {"ok"}
    stats = validate.summary(results)
    assert stats["ok"]["n"] == 20
    assert stats["ok"]["mape"] <= COMM_MAPE_OK_THRESHOLD, stats["ok"]
    by_id = {r.id: r for r in results}
    # one node: NVLink-bound, H800 NVLink 200 GB/s x 0.8 = 160 GB/s less the latency steps
    assert by_id["deepep-v1-normal-dispatch-ep8"].predicted == pytest.approx(153, rel=0.05)
    assert by_id["deepep-v1-normal-dispatch-ep8"].chosen["algorithm"] == "hierarchical"
    assert by_id["deepep-v1-ll-dispatch-ep64"].chosen["algorithm"] == "low-latency"


#: a DeepEP row's fixed columns (H800 nodes of 8, DeepSeek-V3's hidden size and routing)
COMM_ROW = {"source": "s", "quality": "ok", "op": "dispatch", "gpus_per_node": "8", "gpu": "h800-sxm5-80gb",
            "hidden": "7168", "topk": "8", "n_experts": "256", "dispatch_dtype": "fp8", "combine_dtype": "bf16"}


def predict_comm_row(tmp_path: Path, row: dict) -> validate.RowResult:
    """``row`` written as a one-row comm.csv and predicted."""
    path = tmp_path / "comm.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    (result,) = validate.run(path)[1]
    return result


def test_comm_rows_by_hand(tmp_path):
    """Low-latency dispatch on 2 nodes x 8 H800, 128 tokens x 7168 fp8 = 917,504 B:
    every copy over the NIC to the ranks hosting a token's experts, 15 x (1 -
    C(240, 8) / C(256, 8)) of them, at 50 GB/s x 0.9, plus one 6 us latency."""
    import math

    row = {**COMM_ROW, "id": "c", "mode": "low_latency", "ep": "16", "n_nodes": "2", "tokens_per_rank": "128",
           "metric": "latency_us", "value": "118"}
    result = predict_comm_row(tmp_path, row)
    ranks = 15 * (1 - math.comb(240, 8) / math.comb(256, 8))
    assert result.predicted == pytest.approx((ranks * 917_504 / 45e9 + 6e-6) * 1e6, rel=1e-12)
    bad = tmp_path / "bad.csv"
    with bad.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(row))
        writer.writeheader()
        writer.writerow({**row, "ep": "12"})
    (result,) = validate.run(bad)[1]
    assert result.status == "unsupported"
    assert "ep = 12" in result.reason and "n_nodes * gpus_per_node = 16" in result.reason


def test_internode_normal_bandwidth_counts_the_own_node_as_deepep_does(tmp_path):
    """Normal dispatch on 4 nodes x 8 H800 (EP32; top-4 node groups = every node),
    4096 tokens x 7168 fp8 = 29,360,128 B per rank. A node is hit with probability
    p_n = 1 - C(192, 8) / C(256, 8), a rank with p_r = 1 - C(248, 8) / C(256, 8).
    RDMA: 3 p_n B at 50 GB/s x 0.9 plus 3 x 6 us; NVLink: 4 nodes x 7 p_r B at
    200 GB/s x 0.8 plus 7 x 3 us; the call takes the longer plus a quarter of the
    shorter (4 pipelined chunks). DeepEP's test counts every distinct node of a
    token, its own included: 4 p_n B, not 3 p_n B, over the call's time."""
    import math

    b = 4096 * 7168.0
    p_n = 1 - math.comb(192, 8) / math.comb(256, 8)
    p_r = 1 - math.comb(248, 8) / math.comb(256, 8)
    t_rdma = 3 * p_n * b / 45e9 + 3 * 6e-6
    t_nvl = 4 * 7 * p_r * b / 160e9 + 7 * 3e-6
    seconds = max(t_rdma, t_nvl) + min(t_rdma, t_nvl) / 4
    result = predict_comm_row(tmp_path, {**COMM_ROW, "id": "n", "mode": "normal", "ep": "32", "n_nodes": "4",
                                         "tokens_per_rank": "4096", "metric": "bandwidth_GBps", "value": "58"})
    assert t_rdma > t_nvl  # RDMA-bound, as DeepEP reports for EP32
    assert result.predicted == pytest.approx(4 * p_n * b / seconds / 1e9, rel=1e-12)


def _result(rid: str, job: str, measured: float, predicted: float, **kw) -> validate.RowResult:
    return validate.RowResult(id=rid, source="s", quality="ok", gpu="g", metric="step_time_s", measured=measured,
                              predicted=predicted, status="ok", job=(job,), **kw)


def test_ranking_agreement_by_hand():
    """Job A: measured 1.0, 1.2, 1.02 s, predicted 1.0, 1.1, 0.9 s. The pair (1.0,
    1.02) differs by 2% < 5% and is not ranked; (1.0, 1.2) and (1.2, 1.02) are
    ordered right. Job B: measured 2 and 3, predicted 3 and 2: wrong. 2 of 3."""
    rows = [_result("a1", "A", 1.0, 1.0), _result("a2", "A", 1.2, 1.1), _result("a3", "A", 1.02, 0.9),
            _result("b1", "B", 2.0, 3.0), _result("b2", "B", 3.0, 2.0)]
    assert validate.ranking(rows) == {"pairs": 3, "agreement": pytest.approx(2 / 3, rel=1e-15), "ties": 0,
                                      "distinguished": pytest.approx(2 / 3, rel=1e-15)}
    assert validate.ranking(rows[:1]) == {"pairs": 0, "agreement": None, "ties": 0, "distinguished": None}
    # a pair predicted equal (one configuration by its columns) is a miss, and a tie
    tie = [_result("c1", "C", 1.0, 2.0), _result("c2", "C", 1.5, 2.0)]
    assert validate.ranking(rows + tie) == {"pairs": 4, "agreement": 0.5, "ties": 1,
                                            "distinguished": pytest.approx(2 / 3, rel=1e-15)}


def test_summary_counts_runs_predicted_out_of_memory_apart():
    """Errors +10% and -20% on rows that fit: MAPE 15%. A third measured run that no
    searched configuration fits (status oom, its fastest configuration +30%) is left
    out of the MAPE and counted apart: with it, (10 + 20 + 30) / 3 = 20%. An
    uncertain oom row does not enter the ok rows' figures."""
    rows = [_result("a", "A", 1.0, 1.1), _result("b", "B", 1.0, 0.8), _result("c", "C", 1.0, 1.3),
            _result("d", "D", 1.0, 5.0)]
    rows[2].status = "oom"
    rows[3].status, rows[3].quality = "oom", "uncertain"
    ok = validate.summary(rows)["ok"]
    assert ok["n"] == 2 and ok["mape"] == pytest.approx(0.15, rel=1e-12)
    assert ok["oom"] == 1 and ok["mape_with_oom"] == pytest.approx(0.20, rel=1e-12)


def test_measured_memory_from_notes_and_its_error_by_hand():
    """GiB is binary, GB decimal. Predicted 10% over one measured peak and 20% under
    the other: MAPE 15%, mean signed -5%."""
    assert validate.noted_memory_bytes("bf16, peak memory 82.4 GiB, MFU 38%") == 82.4 * 2**30
    assert validate.noted_memory_bytes("memory/GPU 93.2 GB") == 93.2e9
    assert validate.noted_memory_bytes("MFU 40%") is None
    # torchtitan's log as the community H200 rows quote it; a memory size is not a measurement
    assert validate.noted_memory_bytes("AC selective op; memory 47.96 GiB at step 100; 400 Gb") == 47.96 * 2**30
    assert validate.noted_memory_bytes("A100 memory size and network not printed; 80GB assumed") is None
    assert validate.noted_memory_bytes("memory 80 GB per GPU") is None
    rows = [_result("m1", "A", 1.0, 1.0, mem_peak_bytes=110.0, measured_mem_bytes=100.0),
            _result("m2", "A", 1.0, 1.0, mem_peak_bytes=40.0, measured_mem_bytes=50.0),
            _result("m3", "A", 1.0, 1.0, mem_peak_bytes=40.0)]
    assert validate.memory_error(rows) == {"n": 2, "mape": pytest.approx(0.15, rel=1e-12),
                                           "mean_signed": pytest.approx(-0.05, rel=1e-12)}


#: measured peak memory (torchtitan, KempnerForge notes) against mem_peak_bytes: 42.8%
#: at the second version of training.csv, mean signed -23.6% (issue 14's target is 10%);
#: committed so that it only moves down. What limits it: torchtitan logs the caching
#: allocator's reserved peak and KempnerForge its allocated peak in GiB; KempnerForge
#: keeps bf16 weights and optimizer states and skips the gradient reduce between
#: micro-batches; torchtitan's per-op selective recompute saves less than `selective`.
#: One exception to "only down", said here: 44.3% over 44 rows once the notes' third phrasing
#: of a measured peak ("memory X GiB at step N", torchtitan's log in the community H200 rows)
#: is read: those two Llama 3.1 8B runs (selective-op recompute, compiled, FP8) measured 47
#: and 48 GiB and are predicted at 83 and 85 GiB with `selective` read as the attention core.
#: 40.6% once the notes' "per-op SAC" / "selective op" is read as that policy
#: (validate.recompute_mode): those two at 49.1 and 47.0 GiB against 47.96 and 46.97.
#: One more exception, said here: 42.0% once ZeRO-3 rows store their shard as FSDP does
#: (validate.FULLY_SHARDED, SpaceSpec.zero3_shard): 2 bytes a parameter of the shard fewer
#: on every torchtitan and KempnerForge row, whose peaks were already predicted low for the
#: reasons above (mean signed -29.4% -> -32.3%). 25.5% (mean signed -10.2%) once an FSDP
#: trainer's row holds its whole unsharded gradient over its micro-batches where it fits
#: (validate.FSDP_DEFER): KempnerForge's Llama 3 70B rows 15-42 -> 79-99 GiB against 77-87
#: measured, torchtitan's 405B pipeline rows 27-36 -> 44-57 against 73-85
MEMORY_MAPE_THRESHOLD = 0.256
#: pairwise order agreement over the 14 ranked pairs (issue 14's target 90%): 64% with 5
#: pairs predicted as ties, 79% (3 ties, the other 11 all right) once a row's notes that
#: say it ran without torch.compile price eager ops (torchtitan's two compile / no-compile
#: pairs); committed so that it only moves up. The ties left: two framework releases,
#: AsyncTP (priced off on FSDP rows, validate.FULLY_SHARDED) and two KempnerForge runs
#: whose columns and notes describe one configuration. One exception to "only up", said here:
#: 71% (the 11 distinguished pairs 10 right) once the LM head runs in 16 bits under FP8: Llama 3
#: 70B on 64 H100 in FP8, NeMo's TP4 PP4 CP2 (10.69 s) against Megatron's TP4 PP8 (10.11 s),
#: 5.7% apart, flips (10.63 against 10.80 s): the head weighs more on a stage of PP8's 10
#: layers than of PP4's 20, so the Megatron row slows 6.5%, the NeMo row 3.3%
RANKING_AGREEMENT_FLOOR = 0.714


def test_training_file_reports_ranking_and_memory(training_results):
    stats = validate.summary(training_results)
    assert stats["ranking"]["pairs"] >= 10
    assert stats["ranking"]["agreement"] >= RANKING_AGREEMENT_FLOOR, stats["ranking"]
    assert stats["memory"]["n"] >= 40
    assert stats["memory"]["mape"] <= MEMORY_MAPE_THRESHOLD, stats["memory"]


#: leave-one-source-out MAPE of the ok training rows (explorer.loso), the headline
#: figure; committed thresholds only move down: 14.3% overall at the second version
#: of training.csv (in sample 10.0%). MosaicML held out 14.5% (its FA1 knob falls
#: back to the FA2 value without its own rows), torchtitan on the 500 W H100 29.8%.
#: 13.4% once the 500 W H100 computes at its sustained clock (0.896) and attention's
#: backward at 0.87 of its forward rate (torchtitan 22.3%, MosaicML 13.4%). 11.5% once
#: an FA1 knob no fit row identifies starts from half the FA2 value (the FlashAttention-2
#: paper's speed-up; fit_published.flash1_prior) instead of the FA2 value: MosaicML 10.4%.
#: 10.7% with fused attention as measured on an H100 (its rate rising with the keys per
#: call, FA2's plateau 0.36 of the peak there, A100's FA2 plateau the FlashAttention-2
#: paper's 0.70): MosaicML 9.4%, torchtitan 2412 18.9%, NeMo 7.9%, H200 3.8%.
#: 10.5% with the Hopper GEMMs' measured reduction fill (kernels.ops.loop_fill of k over
#: the profile's gemm_k_fill_bytes): MosaicML 9.2%, NeMo Automodel 36.0%, H200 2.6%.
#: 10.43% once a MoE row silent on its dispatcher is searched over DeepEP's hierarchical
#: kernels too (validate.UNKNOWN_SEARCH): NeMo Automodel 36.0% -> 23.6%. 10.40% once MLA
#: attention runs the FlashAttention-3 class (``Model.attention_kernel``): Automodel 19.8%.
#: 9.84% once a ZeRO-3 row with tensor parallelism is priced without TP overlap instead of
#: searched for it (validate.FULLY_SHARDED): KempnerForge 16.0% -> 11.2%, torchtitan 2412
#: 19.3% -> 16.8%, the other sources unchanged. 8.96% once ZeRO-3 rows price full
#: recompute with PyTorch's early-stopping checkpoint (validate.FULLY_SHARDED): MosaicML
#: 9.2% -> 7.6%, NeMo Automodel 19.8% -> 17.1%, torchtitan A100 9.5% -> 7.0%. 8.44% over
#: 233 rows once rows run without torch.compile price eager ops and torchtitan's per-op SAC
#: rows that policy (validate.eager_ops, validate.recompute_mode): torchtitan 2412 17.0% ->
#: 12.8%, MosaicML 7.6% -> 6.3%. One exception to "only down", said here: 8.63% over 236
#: rows once ZeRO-3 rows store their shard as FSDP does (validate.FULLY_SHARDED,
#: SpaceSpec.zero3_shard): three rows that ran, priced out of memory before and so not
#: counted, are predicted (Kimi K2 -6%, Qwen3-30B-A3B +20%, KempnerForge's Llama 3 70B on
#: 8 H200 -44%, held out); the 233 rows predicted before are unchanged. 8.57% once ZeRO-3
#: rows whose notes name DeepSpeed are read as DeepSpeed runs them (validate.deepspeed_trainer:
#: reentrant checkpoint, 16-bit partition): Narayanan et al. 18.3% -> 17.5%. 8.53% once rows
#: whose notes name FSDP are FSDP trainers' whatever their ZeRO stage (validate.fsdp_trainer:
#: KempnerForge's one-rank "fsdp1" TP runs price their TP collectives in line): KempnerForge
#: 13.8% -> 13.4%. One more exception to "only down", said here: 8.71% once an FSDP trainer's
#: row defers its gradient reduction over its micro-batches where the gradient fits
#: (validate.FSDP_DEFER: KempnerForge's maybe_no_sync, PyTorch's pipeline schedules, Composer's
#: default), which took memory MAPE from 42.0% to 25.5%: KempnerForge's Llama 3 70B rows, already
#: fast, drop three of four gradient reductions (KempnerForge 13.4% -> 15.2%), and torchtitan's
#: interleaved 405B row -10% -> -14%. 8.51% once the LM head runs in 16 bits under FP8
#: (measured on whole steps, docs/measurements train_fp8.csv): NeMo 24.07 7.8% -> 5.6%,
#: torchtitan 2412 12.8% -> 12.2%, NeMo Automodel 15.0% -> 13.8%; the Megatron FP8 table's
#: two rows 6.7% -> 9.4%.
LOSO_MAPE_OK_THRESHOLD = 0.0852
#: per source, held out (ok rows); the issue's target is 15% for every source
#: KempnerForge held out rose 14.8% -> 15.6% with those two changes: its TP rows lean
#: under (-10..-21%) and the H100-family GEMM knob fitted without it now also sees
#: torchtitan's rows less under-predicted; NeMo Automodel 35.7% -> 36.7% (its MoE rows,
#: already over, gain the slower attention backward); issue 14 open for both. With the
#: measured attention rates torchtitan 2412 fell to 18.9%; NeMo Automodel rose 36.7% ->
#: 37.2% (one exception to "only down", said here: its two ok rows, DeepSeek-V3 already
#: over-predicted, gain the slower short-key attention). With the Hopper GEMMs' reduction
#: fill NeMo Automodel fell to 36.0%, and two more exceptions, said here: torchtitan 2412
#: 18.9% -> 19.3% and KempnerForge 15.6% -> 16.03%. Both are already predicted too fast
#: (-19%, -10% signed); the fill slows the short-k GEMMs of the other Hopper sources
#: more than theirs, so the family's GEMM knob fitted without them rises (0.625 -> 0.65)
#: and speeds their long-k GEMMs (overall 10.7% -> 10.5%, in sample 9.5% -> 9.4%). NeMo
#: Automodel 23.6% once its DeepSeek-V3 row may run DeepEP across its 8 nodes (+60% -> +35%
#: in sample), 19.8% once its MLA attention runs the FlashAttention-3 class (+28%).
#: KempnerForge 11.2% and torchtitan 2412 16.8% once their ZeRO-3 TP rows run the TP
#: collectives in line: KempnerForge is back under the target. With the early-stopping
#: checkpoint on ZeRO-3 rows NeMo Automodel fell to 17.1%, and one exception, said here:
#: torchtitan 2412 16.8% -> 17.05%. Its rows are already predicted too fast (-16% signed)
#: and its full-recompute rows (the 405B and the 256K-token runs) gain the cheaper
#: recompute; KempnerForge (11.2% -> 12.6%) and Narayanan et al. (13.9% -> 14.9%) rise too
#: but stay under the target. torchtitan 2412 fell to 12.8% (under the target) once its rows
#: that say so run eager ops and per-op SAC; one exception, said here: Narayanan et al.
#: 14.9% -> 18.3%. The A100 family's GEMM knob fitted without it moves 0.65 -> 0.725: its
#: other fit sources are MosaicML, torchtitan's A100 rows and the one Megatron README row,
#: each weighing the same, and torchtitan's selective-op rows, now priced with the per-op
#: recompute their notes name, are 3-16% slow (its FSDP exposure over an interconnect the
#: rows do not state), so the knob rises and Narayanan's rows, already fast (its four
#: DeepSpeed ZeRO-3 rows -40 to -65%), get faster
#: NeMo Automodel fell to 15.0% (two more rows predicted, Kimi K2 -6% and Qwen3-30B-A3B
#: +20%, beside DeepSeek-V3's +30%) and KempnerForge rose 12.5% -> 13.8% (its Llama 3 70B on
#: 8 H200, -44%: the run held 119.7 GiB of the card's 141 GB) once ZeRO-3 rows store their
#: shard as FSDP does: both under the target's 15% or at it. Narayanan et al. fell to 17.5%
#: once its DeepSpeed ZeRO-3 rows are read as DeepSpeed runs them (validate.deepspeed_trainer).
#: KempnerForge rose 13.4% -> 15.25%, above the target (an exception, said here), once its
#: rows defer their gradient reduction as its trainer does (validate.FSDP_DEFER): its five
#: Llama 3 70B rows, predicted too fast already, lose three of four reductions. NeMo Automodel
#: fell to 13.8% (under the target) once the LM head runs in 16 bits under FP8
LOSO_SOURCE_CEILINGS = {"narayanan2021": 0.176, "kempnerforge-h200": 0.153}


@pytest.mark.slow
def test_leave_one_source_out_within_threshold(training_results):
    """About two minutes on 2 cores: every training row predicted at 25 knob pairs."""
    from paraspace.explorer import loso

    held = loso.run(str(TRAINING), training_results)
    stats = loso.summary(training_results, held)
    assert stats["ok"]["n"] >= 225
    assert stats["ok"]["mape"] <= LOSO_MAPE_OK_THRESHOLD, stats["ok"]
    for name, st in stats["by_source"].items():
        if st["n"] and not name.endswith("(uncertain)"):
            assert st["mape"] <= LOSO_SOURCE_CEILINGS.get(name, SOURCE_MAPE_OK_TARGET), (name, st)
    # held out is never better than in sample by more than noise for a source the fit saw
    in_sample = validate.summary(training_results)
    assert stats["ok"]["mape"] >= in_sample["ok"]["mape"] - 1e-9
    # the 80% bands, fitted without each source, cover 75-85% of its rows (issue 14's target;
    # measured 82.5% of 229 with split-conformal bounds, 71.6% with plain quantiles; 73.8% once
    # ZeRO-3 rows read the early-stopping checkpoint, 79.9% with every source weighing the same)
    cov = loso.band_coverage(list(validate.read(TRAINING).iter_rows(named=True)), training_results, held)
    assert cov["n"] >= 225 and 0.75 <= cov["coverage"] <= 0.85, cov


def test_cli_loso_when_no_other_source_can_judge_a_band(tmp_path):
    """Source "test" is an MoE row, which the knob fit leaves out, so "other"'s dense
    row has no fit set without its source and no held-out prediction; "test" is
    predicted with the knobs fitted on "other". Its band would be fitted on no other
    source's residual: no row is counted for coverage, and the run ends cleanly."""
    moe = {**ROW, "n_experts": "8", "topk": "2", "expert_ffn": "8192"}
    path = write(tmp_path, [moe, {**ROW, "id": "t-2", "source": "other"}])
    result = CliRunner().invoke(main, ["validate", str(path), "--loso", "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    held = {r["id"]: r.get("loso_predicted") for r in data["rows"]}
    assert held["t-1"] is not None and held["t-1"] > 0 and held["t-2"] is None
    assert data["loso"]["bands"] == {"n": 0, "coverage": None}
    # the source without a held-out prediction is named, in the JSON and in the text
    assert list(data["loso_notes"]) == ["other"] and "no prediction with its rows left out" in data["loso_notes"]["other"]
    text = CliRunner().invoke(main, ["validate", str(path), "--loso", "--no-progress"])
    assert "leave-one-source-out, other: no prediction with its rows left out" in text.output


def test_each_row_is_reported_as_it_is_done(tmp_path):
    heard = []
    validate.run(write(tmp_path, [ROW, {**ROW, "id": "t-2"}, {**ROW, "id": "t-3"}]),
                 lambda done, total: heard.append((done, total)))
    assert heard == [(1, 3), (2, 3), (3, 3)]


def test_cli_loso_on_a_small_file(tmp_path):
    """Two sources of one row each: each is predicted with the knobs fitted on the
    other, the JSON carries both the in-sample and the held-out predictions."""
    path = write(tmp_path, [ROW, {**ROW, "id": "t-2", "source": "other", "micro_batch": "2"}])
    result = CliRunner().invoke(main, ["validate", str(path), "--loso", "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["loso"]["ok"]["n"] == 2
    assert all(r["loso_predicted"] > 0 for r in data["rows"])
    # each row's band is fitted on the other source's one residual, r = log(measured /
    # held-out): a one-residual class's bounds are that residual, so a row is inside only
    # where its own residual is the same
    r = [math.log(row["measured"] / row["loso_predicted"]) for row in data["rows"]]
    inside = sum(abs(a - b) < 1e-12 for a, b in ((r[0], r[1]), (r[1], r[0])))
    assert data["loso"]["bands"] == {"n": 2, "coverage": pytest.approx(inside / 2)}
    text = CliRunner().invoke(main, ["validate", str(path), "--loso", "--no-progress"])
    assert text.exit_code == 0, text.output
    assert f"bands: the 80% band fitted without each source holds {100 * inside / 2:.1f}% of its 2 ok rows" in text.output


def test_a_repeated_id_is_predicted_once_and_the_table_fits_long_ids(tmp_path):
    """Ids are unique across the files (the data README): a row repeating an earlier id is
    unsupported, naming the first, so it is not counted twice; the table's id column is as
    wide as the longest id, so the quality column starts at one offset on every line."""
    rows = [ROW, {**ROW, "id": "x" * 60}, dict(ROW)]
    _, results = validate.run(write(tmp_path, rows))
    assert [r.status for r in results][2] == "unsupported"
    assert f"id = '{rows[0]['id']}': expected an id no other row has (data row 1 has it" in results[2].reason
    assert results[0].status != "unsupported" and validate.summary(results)["status"]["unsupported"] == 1
    lines = validate.table(results).splitlines()
    assert {line.index(r.quality, 60) for line, r in zip(lines[1:], results)} == {lines[0].index("quality")}
