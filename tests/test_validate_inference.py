"""``paraspace validate`` on inference rows (issue 15 item 5): leave-one-source-out,
rows with redundant experts, the memory-bandwidth bound on every decode
prediction, and one result per row for any file with the inference header."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraspace.explorer import loso, validate
from paraspace.explorer.evaluate import pack_hardware, pack_model
from paraspace.kernels import inference
from paraspace.spaces.catalog import load_hardware

VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"
INFERENCE = VALIDATION / "inference.csv"
needs_data = pytest.mark.skipif(not INFERENCE.is_file(), reason=f"{INFERENCE} not present")

#: the inference schema's header (shared/validation/README.md), in the file's order
HEADER = ("id,source,ref,quality,model,layers,hidden,heads,kv_heads,head_dim,ffn,vocab,glu,n_experts,topk,expert_ffn,"
          "n_shared_experts,first_dense_layers,mla,q_lora_rank,kv_lora_rank,rope_head_dim,qk_nope_head_dim,v_head_dim,"
          "gpu,n_gpus,gpus_per_node,framework,mode,instances,tp,pp,ep,attention_dp,batch,prefill_instances,prefill_tp,"
          "prefill_pp,prefill_ep,prefill_attention_dp,prefill_batch,dtype,kv_dtype,concurrency,input_len,output_len,"
          "metric,value,notes").split(",")

#: FasterTransformer's GPT 13B on one A100 40GB (the kipply rows): dense, fast to predict
GPT13B = {"model": "GPT 13B", "layers": "40", "hidden": "5120", "heads": "40", "kv_heads": "40", "head_dim": "128",
          "ffn": "20480", "vocab": "50272", "glu": "0", "mla": "0", "gpu": "a100-sxm4-40gb", "n_gpus": "1",
          "gpus_per_node": "8", "framework": "fastertransformer", "mode": "agg", "instances": "1", "tp": "1",
          "pp": "1", "ep": "1", "attention_dp": "0", "batch": "1", "dtype": "fp16", "input_len": "512",
          "output_len": "10", "quality": "ok", "ref": "here", "notes": ""}

#: DeepSeek-V3 (config.json of deepseek-ai/DeepSeek-V3) decoding on 72 H100 with EP72 and
#: DP attention, 256 sequences a GPU at a KV length of 2,000: SGLang's large-EP decode test
DEEPSEEK_EP72 = {
    "id": "ep72", "source": "toy", "ref": "here", "quality": "ok", "model": "DeepSeek-V3", "layers": "61",
    "hidden": "7168", "heads": "128", "kv_heads": "128", "head_dim": "192", "ffn": "18432", "vocab": "129280",
    "glu": "1", "n_experts": "256", "topk": "8", "expert_ffn": "2048", "n_shared_experts": "1",
    "first_dense_layers": "3", "mla": "1", "q_lora_rank": "1536", "kv_lora_rank": "512", "rope_head_dim": "64",
    "qk_nope_head_dim": "128", "v_head_dim": "128", "gpu": "h100-sxm5-80gb", "n_gpus": "72", "gpus_per_node": "8",
    "framework": "sglang", "mode": "decode", "instances": "1", "tp": "72", "pp": "1", "ep": "72", "attention_dp": "1",
    "batch": "256", "dtype": "fp8", "input_len": "2000", "metric": "output_tokens_per_s_per_gpu", "value": "2785.25",
    "notes": "",
}


def write(path: Path, rows: list[dict[str, str]], header: list[str] = HEADER) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerows([{k: r.get(k, "") for k in header} for r in rows])
    return path


def gpt13b(rid: str, source: str, metric: str, value: str) -> dict[str, str]:
    return GPT13B | {"id": rid, "source": source, "metric": metric, "value": value}


# --------------------------------------------------------------------------- leave-one-source-out


def toy_files(tmp_path: Path) -> tuple[Path, list[validate.RowResult]]:
    """An inference file of two sources, ``shared`` and ``apart``, and beside it a
    training file whose one ok dense H100 row comes from ``shared``: the knobs are
    fitted on ``shared``'s training row, never on ``apart``."""
    rows = [gpt13b("a-decode", "apart", "decode_latency_per_token_s", "0.022"),
            gpt13b("a-prefill", "apart", "prefill_latency_s", "0.063"),
            gpt13b("s-decode", "shared", "decode_latency_per_token_s", "0.022")]
    path = write(tmp_path / "inference.csv", rows)
    training = {k: "" for k in validate.TRAINING_REQUIRED}
    training.update(id="t-1", source="shared", quality="ok", layers="2", hidden="1024", heads="8", kv_heads="8",
                    ffn="4096", vocab="32000", seq="1024", glu="0", gpu="h100-sxm5-80gb", n_gpus="1", tp="1", pp="1",
                    dp="1", cp="1", global_batch="8", dtype="bf16", metric="step_time_s", value="1", step_time_s="1")
    write(tmp_path / "training.csv", [training], list(training))
    return path, validate.run(path)[1]


def test_loso_of_a_source_outside_the_knob_fit_is_its_in_sample_prediction(tmp_path):
    """The knobs inference reads are fitted on training.csv; leaving out ``apart``,
    which has no training row, leaves the fit as it is, so each of its rows' held-out
    prediction is its in-sample one, exactly. ``shared`` is in the fit: refitting
    without it is not done, so its rows have no held-out prediction, with the reason."""
    path, results = toy_files(tmp_path)
    assert [r.status for r in results] == ["ok", "ok", "ok"]
    held, notes = loso.inference_run(path, results)
    assert held[0] == results[0].predicted and held[1] == results[1].predicted
    assert held[2] is None
    assert "equals in sample" in notes["apart"] and "not implemented" in notes["shared"]
    assert loso.INFERENCE_KNOBS == ("gemm_max_efficiency",)
    held_stats = loso.summary(results, held)
    in_sample = validate.summary(results[:2])
    assert held_stats["ok"]["n"] == 2 and held_stats["ok"]["mape"] == in_sample["ok"]["mape"]


def test_loso_without_a_training_file_says_the_fit_set_is_unknown(tmp_path):
    path = write(tmp_path / "inference.csv", [gpt13b("a", "apart", "prefill_latency_s", "0.063")])
    _, results = validate.run(path)
    held, notes = loso.inference_run(path, results)
    assert held == [None] and "fit set is unknown" in notes["apart"]


# --------------------------------------------------------------------------- redundant experts


def test_expert_slots_from_ep_and_experts_by_hand():
    """The smallest multiple of ep that is at least the experts: 256 over EP72 ->
    72 x 4 = 288 (72 x 3 = 216 is short), over EP144 -> 144 x 2 = 288 (DeepSeek's 32
    redundant experts), over EP32 -> 256 (no redundancy), 128 over EP8 -> 128."""
    assert validate.row_expert_slots(256, 72) == 288
    assert validate.row_expert_slots(256, 144) == 288
    assert validate.row_expert_slots(256, 32) == 256
    assert validate.row_expert_slots(128, 8) == 128
    assert validate.row_expert_slots(3, 1) == 3
    with pytest.raises(ValueError, match="ep = 0"):
        validate.row_expert_slots(256, 0)


def test_ep72_decode_row_holds_288_slots_by_hand():
    """SGLang's EP72 decode of DeepSeek-V3: 256 experts in 288 slots, 4 a GPU. The 32
    redundant copies go to 32 experts (equal popularity: the first 32), so there are
    224 whole loads and 64 halves; packing heaviest first puts 3 whole ones on each of
    the 72 ranks (216), the last 8 whole ones fill 8 ranks (load 4) and the 64 halves
    the other 64 (load 3.5): the busiest rank's load over the mean is
    4 / (256 / 72) = 1.125. Each rank's expert weights are 4 experts', not 256/72:
    over the 58 MoE layers of FP8 weights, 58 x (288 - 256) / 72 x 3 x 7168 x 2048
    bytes = 1,135,258,282.67 B more than without the copies."""
    result = validate.predict_phase(DEEPSEEK_EP72, "toy")
    assert result.status == "ok" and result.predicted is not None and result.predicted > 0
    assert result.chosen["expert_slots"] == 288
    assert result.chosen["placement_imbalance"] == pytest.approx(1.125, abs=1e-12)
    assert result.chosen["batch"] == 256 * 72
    model = validate.row_model(DEEPSEEK_EP72, "toy", "toy")
    m = pack_model(model)[0]
    args = dict(tp=72, pp=1, ep=72, attention_dp=True, n_gpus=72, dtype="fp8", kv_dtype="fp8")
    with_copies = validate.replica_record(model, **args)[0]
    assert with_copies.expert_slots == 288
    without = inference.serving(tp=72, pp=1, ep=72, attention_dp=1.0, n_gpus=72, weight_bytes=1.0, act_bytes=2.0,
                                kv_bytes=1.0)[0]
    extra = inference.device_weight_bytes(m, with_copies) - inference.device_weight_bytes(m, without)
    assert extra == pytest.approx(58 * 32 / 72 * 3 * 7168 * 2048, rel=1e-12)


def test_dispatch_and_two_batch_overlap_are_searched_and_reported():
    """Neither is a column: each of the 4 dispatch algorithms with TBO off and on is
    tried and the fastest kept (the rule for unknown fields); a dense or TP-attention
    replica has no all-to-all and one layout."""
    model = validate.row_model(DEEPSEEK_EP72, "toy", "toy")
    assert len(validate.phase_layouts(model, 72, True)) == 8
    assert validate.phase_layouts(model, 72, False) == [("alltoall", False)]
    assert validate.phase_layouts(model, 1, True) == [("alltoall", False)]
    result = validate.predict_phase(DEEPSEEK_EP72, "toy")
    assert result.chosen["dispatch"] in validate.PHASE_DISPATCH and isinstance(result.chosen["tbo"], bool)
    for dispatch, tbo in validate.phase_layouts(model, 72, True):
        single = validate.phase_layouts
        try:
            validate.phase_layouts = lambda *a, lay=(dispatch, tbo): [lay]  # type: ignore[assignment]
            assert validate.predict_phase(DEEPSEEK_EP72, "toy").predicted <= result.predicted * (1 + 1e-12)
        finally:
            validate.phase_layouts = single


# --------------------------------------------------------------------------- memory-bandwidth bound


def test_decode_floor_of_gpt13b_by_hand():
    """FasterTransformer's GPT 13B, batch 1, a KV of 512 tokens, FP16 on an A100 40GB
    (1,555 GB/s). Weights: 40 layers x 12 h^2 (h 5120: 314,572,800 each) plus the
    tied 50,272 x 5120 table the head reads = 12,840,304,640 parameters, x 2 bytes
    = 25,680,609,280 B (biases and norms add 0.02%); KV: 40 layers x 2 x 5120 x 2
    bytes x 512 tokens = 419,430,400 B. Floor = 26,100,039,680 / 1.555e12 = 16.78 ms,
    below the measured 22.0 ms and the predicted 22.8 ms."""
    row = gpt13b("d", "s", "decode_latency_per_token_s", "0.022")
    model = validate.row_model(row, "s", "s")
    device, _, _ = pack_hardware(load_hardware("a100-sxm4-40gb"), "fp16")
    srv = validate.replica_record(model, tp=1, pp=1, ep=1, attention_dp=False, n_gpus=1, dtype="fp16",
                                  kv_dtype="fp16")[0]
    floor = validate.decode_ceiling(pack_model(model)[0], device[0], srv, 1.0, 512.0, "decode_latency_per_token_s")
    assert floor == pytest.approx(26_100_039_680 / 1.555e12, rel=3e-4)
    result = validate.predict_inference(row, "s")
    assert result.ceiling == pytest.approx(floor, rel=1e-12) and not result.beyond_ceiling
    assert result.predicted > floor


def test_a_prediction_past_the_bound_is_flagged():
    """The flag reads the metric's direction: a throughput above its ceiling, a latency below its floor."""
    def row(metric: str, predicted: float) -> validate.RowResult:
        return validate.RowResult(id="r", source="s", quality="ok", gpu="g", metric=metric, measured=1.0,
                                  predicted=predicted, status="ok", ceiling=100.0)

    assert row("output_tokens_per_s_per_gpu", 101.0).beyond_ceiling
    assert not row("output_tokens_per_s_per_gpu", 99.0).beyond_ceiling
    assert row("tpot_s", 99.0).beyond_ceiling and not row("tpot_s", 101.0).beyond_ceiling
    stats = validate.summary([row("tpot_s", 99.0), row("output_tokens_per_s_per_gpu", 50.0)])
    assert stats["ceiling"]["checked"] == 2 and stats["ceiling"]["beyond"] == ["r"]
    assert stats["ceiling"]["closest"] == pytest.approx(100.0 / 99.0)
    assert "BEYOND MEMORY-BANDWIDTH BOUND" in validate.table([row("tpot_s", 99.0)])


@pytest.fixture(scope="module")
def published() -> list[validate.RowResult]:
    return validate.run(INFERENCE)[1]


@needs_data
def test_no_decode_prediction_of_the_published_rows_passes_the_bound(published):
    """Property over the whole file: every predicted row of a decode metric carries its
    bound, and none is past it."""
    decode = [r for r in published if r.predicted is not None
              and r.metric in validate.LATENCY_BOUNDED + validate.THROUGHPUT_BOUNDED]
    assert len(decode) > 300
    assert all(r.ceiling is not None and math.isfinite(r.ceiling) and r.ceiling > 0 for r in decode)
    assert [r.id for r in decode if r.beyond_ceiling] == []


@needs_data
def test_rows_with_redundant_experts_are_predicted(published):
    """SGLang's EP72 decode rows were unsupported; each is predicted now with 288 slots.
    DeepSeek's production rows stay unsupported: they have no input length."""
    by_id = {r.id: r for r in published}
    for rid in ("sglang-largeep-decode-2000-ep72-h100", "sglang-largeep-decode-simmtp-4000-ep72-h100"):
        assert by_id[rid].status == "ok" and by_id[rid].chosen["expert_slots"] == 288, by_id[rid]
    assert "input_len" in by_id["deepseek-day6-prod-decode-ep144-h800"].reason
    assert {r.framework for r in published} >= {"trtllm", "vllm", "sglang", "fastertransformer", "deepseek"}


#: leave-one-source-out MAPE of every `ok` inference row (235: AIConfigurator's closed-loop
#: TTFT/TPOT through the serving simulation, TensorRT-LLM throughput, FasterTransformer
#: latencies, SGLang's isolated EP phases); measured 24.6%, then 22.8% with each engine's
#: scheduler and AIConfigurator's token budget (``validate.engine_scheduler``), 14.1% with
#: TensorRT-LLM's overlap scheduler (an arrival joins one iteration later, a closed-loop
#: user's next request two); only moves down, with one exception, said here: the H100
#: family's GEMM knob, refitted on the training rows once fused attention ran at its
#: measured rates (0.575 -> 0.625, docs/measurements/), speeds every H100 prediction, and
#: these rows were already too fast (TPOT -11% signed): 14.1% -> 14.9%; 14.8% with the
#: Hopper GEMMs' reduction fill; 13.7% once a closed-loop row's benchmark serves 10
#: requests per user from a cold start, as AIConfigurator's harness does
#: (``validate.SERVING_REQUESTS_PER_USER``; the simulation had run 1,000); 13.4% once a
#: row silent on its KV cache reads as its engine's default (``validate.row_kv_dtype``:
#: vLLM and SGLang keep the model's 16-bit type under FP8 weights); 13.36% once the serving
#: tiers charge the fused attention kernel's fill on each prompt row (``kernels.serving``
#: ``ROW_FILL_KEYS``, the measured law the prefill kernels already ran at); 13.40% with MLA
#: attention at the FlashAttention-3 class's rate (the SGLang phase rows below); one
#: exception to "only down", said here: 13.42% once the H200's HBM is read as the
#: 141 GiB torch measures, not 141e9 B (stop 35; the TensorRT-LLM H200 rows' batches grow);
#: 12.69% once the engines' all-reduce kernel moves its bytes at its measured rate (60 GB/s
#: on H100s against NVLink's 360 achieved: kernels.collectives.CUSTOM_ALL_REDUCE_LINK_SHARE);
#: 12.65% once the LM head computes at the 16-bit peak under FP8 weights (``kernels.inference.head_s``:
#: FP8 checkpoints leave it unquantized; throughput 5.36% -> 5.23%)
INFERENCE_LOSO_OK_THRESHOLD = 0.1266
#: the closed-loop `ok` rows (83 each) per metric, only down: TPOT 9.9% (target 10%; 9.0%
#: before the overlap scheduler: requests waiting longer leave smaller decode batches);
#: TTFT 23.9% (target 20%; TensorRT-LLM -19% signed, vLLM -6%). The same exception as
#: above: TPOT 11.3%, TTFT 24.9%. Not a GEMM the model prices too fast: at the
#: catalog's knob it is 8-15% slower than the measured cuBLAS kernels of 16-2,048 rows
#: (docs/measurements/h100-sxm5-80gb); the serving model misses time elsewhere. 11.2% and
#: 24.7% with the Hopper GEMMs' reduction fill. With the benchmark's length (10 requests per
#: user, cold start: the start-up burst, every user's prompt queued at once, is a tenth of
#: the requests rather than a thousandth) TTFT 24.7% -> 21.1%, and one more exception,
#: said here: TPOT 11.2% -> 11.5% (the run's drain, fewer users decoding at the end, is a
#: larger share too: smaller, faster decode steps, where these rows were already fast).
#: With vLLM's default 16-bit KV cache (its FP8 rows had read an FP8 one) TPOT 11.5% ->
#: 10.4% (vLLM's 16 rows 11.3% -> 5.4%), and one more exception, said here: TTFT 21.1% ->
#: 21.7%, vLLM's TTFT rows, already over-predicted (+20%), waiting behind longer steps (+23%).
#: With the attention kernel's fill on each prompt row: TPOT 10.2%, TTFT 21.6% (TensorRT-LLM's
#: 67 rows -17.1% -> -16.5% signed, vLLM's 16 +23.3% -> +24.2%). With the engines' all-reduce
#: kernel at its measured rate (sglang pull request 2904: vLLM's kernel on H100s, 2-8 GPUs,
#: to 1 MiB): TPOT 10.2% -> 8.6% (under the 10% target; -9.7% -> -6.2% signed: TensorRT-LLM's
#: Qwen3-32B TP4/TP8 rows at 32-64 users -10..-24% -> -6..-16%, vLLM's Llama 70B TP8 rows at
#: 32-64 users -12..+3% -> +4..+14%, where the vLLM release measured may run a newer
#: all-reduce backend than the kernel measured); TTFT unchanged (prefill all-reduces are NCCL's)
CLOSED_LOOP_OK_THRESHOLDS = {"tpot_s": 0.0861, "ttft_s": 0.2162}
#: the `ok` isolated-phase rows (SGLang EP32 prefill x 2, EP72 decode): measured 34.8%,
#: all over-predicted (the fastest dispatch / TBO layout is the prediction); 31.8% with
#: SGLang's default 16-bit KV cache (the decode row 43% -> 34%). One exception, said here:
#: 35.2% once MLA attention runs the FlashAttention-3 class it needs (``Model.attention_kernel``:
#: FlashAttention-2 has no path for its 192 / 128 head dims; FlashMLA's decode reaches
#: 580 TFLOP/s on an H800, DeepSeek's FlashMLA README): the decode row, already too fast,
#: 34% -> 43%, the prefill rows 41% / 20% -> 42% / 20%. What SGLang spends beyond the
#: kernels at EP72 is not modelled; the faster attention is what the kernels run
PHASE_OK_THRESHOLD = 0.353


@needs_data
def test_published_inference_loso_equals_in_sample(published):
    held, notes = loso.inference_run(INFERENCE, published)
    assert all(h == r.predicted for h, r in zip(held, published) if r.status in ("ok", "oom"))
    assert all("equals in sample" in note for note in notes.values())
    stats = loso.summary(published, held)
    assert stats["ok"]["n"] == 235 and stats["ok"]["mape"] <= INFERENCE_LOSO_OK_THRESHOLD, stats["ok"]
    phases = validate.summary([r for r in published if r.metric in validate.PHASE_METRICS.values()])
    assert phases["ok"]["n"] == 3 and phases["ok"]["mape"] <= PHASE_OK_THRESHOLD, phases["ok"]
    for metric, threshold in CLOSED_LOOP_OK_THRESHOLDS.items():
        closed = validate.summary([r for r in published if r.metric == metric])["ok"]
        assert closed["n"] == 83 and closed["mape"] <= threshold, (metric, closed)


def test_kv_cache_dtype_is_the_engines_default_where_a_row_is_silent():
    """An EMPTY ``kv_dtype`` reads as the engine's default ``kv_cache_dtype``: vLLM and
    SGLang keep the model's 16-bit data type ("auto") under FP8 weights; TensorRT-LLM's
    "auto" follows the checkpoint (its FP8 checkpoints quantise the cache), as does an
    engine the table does not name; a stated column always wins."""
    fp8 = {"dtype": "fp8", "kv_dtype": None}
    assert validate.row_kv_dtype({**fp8, "framework": "vllm 0.12.0"}, "fp8") == "bf16"
    assert validate.row_kv_dtype({**fp8, "framework": "SGLang (May 2025 main)"}, "fp8") == "bf16"
    assert validate.row_kv_dtype({**fp8, "framework": "trtllm 1.0.0rc3"}, "fp8") == "fp8"
    assert validate.row_kv_dtype({**fp8, "framework": "DeepSeek in-house inference engine"}, "fp8") == "fp8"
    assert validate.row_kv_dtype({**fp8, "framework": ""}, "fp8") == "fp8"
    assert validate.row_kv_dtype({"dtype": "fp16", "kv_dtype": "", "framework": "vllm"}, "fp16") == "fp16"
    assert validate.row_kv_dtype({"dtype": "fp8", "kv_dtype": "fp8", "framework": "vllm"}, "fp8") == "fp8"


#: a small dense model's closed-loop row on 4 H100 (TP 4, one replica): the base of the deployment tests
CLOSED_LOOP = {"id": "r", "source": "s", "quality": "ok", "model": "m", "layers": "4", "hidden": "1024", "heads": "8",
               "kv_heads": "8", "head_dim": "128", "ffn": "4096", "vocab": "32000", "glu": "1",
               "gpu": "h100-sxm5-80gb", "n_gpus": "4", "gpus_per_node": "8", "framework": "trtllm 1.0.0rc3",
               "mode": "agg", "instances": "1", "tp": "4", "pp": "1", "ep": "1", "attention_dp": "0", "batch": "16",
               "dtype": "bf16", "concurrency": "16", "input_len": "1024", "output_len": "8", "metric": "tpot_s",
               "value": "0.01"}


@pytest.fixture
def built_spaces(monkeypatch) -> list[dict]:
    """The raw serving spaces ``predict_serving`` builds, in order (``validate.validate`` spied on)."""
    seen: list[dict] = []
    real = validate.validate

    def spy(kind, raw, where):
        seen.append(raw)
        return real(kind, raw, where)

    monkeypatch.setattr(validate, "validate", spy)
    return seen


def test_engine_scheduler_and_token_budget_of_a_closed_loop_row(built_spaces):
    """The row's engine picks the scheduler (TensorRT-LLM whole prompts, vLLM and SGLang
    chunked, anything else chunked) and the overlap scheduler (TensorRT-LLM and SGLang
    by default, vLLM not), and the budget is AIConfigurator's max_batch + isl + 1500:
    batch 16, isl 1024 -> 16 + 1,024 + 1,500 = 2,540 tokens."""
    assert validate.engine_scheduler("trtllm 1.0.0rc3") == ("continuous-unchunked", True)
    assert validate.engine_scheduler("vllm (version not recorded)") == ("continuous", False)
    assert validate.engine_scheduler("SGLang 0.5.1") == ("continuous", True)
    assert validate.engine_scheduler("") == validate.engine_scheduler("some engine") == ("continuous", False)
    row = {k: v for k, v in CLOSED_LOOP.items() if k != "instances"}
    result = validate.predict_serving(row, "inline.csv")
    dims = built_spaces[-1]["dimensions"]
    assert result.status == "ok" and (dims["scheduler"], dims["overlap_scheduler"], dims["max_tokens"],
                                      dims["max_batch"]) == (["continuous-unchunked"], [True], [2540], [16])


def test_a_disaggregated_row_runs_its_prefill_group_apart(built_spaces):
    """A disagg row of 16 GPUs: 2 prefill replicas of TP 4 (prefill_*), and 2 decode replicas
    of TP 4, the rest (16 - 2 x 4 = 8 GPUs = instances x tp x pp). It is the serving space
    of that deployment: mode disagg, the prefill group as given, the prefill workers' budget
    AIConfigurator's isl + 1500 = 2,524 tokens, max_batch the row's 16, continuous batching
    (the space's disaggregated engines; TensorRT-LLM's whole-prompt scheduler is what its
    prefill replicas do with that budget), and n_requests per decode engine
    ceil(10 x 16 / 2) = 80; it is simulated whole. Fewer prefill replicas
    (one, the decode side as it was) wait longer for their prompts: TTFT rises."""
    row = {**CLOSED_LOOP, "mode": "disagg", "n_gpus": "16", "instances": "2", "prefill_instances": "2",
           "prefill_tp": "4", "prefill_pp": "1", "metric": "ttft_s", "value": "0.1"}
    result = validate.predict_row(validate.predict_inference, row, "inline.csv")
    raw = built_spaces[-1]
    dims = raw["dimensions"]
    assert result.status == "ok" and result.chosen["simulated"], result.reason
    assert (raw["devices"], dims["mode"], dims["prefill_tp"], dims["prefill_instances"], dims["max_tokens"],
            dims["max_batch"], raw["workload"]["n_requests"]) == (16, ["disagg"], [4], [2], [2524], [16], 80)
    fewer = validate.predict_row(validate.predict_inference,
                                 {**row, "n_gpus": "12", "prefill_instances": "1"}, "inline.csv")
    assert fewer.status == "ok" and fewer.predicted > result.predicted


@pytest.mark.parametrize("change, field, expected", [
    ({"instances": "3"}, "instances", "n_gpus / (tp * pp) = 1"),
    ({"batch": "0"}, "batch", "a whole number from 1 to 2^53"),
    ({"tp": "-2"}, "tp", "a whole number from 1 to 2^53"),
    ({"prefill_tp": "4"}, "prefill_tp", "EMPTY outside a disagg row"),
    ({"mode": "disagg", "n_gpus": "12", "prefill_instances": "2", "prefill_tp": "4", "instances": "2"}, "instances",
     "(n_gpus - prefill_instances * prefill_tp) / (tp * pp) = 1"),
    ({"mode": "disagg", "prefill_tp": "4"}, "prefill_instances", "a positive number (EMPTY is not allowed"),
    ({"mode": "disagg", "n_gpus": "12", "prefill_instances": "2", "prefill_tp": "4", "instances": "1",
      "prefill_pp": "2"}, "prefill_pp", "1 or EMPTY"),
])
def test_a_deployment_whose_counts_do_not_add_up_is_unsupported(change, field, expected):
    """The schema's counts: positive where given (a batch of 0 is not an empty one), and
    instances x tp x pp (+ the prefill group's GPUs in a disagg row) = n_gpus; a row
    that breaks them is unsupported, the reason naming the field and what was expected."""
    result = validate.predict_row(validate.predict_inference, {**CLOSED_LOOP, **change}, "inline.csv")
    assert result.status == "unsupported"
    assert f"{field} = " in result.reason and expected in result.reason, result.reason


# --------------------------------------------------------------------------- any file of the schema

CELLS = st.sampled_from(["", "0", "1", "2", "8", "128", "-3", "1.5", "nan", "x", "1e400", "fp8", "bf16", "decode"])


@settings(max_examples=12, deadline=None)
@given(edits=st.lists(st.lists(st.tuples(st.sampled_from(HEADER[4:48]), CELLS), max_size=4), min_size=1, max_size=3),
       metrics=st.lists(st.sampled_from(["prefill_latency_s", "decode_latency_per_token_s", "total_latency_s",
                                         "output_throughput_tokens_per_s", "tpot_s", "ttft_s", "bogus"]),
                        min_size=3, max_size=3))
def test_validate_returns_one_result_per_row(tmp_path_factory, edits, metrics):
    """Whatever the cells of a file with the inference header, every row comes back
    once, in order, with a status; an unsupported one says why."""
    rows = []
    for i, (change, metric) in enumerate(zip(edits, metrics)):
        row = gpt13b(f"r{i}", "s", metric, "0.5") | {"output_len": "4"}
        row.update(change)
        rows.append(row)
    path = write(tmp_path_factory.mktemp("any") / "inference.csv", rows)
    kind, results = validate.run(path)
    assert kind == "inference" and [r.id for r in results] == [r["id"] for r in rows]
    assert all(r.status in ("ok", "oom", "no-candidate", "unsupported") for r in results)
    assert all(r.reason for r in results if r.status == "unsupported")
