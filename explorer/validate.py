"""``paraspace validate``: predict published measurements and report the error.

Reads a file in the schema of ``shared/validation/README.md``. Training rows
(``training.csv``, dense and MoE), communication rows (``comm.csv``: DeepEP
dispatch/combine) and inference rows (``inference.csv``: prefill / decode
latencies and serving throughput through ``kernels.inference``, the batch of
max-throughput rows from the KV cache) are predicted. For each training row the model comes from
the row's own columns (not the catalog), the hardware from the catalog entry
named by ``gpu``, the strategy from the row; a field the source left EMPTY is
searched over its valid values and the fastest feasible candidate is the
prediction (the published runs were tuned), as the reported ``chosen`` values
show. A comm row drives ``kernels.moe``'s dispatch with DeepEP's algorithm for
its mode. No per-row, per-model or per-source correction exists anywhere in
this path. ``measured`` and ``predicted`` are in the unit of the row's metric.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from paraspace.explorer.evaluate import evaluate, pack, pack_hardware, pack_model
from paraspace.kernels import inference
from paraspace.kernels.codes import DISPATCH_HIERARCHICAL, DISPATCH_LOW_LATENCY
from paraspace.kernels.moe import dispatch_s
from paraspace.kernels.training import moe_layer_params
from paraspace.spaces.catalog import LoadedSpace, load_hardware, names
from paraspace.spaces.encode import REASON_TEXT, Encoder
from paraspace.spaces.enums import DTYPE_BYTES, Dispatch, Reason, Recompute, Schedule, label, labels, parse
from paraspace.spaces.errors import CatalogError
from paraspace.spaces.schema import Hardware, Model, SpaceSpec, validate

TRAINING_REQUIRED = ("id", "source", "quality", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "glu",
                     "gpu", "n_gpus", "tp", "pp", "dp", "cp", "global_batch", "dtype", "metric", "value", "step_time_s")
#: the quantities a training row may publish (``metric``; shared/validation/README.md): each is
#: converted to ``step_time_s`` by the source's own formula, and the step time is what is predicted
TRAINING_METRICS = ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu")
#: the columns every comm and inference row is read by: what it is and what was measured
MEASUREMENT_REQUIRED = ("id", "source", "quality", "metric", "value")
#: an FSDP trainer's row (``fsdp_trainer``) accumulating its micro-batches' gradients: reduced
#: once, after the last (``defer_grad_sync``, the whole unsharded gradient held in the
#: reduction precision), the idiom of FSDP trainers: PyTorch's pipeline schedules
#: (``torch.distributed.pipelining`` ``backward_maybe_with_nosync``: "accumulate gradients on
#: previous steps and reduce them on the last step"), KempnerForge (``training/grad.py``
#: ``maybe_no_sync``: ``set_requires_gradient_sync(False)`` on every micro-step but the last)
#: and Composer (its default ``SINGLE_AUTO_SYNC``: ``no_sync`` but on the final micro-batch);
#: reduced every micro-batch only where the deferred gradient does not fit. Deferring never
#: costs time (it drops reductions), so the fastest feasible candidate defers whenever it
#: fits: ``np.argmin`` keeps the first of equal step times, and the deferred value is listed
#: first. The space's rule drops it where a step runs one micro-batch
FSDP_DEFER = [True, False]
#: values searched where a source left a field EMPTY
UNKNOWN_SEARCH: dict[str, list[Any]] = {
    "micro_batch": [1, 2, 4, 8],
    # every mode but torchtitan's per-op policy, which a row names as `selective` (the
    # schema's word for any partial recompute; read as Megatron's attention core, see
    # docs/validation.md), so an EMPTY field is not it
    "recompute": [m for m in labels(Recompute) if m != label(Recompute.SELECTIVE_OPS)],
    "sequence_parallel": [False, True],
    "zero": [0, 1, 2, 3],
    # not a column of the schema, so always unknown: Megatron-Core and NeMo benchmark
    # configurations turn it on with sequence parallelism. Searched only where the row's
    # data parallelism is not fully sharded (FULLY_SHARDED)
    "tp_overlap": [False, True],
    "ep": [1, 2, 4, 8, 16, 32, 64],
    "dispatch": ["alltoall", "allgather", "hierarchical"],
}
#: the ``zero`` stage of fully sharded data parallelism (FSDP, ZeRO-3). Overlapping the
#: tensor-parallel collectives with the GEMMs (``tp_overlap``: Transformer Engine's
#: userbuffers, which Megatron-Core runs beside its distributed optimizer, ZeRO-1) is not
#: what a ZeRO-3 row runs: FSDP trainers (PyTorch FSDP2 with DTensor tensor parallelism:
#: torchtitan, KempnerForge, NeMo Automodel; DeepSpeed ZeRO-3) issue those collectives in
#: line, unless an asynchronous-TP option is on (torchtitan's
#: ``parallelism.enable_async_tensor_parallel`` and NeMo Automodel's parallelizer's
#: ``enable_async_tensor_parallel``, both False by default), which no column records. A
#: ZeRO-3 row with tensor parallelism is therefore priced without the overlap, not
#: searched for it (leave-one-source-out 10.4% -> 9.8%; KempnerForge 16.0% -> 11.2%).
#: FSDP trainers also checkpoint with PyTorch's non-reentrant checkpoint
#: (``torch.distributed`` ``checkpoint_wrapper``'s default ``CheckpointImpl.NO_REENTRANT``;
#: llm-foundry's FSDP configurations set ``activation_checkpointing_reentrant: false``),
#: whose full recompute skips the down projection (``SpaceSpec.checkpoint = "early-stop"``).
#: ZeRO-3 rows are read so: leave-one-source-out MAPE 9.84% -> 9.0%, in sample 8.71% ->
#: 7.9% (MosaicML 9.2% -> 7.6%, NeMo Automodel 19.8% -> 17.1%; Narayanan et al.'s DeepSpeed
#: ZeRO-3 rows, which rerun the whole forward, 13.9% -> 14.9%: no column names the trainer).
#: And they store each rank's parameter shard as FSDP's mixed precision does, once, as the
#: optimizer's fp32 master cast to 16 bits as it is gathered (``SpaceSpec.zero3_shard =
#: "master"``: 16 bytes a parameter of the shard with Adam, not DeepSpeed's 18): three ok
#: rows that ran, priced out of memory by the 2 bytes, are predicted (NeMo Automodel's Kimi
#: K2 on 256 H100 -8%, Qwen3-30B-A3B on 8 H100 +18%, KempnerForge's Llama 3 70B on 8 H200
#: -44%), so the ok rows' MAPE rises (in sample 7.81% -> 8.01%, leave-one-source-out 8.44%
#: -> 8.63%) while the error counting the rows priced out of memory falls (8.26% -> 8.24%).
#: A ZeRO-3 row whose notes name DeepSpeed (``deepspeed_trainer``) is read as DeepSpeed runs
#: instead: reentrant checkpoint, 16-bit partition (Narayanan et al.'s five predicted ZeRO-3
#: rows 2-5 points less fast; in sample 8.01% -> 7.94%, leave-one-source-out 8.63% -> 8.57%,
#: Narayanan et al. 18.3% -> 17.5%); and a row whose notes name FSDP is an FSDP trainer's
#: whatever its ZeRO stage column says (``fsdp_trainer``: KempnerForge's one-rank TP runs,
#: ``zero`` 0, -18.1% -> -9.2% and -18.7% -> -18.3%; leave-one-source-out 8.57% -> 8.53%)
FULLY_SHARDED = 3
#: the row's ``attention`` column (the fused-attention kernel generation it ran) as the
#: space's (flash_attention, attention_kernel). ``unfused`` materialises the s x s scores
#: (Megatron-LM before FlashAttention); EMPTY (the source does not let one tell, or a
#: kernel outside these, e.g. FlexAttention) is taken as the FlashAttention-2 class, what
#: PyTorch SDPA, cuDNN and Transformer Engine run today
ATTENTION_KERNELS: dict[str, tuple[bool, str]] = {
    "unfused": (False, "flash2"), "flash1": (True, "flash1"), "flash2": (True, "flash2"), "flash3": (True, "flash3"),
}
UNKNOWN_ATTENTION = "flash2"
#: 0/1 flag columns of the schema
FLAGS = ("glu", "mla", "sequence_parallel")
#: columns that name one training job; its rows are configurations of it
JOB_COLUMNS = ("model", "gpu", "n_gpus", "seq", "global_batch", "dtype")
#: a row's ``quality`` (shared/validation/README.md): the error targets hold on ok rows
QUALITIES = ("ok", "uncertain")
#: measured peak memory in a row's notes (README: "peak memory X GiB", "memory/GPU X GB"; and
#: torchtitan's training log as the community H200 rows quote it, "memory X GiB at step N":
#: the caching allocator's peak reserved memory up to that step, what torchtitan's metrics
#: print, as its other rows' "peak memory")
_MEMORY = re.compile(r"\b(?:peak memory|memory/GPU|memory(?= \S+ Gi?B at step [0-9]))"
                     r" ([0-9]+(?:\.[0-9]+)?) (GiB|GB)\b")
#: a row whose notes name PyTorch FSDP ("FSDP2", "PyTorch FSDP FULL_SHARD") ran an FSDP
#: trainer whatever its ZeRO stage column says: KempnerForge's "fsdp1" runs (one data-parallel
#: rank, so ``zero`` 0) issue their DTensor TP collectives in line and checkpoint as PyTorch
#: does, as its FSDP2 runs over more ranks (FULLY_SHARDED)
_FSDP = re.compile(r"\bFSDP")
#: a ZeRO-3 row whose notes name DeepSpeed (Narayanan et al.'s "DeepSpeed ZeRO-3 without model
#: parallelism") ran DeepSpeed's ZeRO-3, not an FSDP trainer's (FULLY_SHARDED): its checkpoint
#: is DeepSpeed's (``deepspeed.checkpointing``, reentrant: the whole forward again) and its
#: partitioned fp16 parameters sit beside the optimizer's fp32 master partition
_DEEPSPEED = re.compile(r"\bDeepSpeed\b", re.I)
#: a row whose notes say its router was forced to balance (NeMo Automodel's
#: ``fake_balanced_gate``: every expert gets the same tokens) routes with no imbalance:
#: ``moe_imbalance`` 1.0, where natural top-k routing's busiest rank is derived otherwise
#: (``kernels.routing``; issue 14: runs of one model differ by up to 50% between the two)
_FORCED_BALANCE = re.compile(r"\b(?:fake|forced)[ -]balanced (?:gate|router|routing)\b", re.I)
#: a row whose notes say it ran without ``torch.compile`` ("torch.compile=no", "torch.compile
#: disabled", "without torch.compile"): its layers' elementwise work runs as eager PyTorch
#: ops (``SpaceSpec.elementwise = "eager"``, ``kernels.elementwise``); a row that says
#: nothing keeps the default, fused kernels
_EAGER = re.compile(r"\btorch\.compile\s*(?:[=:]\s*(?:no|off|false|disabled)\b|(?:is\s+|was\s+)?(?:disabled|off)\b)"
                    r"|\b(?:without|no) torch\.compile\b", re.I)
#: a ``selective`` row whose notes name torchtitan's per-op policy ("per-op SAC", "selective
#: op"): the schema's word covers it and Megatron's attention-core recompute, which keep and
#: redo different tensors (``kernels.recompute``); the notes say which, as the column cannot
_SELECTIVE_OPS = re.compile(r"\bper-op SAC\b|\bselective[ -]op\b", re.I)
#: pairs of one job whose measured step times differ by less than this are not ranked
RANK_MIN_GAP = 0.05


def recompute_mode(recompute: str, notes: str) -> str:
    """The row's recompute mode: its column's, with ``selective`` read as
    ``selective-ops`` where the notes name the per-op policy (``_SELECTIVE_OPS``)."""
    if recompute == label(Recompute.SELECTIVE) and _SELECTIVE_OPS.search(notes):
        return label(Recompute.SELECTIVE_OPS)
    return recompute


def eager_ops(notes: str) -> bool:
    """Whether the notes say the run did not compile its layers (``_EAGER``)."""
    return _EAGER.search(notes) is not None


def fsdp_trainer(notes: str) -> bool:
    """Whether the notes name PyTorch FSDP as the run's trainer (``_FSDP``)."""
    return _FSDP.search(notes) is not None


def deepspeed_trainer(notes: str) -> bool:
    """Whether the notes name DeepSpeed as the run's trainer (``_DEEPSPEED``)."""
    return _DEEPSPEED.search(notes) is not None


def forced_balance(notes: str) -> bool:
    """Whether the notes say the run's router was forced to balance (``_FORCED_BALANCE``)."""
    return _FORCED_BALANCE.search(notes) is not None


def noted_memory_bytes(notes: str) -> float | None:
    """The first measured peak memory the notes give, in bytes (GiB binary, GB decimal)."""
    found = _MEMORY.search(notes)
    if not found:
        return None
    return float(found.group(1)) * (2.0**30 if found.group(2) == "GiB" else 1e9)


def ranking(results: list[RowResult]) -> dict[str, Any]:
    """Pairwise order agreement: over pairs of predicted rows of one job whose
    measured step times differ by at least ``RANK_MIN_GAP`` (of the faster), the
    share whose predicted order is the measured one (``agreement``; a predicted
    tie counts as a miss). ``ties`` are pairs predicted equal: their columns
    describe one configuration (a difference no column carries, such as
    torch.compile or another framework release); ``distinguished`` is the
    agreement over the other pairs."""
    by_job: dict[tuple[str, ...], list[RowResult]] = {}
    for r in results:
        if r.job and r.predicted is not None and r.measured is not None:
            by_job.setdefault(r.job, []).append(r)
    pairs = agree = ties = 0
    for rows in by_job.values():
        for i, a in enumerate(rows):
            for b in rows[i + 1:]:
                if abs(a.measured - b.measured) < RANK_MIN_GAP * min(a.measured, b.measured):
                    continue
                pairs += 1
                agree += (a.predicted - b.predicted) * (a.measured - b.measured) > 0
                ties += abs(a.predicted - b.predicted) <= 1e-9 * max(a.predicted, b.predicted)
    return {"pairs": pairs, "agreement": agree / pairs if pairs else None, "ties": ties,
            "distinguished": agree / (pairs - ties) if pairs > ties else None}


def memory_error(results: list[RowResult]) -> dict[str, Any]:
    """Mean absolute error of the predicted peak memory where a source measured it
    (rows predicted, in memory or not: a measured run that we call out of memory
    is an error of the memory model too)."""
    errs = [(r.mem_peak_bytes - r.measured_mem_bytes) / r.measured_mem_bytes for r in results
            if r.mem_peak_bytes is not None and r.measured_mem_bytes]
    if not errs:
        return {"n": 0}
    return {"n": len(errs), "mape": float(np.mean(np.abs(errs))), "mean_signed": float(np.mean(errs))}


@dataclass
class RowResult:
    id: str
    source: str
    quality: str
    gpu: str
    metric: str
    #: the published and the predicted value, in the unit of ``metric``
    measured: float | None
    predicted: float | None
    status: str  # ok | oom | no-candidate | unsupported
    chosen: dict[str, Any] = field(default_factory=dict)
    #: why a row is unsupported: the field, its value and what was expected
    reason: str = ""
    #: the chosen candidate's predicted peak memory per device, and the source's
    #: measured peak where its notes give one (training rows)
    mem_peak_bytes: float | None = None
    measured_mem_bytes: float | None = None
    #: the prediction's 80% band (``explorer.bands``; training rows)
    predicted_lo: float | None = None
    predicted_hi: float | None = None
    #: what makes two rows the same job (model, GPU, GPU count, sequence, batch,
    #: dtype): pairs of one job rank its configurations (``ranking``)
    job: tuple[str, ...] = ()
    #: inference rows: the serving engine (``framework_of``), and for decode metrics the
    #: memory-bandwidth bound in the metric's unit (``decode_ceiling``: the most a
    #: throughput can be, the least a per-token latency can be)
    framework: str = ""
    ceiling: float | None = None

    @property
    def beyond_ceiling(self) -> bool:
        """The prediction is past the memory-bandwidth bound (a throughput above it, a
        per-token latency below it), beyond float rounding."""
        if self.ceiling is None or self.predicted is None or math.isnan(self.predicted):
            return False
        if self.metric in LATENCY_BOUNDED:
            return bool(self.predicted < self.ceiling * (1.0 - 1e-9))
        return bool(self.predicted > self.ceiling * (1.0 + 1e-9))

    @property
    def error(self) -> float | None:
        if self.measured is None or self.predicted is None:
            return None
        return (self.predicted - self.measured) / self.measured


def _num(row: dict[str, str | None], key: str, source: str, kind: type = int, minimum: int = 0) -> Any:
    """The cell as a finite number of ``kind`` (EMPTY: None): integers must be whole,
    from ``minimum`` (0, or 1 for a count) and below 2^53 (the kernels compute in
    float64), 0/1 flags 0 or 1."""
    text = row.get(key)
    if text is None or text == "":
        return None
    where = f"row {row.get('id')}: {key}"
    try:
        number = float(text)
    except ValueError:
        raise CatalogError(source, where, text, f"a {'whole' if kind is int else 'decimal'} number") from None
    if not math.isfinite(number):
        raise CatalogError(source, where, text, "a finite number")
    if kind is float:
        return number
    if not number.is_integer() or number < minimum or number >= 2.0**53:
        raise CatalogError(source, where, text, f"a whole number from {minimum} to 2^53")
    if key in FLAGS and number not in (0.0, 1.0):
        raise CatalogError(source, where, text, "0 or 1")
    return int(number)


def _measured(row: dict[str, str | None], key: str, source: str) -> float | None:
    """A published value: a positive finite number, or EMPTY (None)."""
    value = _num(row, key, source, float)
    if value is not None and value <= 0.0:
        raise CatalogError(source, f"row {row.get('id')}: {key}", row.get(key), "a positive number")
    return value


def read(path: str | Path) -> pl.DataFrame:
    """The CSV with every field as text (EMPTY -> null); checks the training header."""
    path = Path(path)
    if not path.is_file():
        raise CatalogError("command line", "FILE", str(path), "an existing validation CSV")
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise CatalogError(path, "contents", type(err).__name__, "a readable UTF-8 CSV file") from None
    if not text.strip():
        raise CatalogError(path, "contents", "(empty)", "a header row and one row per measurement")
    try:
        df = pl.read_csv(text.encode(), infer_schema_length=0)
    except (pl.exceptions.PolarsError, ValueError) as err:
        where, what = malformed_line(text)
        if where:  # the line and what is wrong with it, not the parser's quote of a field
            raise CatalogError(path, where, what, "a comma-separated row of the header's fields") from None
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CatalogError(path, "contents", first[:200], "a comma-separated file with a header row") from None
    for required in ("id",):
        if required not in df.columns:
            raise CatalogError(path, "header", ",".join(df.columns[:6]), "the validation schema's columns, 'id' among them")
    kind = kind_of(df)
    required = {"training": TRAINING_REQUIRED, "comm": MEASUREMENT_REQUIRED,
                "inference": MEASUREMENT_REQUIRED + INFERENCE_REQUIRED}[kind]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise CatalogError(path, "header", missing[0], f"the {kind}.csv columns {list(required)}")
    return df


def malformed_line(text: str) -> tuple[str, str]:
    """("line N", what is wrong) of the first CSV line with another field count than the
    header, or that ends inside a quoted field (a truncated file); ("", "") if none is."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader)
        for row in reader:
            if len(row) != len(header):
                return f"line {reader.line_num}", f"{len(row)} fields (the header has {len(header)})"
    except csv.Error as err:  # "unexpected end of data": a quoted field the file ends in
        return f"line {reader.line_num}", str(err)
    return "", ""


def kind_of(df: pl.DataFrame) -> str:
    """comm (has tokens_per_rank), inference (has input_len), else training."""
    if "tokens_per_rank" in df.columns:
        return "comm"
    if "input_len" in df.columns:
        return "inference"
    return "training"


def row_model(row: dict[str, str | None], source: str, where: str) -> Model:
    """The model a row describes, from its columns only: MHA/GQA with the row's
    ``head_dim`` (hidden / heads where the column is missing), or MLA from its ranks
    and per-head dims; dense or MoE. GPT-style (GeLU) models carry biases, dropout
    and tied embeddings, as Megatron's GPT and MPT do; gated ones none of them."""
    ints = {k: _num(row, k, source) for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "glu")}
    for key, value in ints.items():
        if value is None or (value == 0 and key != "glu"):
            raise CatalogError(where, key, row.get(key), "a positive whole number (EMPTY is not allowed here)")
    glu = ints["glu"] == 1
    raw: dict[str, Any] = {
        "name": row.get("id") or "row", "description": row.get("model") or row.get("id") or "row",
        "layers": ints["layers"], "hidden": ints["hidden"], "heads": ints["heads"], "kv_heads": ints["kv_heads"],
        "ffn": ints["ffn"], "vocab": ints["vocab"], "glu": glu, "bias": not glu, "tied_embeddings": not glu,
        "dropout": not glu,
    }
    head_dim = _num(row, "head_dim", source)
    if head_dim is None:  # files before the head_dim column: README's "hidden / heads unless notes say"
        noted = _HEAD_DIM.search(row.get("notes") or "")
        head_dim = int(noted.group(1)) if noted else None
    if _num(row, "mla", source) == 1:
        mla = {k: _num(row, col, source) for k, col in (("q_lora_rank", "q_lora_rank"), ("kv_lora_rank", "kv_lora_rank"),
                                                        ("qk_rope_head_dim", "rope_head_dim"),
                                                        ("qk_nope_head_dim", "qk_nope_head_dim"),
                                                        ("v_head_dim", "v_head_dim"))}
        mla["q_lora_rank"] = mla["q_lora_rank"] or 0  # EMPTY: queries projected directly (V2-Lite)
        for key, value in mla.items():
            if value is None:
                col = "rope_head_dim" if key == "qk_rope_head_dim" else key
                raise CatalogError(where, col, None, "a value for an MLA row (mla = 1)")
        raw["mla"] = mla
        # MLA's attention runs on the MLA dims; head_dim (nope + rope) only names them
        raw["head_dim"] = mla["v_head_dim"]
    elif head_dim is not None:
        raw["head_dim"] = head_dim
    if row.get("n_experts"):
        moe = {k: _num(row, col, source) for k, col in (("experts", "n_experts"), ("top_k", "topk"),
                                                        ("expert_ffn", "expert_ffn"),
                                                        ("shared_experts", "n_shared_experts"),
                                                        ("dense_layers", "first_dense_layers"))}
        for key in ("experts", "top_k", "expert_ffn"):
            if not moe[key]:
                col = {"experts": "n_experts", "top_k": "topk"}.get(key, key)
                raise CatalogError(where, col, row.get(col), "a positive number for an MoE row (n_experts given)")
        raw["moe"] = {k: v for k, v in moe.items() if v is not None}
    return validate(Model, raw, where)


def row_hardware(row: dict[str, str | None], source: str, where: str, gpu: str) -> Hardware:
    """The catalog profile named by ``gpu``, built from servers of the row's
    ``gpus_per_node`` (the NVLink domain of HGX-style parts is the server)."""
    if gpu not in names("hardware"):
        raise CatalogError(where, "gpu", gpu, f"one of {names('hardware')}")
    hw = load_hardware(gpu)
    per_node = _num(row, "gpus_per_node", source)
    if per_node is None:
        return hw
    if per_node < 1:
        raise CatalogError(where, "gpus_per_node", row.get("gpus_per_node"), "a positive number")
    return hw.with_node_devices(per_node, f"{where}: gpus_per_node")


def training_space(row: dict[str, str | None], source: str) -> tuple[LoadedSpace, dict[str, Any]]:
    """The row as a space: known fields fixed, EMPTY fields searched. Returns it and the search lists.

    Everything comes from the row's columns: the model (``row_model``), the node size
    (``gpus_per_node``), the attention kernel (``attention``); nothing from its source."""
    rid = row.get("id") or ""
    where = f"{source}: row {rid}"
    if row.get("metric") not in TRAINING_METRICS:  # a typo would otherwise pass as a step time
        raise CatalogError(where, "metric", row.get("metric"), f"one of {list(TRAINING_METRICS)}")
    ints = {k: _num(row, k, source) for k in ("layers", "seq", "n_gpus", "tp", "pp", "dp", "cp", "global_batch")}
    for key, value in ints.items():
        if not value:
            raise CatalogError(where, key, row.get(key), "a positive whole number (EMPTY is not allowed here)")
    if ints["tp"] * ints["pp"] * ints["dp"] * ints["cp"] != ints["n_gpus"]:
        raise CatalogError(where, "dp", ints["dp"], f"tp*pp*dp*cp == n_gpus = {ints['n_gpus']}")
    model = row_model(row, source, where)
    hardware = row_hardware(row, source, where, row.get("gpu") or "")
    searched: dict[str, Any] = {}
    dims: dict[str, Any] = {"tp": [ints["tp"]], "pp": [ints["pp"]], "dp": [ints["dp"]], "cp": [ints["cp"]]}
    if model.moe is not None:
        ep = _num(row, "ep", source)
        if ep == 0:
            raise CatalogError(where, "ep", row.get("ep"), "a positive number or EMPTY")
        dims["ep"] = [ep] if ep is not None else UNKNOWN_SEARCH["ep"]
        if ep is None:
            searched["ep"] = dims["ep"]
        # the token dispatchers of Megatron-Core (all-to-all(v), all-gather, and DeepEP's
        # hierarchical kernels behind its ``flex`` dispatcher) and of NeMo Automodel (DeepEP)
        dims["dispatch"] = searched["dispatch"] = UNKNOWN_SEARCH["dispatch"]
    for key in ("micro_batch", "zero"):
        value = _num(row, key, source)
        if value == 0 and key == "micro_batch" or (value is not None and key == "zero" and value > 3):
            raise CatalogError(where, key, row.get(key), "a positive number" if key == "micro_batch" else "0, 1, 2 or 3")
        dims[key] = [value] if value is not None else UNKNOWN_SEARCH[key]
        if value is None:
            searched[key] = dims[key]
    sp = _num(row, "sequence_parallel", source)
    dims["sequence_parallel"] = [bool(sp)] if sp is not None else UNKNOWN_SEARCH["sequence_parallel"]
    if sp is None:
        searched["sequence_parallel"] = dims["sequence_parallel"]
    notes = row.get("notes") or ""
    # an FSDP trainer's row (FULLY_SHARDED, or notes that name FSDP): TP collectives in line,
    # PyTorch's early-stopping checkpoint, the shard stored as the fp32 master; not one whose
    # notes name DeepSpeed
    fsdp = (dims["zero"] == [FULLY_SHARDED] or fsdp_trainer(notes)) and not deepspeed_trainer(notes)
    if any(dims["sequence_parallel"]) and ints["tp"] > 1:
        if fsdp:
            dims["tp_overlap"] = [False]
        else:
            dims["tp_overlap"] = searched["tp_overlap"] = UNKNOWN_SEARCH["tp_overlap"]
    if fsdp:  # the trainers' gradient accumulation (FSDP_DEFER); one micro-batch has none to defer
        dims["defer_grad_sync"] = searched["defer_grad_sync"] = FSDP_DEFER
    recompute = row.get("recompute")
    if recompute:
        if recompute not in labels(Recompute):
            raise CatalogError(where, "recompute", recompute, f"one of {labels(Recompute)} or EMPTY")
        dims["recompute"] = [recompute_mode(recompute, notes)]
    else:
        dims["recompute"] = searched["recompute"] = UNKNOWN_SEARCH["recompute"]
    layers, pp = ints["layers"], ints["pp"]
    vpp = _num(row, "vpp", source)
    if vpp == 0:
        raise CatalogError(where, "vpp", row.get("vpp"), "a positive number or EMPTY")
    if vpp is None:  # interleaving degree not stated: no interleaving, or a degree that divides the layers
        vpps = [1] + ([v for v in range(2, 17) if layers % (pp * v) == 0] if pp > 1 else [])
        dims["vpp"] = searched["vpp"] = vpps
    else:
        dims["vpp"] = [vpp]
    dims["schedule"] = [label(Schedule.ONE_F_ONE_B)] + ([label(Schedule.INTERLEAVED)] if max(dims["vpp"]) > 1 else [])
    attention = row.get("attention") or UNKNOWN_ATTENTION
    if attention not in ATTENTION_KERNELS:
        raise CatalogError(where, "attention", attention, f"one of {list(ATTENTION_KERNELS)} or EMPTY")
    flash, kernel = ATTENTION_KERNELS[attention]
    spec = validate(SpaceSpec, {
        "name": rid or "row", "description": f"{source} row {rid}", "model": model.name, "hardware": hardware.name,
        "devices": ints["n_gpus"], "global_batch": ints["global_batch"], "seq_len": ints["seq"],
        "dtype": row.get("dtype") or "bf16", "flash_attention": flash, "attention_kernel": kernel,
        # a published pipeline whose stages cannot hold equal layer counts ran uneven ones
        "uneven_layers": layers % pp != 0,
        "checkpoint": "early-stop" if fsdp else "reentrant",
        "zero3_shard": "master" if fsdp else "16-bit",
        "moe_imbalance": 1.0 if model.moe is not None and forced_balance(notes) else None,
        "elementwise": "eager" if eager_ops(notes) else "fused",
        "dimensions": dims,
    }, where)
    return LoadedSpace(spec=spec, model=model, hardware=hardware, source=where, raw={}), searched


def predict_training(row: dict[str, str | None], source: str) -> RowResult:
    base = RowResult(id=row.get("id") or "", source=row.get("source") or "", quality=row.get("quality") or "",
                     gpu=row.get("gpu") or "", metric="step_time_s", measured=None, predicted=None,
                     status="unsupported")
    base.measured = _measured(row, "step_time_s", source)
    base.measured_mem_bytes = noted_memory_bytes(row.get("notes") or "")
    base.job = tuple(row.get(k) or "" for k in JOB_COLUMNS)
    space, searched = training_space(row, source)
    enc = Encoder(space).encode_all()
    if enc.n_rows == 0:
        base.status = "no-candidate"
        reason = Reason(enc.most_dropped())
        base.reason = f"no configuration of the row's columns is valid: {REASON_TEXT[reason]} (rule {reason.name.lower()})"
        return base
    out = evaluate(pack(space), enc.columns)
    feasible = out["feasible"] > 0
    pool = np.flatnonzero(feasible) if feasible.any() else np.arange(enc.n_rows)
    best = pool[np.argmin(out["step_time_s"][pool])]
    base.predicted = float(out["step_time_s"][best])
    base.mem_peak_bytes = float(out["mem_peak_bytes"][best])
    base.predicted_lo = float(out["step_time_lo_s"][best])
    base.predicted_hi = float(out["step_time_hi_s"][best])
    base.status = "ok" if feasible.any() else "oom"
    for key in searched:
        value = enc.columns[key][best]
        base.chosen[key] = (labels(Recompute)[int(value)] if key == "recompute" else
                            labels(Dispatch)[int(value)] if key == "dispatch" else
                            bool(value) if key in ("sequence_parallel", "tp_overlap", "defer_grad_sync") else int(value))
    if "vpp" in searched:
        base.chosen["schedule"] = labels(Schedule)[int(enc.columns["schedule"][best])]
    return base


#: bytes per element of the precisions a row may name: a DeepEP payload's, and the
#: weights' and KV cache's of an inference row (FP8 checkpoints quantise the KV cache
#: too; activations, embedding and LM head stay 16-bit)
ROW_DTYPE_BYTES = {name: DTYPE_BYTES[name] for name in ("fp16", "bf16", "fp8")}
#: the GPU DeepEP's V1 numbers were measured on, for rows that name only the architecture
COMM_DEFAULT_GPU = "h800-sxm5-80gb"
#: experts assumed where a row does not state them (DeepSeek-V3's 256; divides every EP size 8..256)
COMM_DEFAULT_EXPERTS = 256
#: DeepEP's normal kernels route DeepSeek-V3 style: a token's experts on at most 4 nodes
NORMAL_MAX_NODES = 4


def predict_comm(row: dict[str, str | None], source: str) -> RowResult:
    """One DeepEP kernel call through ``kernels.moe.dispatch_s``: normal mode is the
    hierarchical algorithm (NVLink inside a node, one RDMA send per token and
    node, node-limited routing), low-latency mode the pure-RDMA one. Bandwidth
    rows are the bytes over the limiting link (NVLink for one node, RDMA across
    nodes) per second of the call; latency rows the call's time."""
    rid = row["id"] or ""
    where = f"{source}: row {rid}"
    metric = row.get("metric") or ""
    base = RowResult(id=rid, source=row.get("source") or "", quality=row.get("quality") or "",
                     gpu=row.get("gpu") or "", metric=metric, measured=_measured(row, "value", source),
                     predicted=None, status="unsupported")
    gpu = base.gpu = row.get("gpu") or COMM_DEFAULT_GPU  # the assumed GPU groups the row in the summary
    if gpu not in names("hardware"):
        raise CatalogError(where, "gpu", gpu, f"one of {names('hardware')} or EMPTY")
    ints = {k: _num(row, k, source) for k in ("ep", "n_nodes", "gpus_per_node", "tokens_per_rank", "hidden", "topk")}
    for key, value in ints.items():
        if value is None or value <= 0:
            raise CatalogError(where, key, value, "a positive number")
    if ints["ep"] != ints["n_nodes"] * ints["gpus_per_node"]:
        raise CatalogError(where, "ep", ints["ep"], f"n_nodes * gpus_per_node = {ints['n_nodes'] * ints['gpus_per_node']}")
    op, mode = row.get("op"), row.get("mode")
    if op not in ("dispatch", "combine"):
        raise CatalogError(where, "op", op, "dispatch or combine")
    if mode not in ("normal", "low_latency"):
        raise CatalogError(where, "mode", mode, "normal or low_latency")
    if metric not in ("bandwidth_GBps", "latency_us"):
        raise CatalogError(where, "metric", metric, "bandwidth_GBps or latency_us")
    dtype = row.get(f"{op}_dtype") or ""
    if dtype not in ROW_DTYPE_BYTES:
        raise CatalogError(where, f"{op}_dtype", dtype, f"one of {sorted(ROW_DTYPE_BYTES)}")
    experts = _num(row, "n_experts", source) or COMM_DEFAULT_EXPERTS
    hw = row_hardware(row, source, where, gpu)
    _, tiers, _ = pack_hardware(hw, "bf16")
    token_bytes = ints["tokens_per_rank"] * ints["hidden"] * ROW_DTYPE_BYTES[dtype]
    algorithm = DISPATCH_HIERARCHICAL if mode == "normal" else DISPATCH_LOW_LATENCY
    max_nodes = NORMAL_MAX_NODES if mode == "normal" else 0
    seconds, intra, inter = dispatch_s(algorithm, token_bytes, float(ints["ep"]), 1.0, float(experts),
                                       float(ints["topk"]), float(max_nodes), tiers)
    if metric == "latency_us":
        base.predicted = seconds * 1e6
    else:
        bottleneck = intra
        if mode == "low_latency":
            bottleneck = inter
        elif ints["n_nodes"] > 1:
            # DeepEP's internode "RDMA bandwidth" counts a token once per distinct node of
            # its experts, its own node included (deepseek-ai/DeepEP tests/test_internode.py:
            # rdma_idx = topk_idx // (experts / nodes), uniqued per token, then
            # num_rdma_token_sent = rdma_idx.ne(-1).sum()); ``inter`` holds the other nodes
            # only, each with the same probability, so the own node adds inter / (nodes - 1)
            bottleneck = inter * ints["n_nodes"] / (ints["n_nodes"] - 1)
        base.predicted = bottleneck / seconds / 1e9
    base.status = "ok"
    base.chosen = {"gpu": gpu, "experts": experts, "algorithm": label(Dispatch(algorithm))}
    return base


#: the ``kernels.inference.OUTPUTS`` column each inference metric reads
INFERENCE_METRICS = {
    "prefill_latency_s": "prefill_s",
    "ttft_s": "prefill_s",  # the prefill yields the first token
    "decode_latency_per_token_s": "decode_step_s",
    "tpot_s": "decode_step_s",
    "total_latency_s": "total_s",
    "throughput_tokens_per_s": "tokens_per_s",  # prompt + generated tokens
    "output_throughput_tokens_per_s": "output_tokens_per_s",
}
INFERENCE_REQUIRED = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "glu", "n_gpus", "tp", "pp",
                      "input_len", "output_len")
#: README: "Head dimension = hidden/heads unless notes give another value"
_HEAD_DIM = re.compile(r"\bhead_dim (\d+)")


def inference_model(row: dict[str, str | None], source: str) -> Model:
    """The row's model: ``row_model``, the same reading as training rows."""
    return row_model(row, source, f"{source}: row {row.get('id')}")


#: closed-loop serving rows (``concurrency`` given, aggregated): the metric's column of
#: the serving space's simulated candidate (``explorer.serve``)
SERVING_METRICS = ("ttft_s", "tpot_s", "output_tokens_per_s_per_gpu")
#: host and scheduler time per engine iteration, as the catalog serving spaces assume
SERVING_HOST_US = 200.0
#: requests a closed-loop row's benchmark sends per concurrent user: AIConfigurator's own
#: measurement harnesses send 10 x concurrency (ai-dynamo/aiconfigurator
#: ``eval/benchmarks/genai_perf_runner.py``: ``--request-count`` v * 10 after a
#: ``--warmup-request-count`` of v * 2; ``bench_serving_runner.py``: ``num_prompts`` cc * 10,
#: "~10 requests per active user"). The simulation starts them cold, all users at once, as
#: a measured run does once its warm-up has drained, so the start-up burst (every user's
#: prompt queued together) is a tenth of the requests the means are taken over, as in
#: the measurement, not the thousandth a long run makes it (``steady_state`` off: the
#: statistics over every request, as the benchmark's)
SERVING_REQUESTS_PER_USER = 10


#: the engine's token budget over max_batch + input_len, in tokens: the closed-loop rows
#: (AIConfigurator's measured deployments) carry no max_num_tokens column, and AIConfigurator
#: generated their engines' configuration with "agg max_num_tokens = max_batch_size + isl +
#: 1500" and, for a disaggregated deployment's prefill workers, "prefill max_num_tokens = isl +
#: 1500" (ai-dynamo/aiconfigurator ``generator/rule_plugin/benchmark/trtllm.rule``,
#: ``rule_plugin/trtllm.rule`` and ``vllm.rule``); the budget decides how many prompts an
#: iteration takes, hence TTFT
SERVING_TOKEN_SLACK = 1500
#: the engine family (the framework column's first word) -> (its scheduler, whether it runs
#: the overlap scheduler). vLLM V1 always chunks prefills (docs.vllm.ai, configuration/
#: optimization, "Chunked Prefill") and schedules synchronously by default; SGLang chunks
#: (``--chunked-prefill-size``) and overlaps by default (its zero-overhead batch scheduler,
#: lmsys.org/blog/2024-12-04-sglang-v0-4); TensorRT-LLM schedules whole prompts unless
#: ``enable_chunked_prefill`` is set (off in its LLM API and in AIConfigurator's
#: ``extra_engine_args.1.0.0rc3.yaml.j2``) and overlaps by default (nvidia.github.io/
#: TensorRT-LLM, features/overlap-scheduler: "Enabled by default"; AIConfigurator's rules
#: keep it for aggregated engines). An engine not listed: chunked, not overlapped.
ENGINE_SCHEDULER = {"vllm": ("continuous", False), "sglang": ("continuous", True),
                    "trtllm": ("continuous-unchunked", True)}


#: the engine families that keep the KV cache in the model's data type when a row does not
#: say otherwise: their ``kv_cache_dtype`` defaults to "auto", "the model data type"
#: (docs.vllm.ai, engine arguments; SGLang's ``--kv-cache-dtype auto`` alike), 16-bit
#: however the GEMM weights are quantised: an FP8 cache is asked for, never implied.
#: TensorRT-LLM's "auto" follows the checkpoint's quantisation instead (``KvCacheConfig.dtype``),
#: which no column names: it and every engine not listed keep the cache in the row's dtype,
#: as before (AIConfigurator's FP8 TensorRT-LLM rows at TP 1 and 128 users measure latencies
#: that only an FP8 cache explains: a 16-bit one holds too few of their sequences)
MODEL_DTYPE_KV_ENGINES = ("vllm", "sglang")
#: the 16-bit type a model's activations (and so its "auto" cache) keep under 8-bit GEMMs
ACTIVATION_DTYPE = "bf16"


def row_kv_dtype(row: dict[str, str | None], dtype: str, where: str = "row") -> str:
    """The KV cache precision of an inference row: its ``kv_dtype`` column (one of
    ``ROW_DTYPE_BYTES``, else a ``CatalogError`` naming ``where``), else its engine's
    default (``MODEL_DTYPE_KV_ENGINES``): the model's 16-bit data type for vLLM and
    SGLang, the row's ``dtype`` otherwise."""
    stated = row.get("kv_dtype")
    if stated:
        if stated not in ROW_DTYPE_BYTES:
            raise CatalogError(where, "kv_dtype", stated, f"one of {sorted(ROW_DTYPE_BYTES)} or EMPTY")
        return stated
    if (framework_of(row.get("framework")) in MODEL_DTYPE_KV_ENGINES
            and DTYPE_BYTES.get(dtype, 2.0) < DTYPE_BYTES[ACTIVATION_DTYPE]):
        return ACTIVATION_DTYPE
    return dtype


def engine_scheduler(framework: str) -> tuple[str, bool]:
    """The serving scheduler of a row's engine and whether it overlaps (``ENGINE_SCHEDULER``)."""
    words = framework.lower().split()
    return ENGINE_SCHEDULER.get(words[0] if words else "", ("continuous", False))


def predict_serving(row: dict[str, str | None], source: str) -> RowResult:
    """A closed-loop serving point (AIConfigurator's measured deployments): the row as
    a one-candidate serving space (``spaces.serving``) whose workload is the row's
    fixed lengths at its concurrency, evaluated by the analytic tier and simulated
    iteration by iteration (``explorer.serve.evaluate_space``); TTFT and TPOT are
    the simulated requests' means. The engine's scheduler and token budget are
    its framework's (``engine_scheduler``, ``SERVING_TOKEN_SLACK``). A disagg row's
    prefill group (``prefill_*``; ``check_deployment``) is the space's, its decode
    replicas the rest of ``n_gpus``, and the whole deployment is simulated."""
    from paraspace.explorer.serve import evaluate_space
    from paraspace.spaces.serving import LoadedServing, ServingSpec, check_serving

    rid = row.get("id") or ""
    where = f"{source}: row {rid}"
    metric = row.get("metric") or ""
    base = RowResult(id=rid, source=row.get("source") or "", quality=row.get("quality") or "",
                     gpu=row.get("gpu") or "", metric=metric, measured=_measured(row, "value", source),
                     predicted=None, status="unsupported")
    model = row_model(row, source, where)
    hardware = row_hardware(row, source, where, row.get("gpu") or "")
    ints = {k: _num(row, k, source) for k in ("n_gpus", "tp", "pp", "concurrency", "input_len", "output_len")}
    for key, value in ints.items():
        if not value:
            raise CatalogError(where, key, row.get(key), "a positive number (EMPTY is not allowed here)")
    batch = _num(row, "batch", source)
    attention_dp = _num(row, "attention_dp", source) == 1
    dtype = row.get("dtype") or ""
    ep = _num(row, "ep", source) or 1
    redundant = 0
    if model.moe is not None and ep > 1:  # an ep that does not divide the experts: redundant copies
        redundant = row_expert_slots(model.moe.experts, ep) - model.moe.experts
    # batch and token budget are per attention-DP rank; an engine of tp ranks runs tp of them
    batch_per_rank = batch or ints["concurrency"]
    scheduler, overlap = engine_scheduler(row.get("framework") or "")
    kv_dtype = row_kv_dtype(row, dtype, where)
    ranks = ints["tp"] if attention_dp else 1
    requests = SERVING_REQUESTS_PER_USER * ints["concurrency"]
    dims: dict[str, list[Any]] = {
        "tp": [ints["tp"]], "pp": [ints["pp"]], "ep": [ep], "attention_dp": [attention_dp], "dtype": [dtype],
        "kv_dtype": [kv_dtype], "redundant_experts": [redundant], "max_batch": [batch_per_rank * ranks],
        "max_tokens": [(batch_per_rank + ints["input_len"] + SERVING_TOKEN_SLACK) * ranks],
        "scheduler": [scheduler], "overlap_scheduler": [overlap]}
    if (row.get("mode") or "agg") == "disagg":  # the prefill group apart; its token budget AIConfigurator's
        # the space's disaggregated deployment: decode replicas batch continuously, prefill ones take
        # whole prompts while they fit the budget (``kernels.serving.disagg_one``), whatever the engine
        scheduler, overlap = "continuous", False
        prefill_tp = _num(row, "prefill_tp", source)
        prefill_ep = _num(row, "prefill_ep", source) or 1
        prefill_dp = _num(row, "prefill_attention_dp", source) == 1
        prefill_instances = _num(row, "prefill_instances", source)
        decode_engines = (ints["n_gpus"] - prefill_instances * prefill_tp) // ints["tp"]
        dims.update({"mode": ["disagg"], "prefill_tp": [prefill_tp], "scheduler": [scheduler],
                     "overlap_scheduler": [overlap],
                     "prefill_instances": [prefill_instances], "prefill_ep": [prefill_ep],
                     "prefill_attention_dp": [prefill_dp],
                     "max_tokens": [(ints["input_len"] + SERVING_TOKEN_SLACK) * (prefill_tp if prefill_dp else 1)]})
        requests = -(-requests // decode_engines)  # the simulation's n_requests is per decode engine
    raw = {
        "name": "row", "description": f"{source} row {rid}", "model": model.name, "hardware": hardware.name,
        "devices": ints["n_gpus"], "host_overhead_us": SERVING_HOST_US, "simulate_top": 1,
        "workload": {"input_len": ints["input_len"], "output_len": ints["output_len"],
                     "concurrency": ints["concurrency"], "n_requests": requests, "steady_state": False},
        "dimensions": dims,
    }
    spec = validate(ServingSpec, raw, where)
    space = LoadedServing(spec=spec, model=model, hardware=hardware, source=where, raw=raw)
    check_serving(space)
    cols, _ = evaluate_space(space)
    if len(cols["tp"]) == 0:
        base.status = "no-candidate"
        base.reason = "the row's deployment breaks a rule of serving spaces (paraspace serve --dry-run on it says which)"
        return base
    base.predicted = float(cols[metric][0])
    base.status = "ok" if cols["feasible"][0] > 0 else "oom"
    base.chosen = {"simulated": bool(cols["simulated"][0]), "batch": float(round(cols["batch"][0], 1))}
    if redundant:
        base.chosen["expert_slots"] = model.moe.experts + redundant  # type: ignore[union-attr]
    if metric in LATENCY_BOUNDED or metric in THROUGHPUT_BOUNDED:
        # a step runs at least one sequence (a latency's floor) and at most the
        # concurrency on one replica (a throughput's ceiling: it rises with the batch)
        if kv_dtype in ROW_DTYPE_BYTES and dtype in ROW_DTYPE_BYTES:
            srv = replica_record(model, tp=ints["tp"], pp=ints["pp"], ep=ep, attention_dp=attention_dp,
                                 n_gpus=ints["n_gpus"], dtype=dtype, kv_dtype=kv_dtype)[0]
            device, _, _ = pack_hardware(hardware, dtype)
            b = 1.0 if metric in LATENCY_BOUNDED else float(ints["concurrency"])
            base.ceiling = float(decode_ceiling(pack_model(model)[0], device[0], srv, b, float(ints["input_len"]),
                                                metric, per=ints["tp"] * ints["pp"]))
    return base


#: isolated-phase rows: the phase and the per-GPU throughput metric it is measured by
PHASE_METRICS = {"prefill": "input_tokens_per_s_per_gpu", "decode": "output_tokens_per_s_per_gpu"}
#: the inference ``mode`` values predicted (EMPTY reads as agg)
INFERENCE_MODES = ("agg", *PHASE_METRICS, "disagg")
#: the modes a closed-loop serving row runs as a one-candidate serving space (``predict_serving``)
SERVING_MODES = ("agg", "disagg")
#: columns that count GPUs, replicas or sequences: positive where given
DEPLOYMENT_COUNTS = ("n_gpus", "tp", "pp", "ep", "instances", "batch", "concurrency", "prefill_instances",
                     "prefill_tp", "prefill_pp", "prefill_ep", "prefill_batch")


def check_deployment(row: dict[str, str | None], source: str, where: str) -> None:
    """An inference row's counts are positive where given (``DEPLOYMENT_COUNTS``; a batch of 0
    is not EMPTY), and its GPUs add up as the schema says: instances x tp x pp (+ the prefill
    group's prefill_instances x prefill_tp x prefill_pp in a disagg row) = n_gpus, a
    ``CatalogError`` naming the field otherwise. A disagg row gives its prefill group and
    runs it on pipeline depth 1 (``spaces.serving``); no other row has one."""
    counts = {k: _num(row, k, source, minimum=1) for k in DEPLOYMENT_COUNTS}
    disagg = (row.get("mode") or "agg") == "disagg"
    prefill = ("prefill_instances", "prefill_tp")
    if disagg:
        for key in prefill:
            if counts[key] is None:
                raise CatalogError(where, key, row.get(key), "a positive number (EMPTY is not allowed in a disagg row)")
        if (counts["prefill_pp"] or 1) != 1:
            raise CatalogError(where, "prefill_pp", row.get("prefill_pp"), "1 or EMPTY: a prefill replica of one "
                               "pipeline stage (the serving space's prefill group)")
    else:
        for key in (*prefill, "prefill_pp", "prefill_ep", "prefill_attention_dp", "prefill_batch"):
            if row.get(key):
                raise CatalogError(where, key, row.get(key), "EMPTY outside a disagg row")
    n_gpus, tp, pp, instances = counts["n_gpus"], counts["tp"], counts["pp"], counts["instances"]
    if None in (n_gpus, tp, pp, instances):
        return  # the predictor names the missing one
    group = counts["prefill_instances"] * counts["prefill_tp"] if disagg else 0
    if instances * tp * pp + group != n_gpus:
        expected = f"(n_gpus - prefill_instances * prefill_tp) / (tp * pp) = {(n_gpus - group) / (tp * pp):g}" \
            if disagg else f"n_gpus / (tp * pp) = {n_gpus / (tp * pp):g}"
        raise CatalogError(where, "instances", row.get("instances"), expected)


def row_expert_slots(experts: int, ep: int) -> int:
    """Routed-expert slots of an EP group of ``ep`` ranks, read from a row that gives
    ``n_experts`` and ``ep`` but not its redundant experts (no column holds them): the
    smallest multiple of ep that is at least ``experts``. Every rank holds the same
    number of slots, and the slots beyond the experts hold redundant copies (EPLB,
    ``spaces.expert_balance``); where ep divides the experts there are none.
    DeepSeek-V3's 256 experts over EP72 or EP144 give 288 slots, the 32 redundant
    experts DeepSeek's inference overview states for its EP144 decode (open-infra-index
    ``202502OpenSourceWeek/day_6_one_more_thing_deepseekV3R1_inference_system_overview.md``)."""
    if experts < 1 or ep < 1:
        raise ValueError(f"experts = {experts}, ep = {ep}: expected both at least 1")
    return -(-experts // ep) * ep


#: MoE dispatch algorithms of a serving engine's attention-DP replica, none of them a
#: column: NCCL-style all-to-all(v), TensorRT-LLM's all-gather / reduce-scatter, DeepEP's
#: normal (hierarchical) and low-latency kernels; searched with two-batch overlap on and
#: off, the fastest kept (the published deployments were tuned, as for training rows)
PHASE_DISPATCH = ("alltoall", "allgather", "hierarchical", "low-latency")


def phase_layouts(model: Model, ep: int, attention_dp: bool) -> list[tuple[str, bool]]:
    """(dispatch, two-batch overlap) pairs a phase row is searched over: every pair of
    ``PHASE_DISPATCH`` x (off, on) where the replica has an all-to-all (MoE, attention
    DP, ep > 1); else the one layout without (all-to-all label, off)."""
    if model.moe is None or not attention_dp or ep <= 1:
        return [("alltoall", False)]
    return [(d, t) for d in PHASE_DISPATCH for t in (False, True)]


def replica_record(model: Model, *, tp: int, pp: int, ep: int, attention_dp: bool, n_gpus: int, dtype: str,
                   kv_dtype: str, dispatch: str = "alltoall", tbo: bool = False) -> np.ndarray:
    """One ``kernels.inference.SERVING`` record for a row's replica: a MoE EP group of
    ep > 1 ranks holds ``row_expert_slots`` slots, and the busiest rank's load from
    their EPLB placement over equally popular experts (no column gives the experts'
    popularity; ``spaces.expert_balance.imbalance`` at sigma 0), as ``explorer.serve``
    builds a serving space's replicas."""
    from paraspace.spaces import expert_balance

    slots, placement = 0.0, 1.0
    if model.moe is not None and ep > 1:
        n = row_expert_slots(model.moe.experts, ep)
        slots = float(n)
        placement = expert_balance.imbalance(model.moe.experts, n - model.moe.experts, ep, 0.0)
    return inference.serving(tp=tp, pp=pp, ep=ep, attention_dp=float(attention_dp), n_gpus=n_gpus,
                             weight_bytes=ROW_DTYPE_BYTES[dtype], act_bytes=2.0, kv_bytes=ROW_DTYPE_BYTES[kv_dtype],
                             expert_slots=slots, dispatch=float(parse(Dispatch, dispatch)),
                             tbo=float(tbo and attention_dp and ep > 1 and model.moe is not None),
                             placement_imbalance=placement)


def predict_phase(row: dict[str, str | None], source: str) -> RowResult:
    """A prefill or decode phase measured in isolation (DeepSeek's profile, SGLang's
    large-EP tests): one replica of tp x pp GPUs runs ``batch`` sequences per
    attention-DP rank (``batch`` EMPTY: as many as its KV cache holds, capped at the
    runtime's 4096) through ``kernels.inference``'s prefill of ``input_len`` tokens, or
    one decode step over a KV cache of ``input_len`` tokens; the metric is those tokens
    per second per GPU. An EP group whose ep does not divide the experts holds
    redundant copies (``row_expert_slots``); the dispatch algorithm and two-batch
    overlap are searched (``phase_layouts``). A replica whose cache cannot hold the
    batch is predicted out of memory."""
    rid = row.get("id") or ""
    where = f"{source}: row {rid}"
    mode, metric = row.get("mode") or "", row.get("metric") or ""
    base = RowResult(id=rid, source=row.get("source") or "", quality=row.get("quality") or "",
                     gpu=row.get("gpu") or "", metric=metric, measured=_measured(row, "value", source),
                     predicted=None, status="unsupported")
    if PHASE_METRICS.get(mode) != metric:
        raise CatalogError(where, "metric", metric, f"{PHASE_METRICS.get(mode)} for a {mode} row")
    ints = {k: _num(row, k, source) for k in ("tp", "pp", "input_len")}
    for key, value in ints.items():
        if not value:
            raise CatalogError(where, key, row.get(key), "a positive number (EMPTY is not allowed here)")
    model = row_model(row, source, where)
    hardware = row_hardware(row, source, where, row.get("gpu") or "")
    dtype = row.get("dtype") or ""
    if dtype not in ROW_DTYPE_BYTES or dtype not in hardware.device.peak_TFLOP_per_s:
        raise CatalogError(where, "dtype", dtype, f"one of {sorted(ROW_DTYPE_BYTES)} that {hardware.name} has a peak for")
    kv_dtype = row_kv_dtype(row, dtype, where)
    tp, pp = ints["tp"], ints["pp"]
    ep = _num(row, "ep", source) or 1
    if model.moe is not None and tp % ep:
        raise CatalogError(where, "ep", ep, f"a divisor of tp = {tp}")
    attention_dp = _num(row, "attention_dp", source) == 1
    device, tiers, tiles = pack_hardware(hardware, dtype, model.attention_kernel(UNKNOWN_ATTENTION))
    m, dev = pack_model(model)[0], device[0]
    seq = float(ints["input_len"])
    batch = _num(row, "batch", source)
    best: tuple[float, dict[str, Any]] | None = None
    for dispatch, tbo in phase_layouts(model, ep, attention_dp):
        s = replica_record(model, tp=tp, pp=pp, ep=ep, attention_dp=attention_dp, n_gpus=tp * pp, dtype=dtype,
                           kv_dtype=kv_dtype, dispatch=dispatch, tbo=tbo)[0]
        replica = float(batch * (tp if attention_dp else 1)) if batch else inference.max_batch(m, dev, s, seq)
        if replica < 1.0:
            continue
        if mode == "prefill":
            value = replica * seq / inference.prefill_s(m, dev, tiers, tiles, s, replica, seq) / (tp * pp)
        else:
            value = replica / inference.decode_step_s(m, dev, tiers, tiles, s, replica, seq) / (tp * pp)
        if best is None or value > best[0]:
            best = (value, {"s": s, "replica": replica, "dispatch": dispatch, "tbo": tbo})
    if best is None:
        base.status = "no-candidate"
        base.reason = "not one sequence's KV cache fits beside the weights in any layout"
        return base
    value, cand = best
    s, replica = cand["s"], cand["replica"]
    base.predicted = value
    base.status = "ok" if replica <= inference.kv_capacity(m, dev, s, seq) else "oom"
    base.chosen = {"batch": int(replica), "batch_limit": "row" if batch else "kv-cache"}
    if model.moe is not None and ep > 1:
        base.chosen["expert_slots"] = int(inference.expert_slots(m, s))
        base.chosen["placement_imbalance"] = round(float(s.placement_imbalance), 4)
    if len(phase_layouts(model, ep, attention_dp)) > 1:
        base.chosen.update(dispatch=cand["dispatch"], tbo=cand["tbo"])
    if mode == "decode":
        base.ceiling = decode_ceiling(m, dev, s, replica, seq, metric, per=tp * pp)
    return base


#: metrics of decode whose prediction the memory-bandwidth bound limits: latencies per
#: token from below, throughputs from above
LATENCY_BOUNDED = ("decode_latency_per_token_s", "tpot_s")
THROUGHPUT_BOUNDED = ("output_tokens_per_s_per_gpu", "output_throughput_tokens_per_s")


def decode_bytes_floor(m: Any, dev: Any, srv: Any, b: float, kv_len: float) -> float:
    """Bytes the fullest device of a replica must read from HBM in one decode step of
    ``b`` sequences over ``kv_len`` keys, whatever the kernels: its weights
    (``inference.device_weight_bytes``) less the input embedding table where it is a
    separate matrix (a lookup reads b of its rows) and less the routed-expert slots no
    token reaches (uniform routing's expected hits, ``inference.active_experts``, of
    the slots of every MoE layer a stage can hold), plus the KV cache of the sequences
    the device serves (``inference.kv_bytes_per_token`` per token kept). Everything
    subtracted is at least what the fullest device skips, so the result is a floor."""
    weights = inference.device_weight_bytes(m, srv)
    dp = srv.attention_dp > 0
    ta = 1.0 if dp else srv.tp
    pp = int(srv.pp)
    if m.tied_embeddings == 0 or pp > 1:
        weights -= m.vocab * m.hidden / ta * srv.act_bytes
    if m.experts > 0:
        moe_layers = m.layers - min(m.dense_layers, m.layers)
        stage_layers = min(moe_layers, math.ceil(m.layers / pp))
        slots = inference.expert_slots(m, srv)
        _, expert = moe_layer_params(m, ta, srv.ep, srv.tp / srv.ep)
        per_layer = expert * inference.slot_share(m, srv) * srv.weight_bytes
        hit = inference.active_experts(slots, m.top_k, b) / slots
        weights -= stage_layers * per_layer * (1.0 - hit)
    sequences = b / srv.tp if dp else b
    kv = sequences * inference.cached_tokens(m, kv_len) * inference.kv_bytes_per_token(m, srv)
    return float(max(weights, 0.0) + kv)


def decode_ceiling(m: Any, dev: Any, srv: Any, b: float, kv_len: float, metric: str, per: float = 1.0) -> float:
    """The memory-bandwidth bound of a decode metric (issue 15): a step of ``b``
    sequences of a replica takes at least ``decode_bytes_floor`` over the datasheet
    HBM bandwidth, so a per-token latency is at least that (``LATENCY_BOUNDED``) and
    the replica's output is at most b tokens per that time, divided by ``per`` (its
    GPUs for a per-GPU metric) or times it (replicas for a deployment's metric; the
    caller passes the factor)."""
    floor_s = decode_bytes_floor(m, dev, srv, b, kv_len) / dev.hbm_bytes_per_s
    if metric in LATENCY_BOUNDED:
        return floor_s
    if metric not in THROUGHPUT_BOUNDED:
        raise ValueError(f"metric {metric!r}: expected one of {LATENCY_BOUNDED + THROUGHPUT_BOUNDED}")
    if metric == "output_throughput_tokens_per_s":
        return b / floor_s * per
    return b / floor_s / per


def predict_inference(row: dict[str, str | None], source: str) -> RowResult:
    """One inference benchmark point through ``kernels.inference.serve``: the model
    from the row's columns, the hardware from ``gpu`` in the row's dtype, the
    row's batch (EMPTY: as many sequences as the KV cache holds, capped at
    trtllm-bench's 4096). For MoE rows an EMPTY ``ep`` is searched over the
    divisors of tp that divide the experts, and the attention layout (TP, or
    TensorRT-LLM's attention data parallelism, not a column) over both; the
    fastest candidate that fits is the prediction, as for training rows."""
    rid = row.get("id") or ""
    where = f"{source}: row {rid}"
    metric = row.get("metric") or ""
    mode = row.get("mode") or "agg"
    if mode not in INFERENCE_MODES:
        raise CatalogError(where, "mode", row.get("mode"), f"one of {list(INFERENCE_MODES)} or EMPTY (agg)")
    check_deployment(row, source, where)
    if row.get("concurrency") and mode in SERVING_MODES and metric in SERVING_METRICS:
        return predict_serving(row, source)
    if mode == "disagg":
        raise CatalogError(where, "concurrency", row.get("concurrency"),
                           f"a positive number with a metric of {list(SERVING_METRICS)} for a disagg row (an end-to-end "
                           "deployment under a closed loop of users)")
    if row.get("mode") in PHASE_METRICS:
        return predict_phase(row, source)
    base = RowResult(id=rid, source=row.get("source") or "", quality=row.get("quality") or "",
                     gpu=row.get("gpu") or "", metric=metric, measured=_measured(row, "value", source),
                     predicted=None, status="unsupported")
    if metric not in INFERENCE_METRICS:
        raise CatalogError(where, "metric", metric, f"one of {list(INFERENCE_METRICS)}")
    gpu = row.get("gpu") or ""
    if gpu not in names("hardware"):
        raise CatalogError(where, "gpu", gpu, f"one of {names('hardware')}")
    ints = {k: _num(row, k, source) for k in INFERENCE_REQUIRED}
    for key, value in ints.items():
        if value is None or value < (0 if key == "glu" else 1):
            raise CatalogError(where, key, value, "a positive number (EMPTY is not allowed here)")
    batch = _num(row, "batch", source)
    if batch is not None and batch < 1:
        raise CatalogError(where, "batch", batch, "a positive number, or EMPTY for a max-throughput run")
    tp, pp = ints["tp"], ints["pp"]
    if ints["n_gpus"] % (tp * pp):
        raise CatalogError(where, "n_gpus", ints["n_gpus"], f"a multiple of tp*pp = {tp * pp}")
    if pp > ints["layers"]:
        raise CatalogError(where, "pp", pp, f"at most layers = {ints['layers']}")
    dtype = row.get("dtype") or ""
    hw = load_hardware(gpu)
    if dtype not in ROW_DTYPE_BYTES or dtype not in hw.device.peak_TFLOP_per_s:
        known = [d for d in ROW_DTYPE_BYTES if d in hw.device.peak_TFLOP_per_s]
        raise CatalogError(where, "dtype", dtype, f"one of {known} (the precisions {gpu} has a peak for)")
    model = inference_model(row, source)
    ep = _num(row, "ep", source)
    searched: dict[str, list[Any]] = {}
    if model.moe is None:
        eps, layouts = [1], [False]
    else:
        experts = model.moe.experts
        if ep is not None:
            if ep < 1 or tp % ep:
                raise CatalogError(where, "ep", ep, f"a divisor of tp = {tp}")
            eps = [ep]  # one that does not divide the experts holds redundant copies (row_expert_slots)
        else:
            eps = searched["ep"] = [d for d in range(1, tp + 1) if tp % d == 0 and experts % d == 0]
        layouts = searched["attention"] = [False, True]
    device, tiers, tiles = pack_hardware(hw, dtype, model.attention_kernel(UNKNOWN_ATTENTION))
    packed_model = pack_model(model)
    column = inference.OUTPUTS.index(INFERENCE_METRICS[metric])
    higher_is_better = "throughput" in metric
    kv_dtype = row_kv_dtype(row, dtype, where)
    best: tuple[float, dict[str, Any]] | None = None
    for attention_dp in layouts:
        for e in eps:
            srv = replica_record(model, tp=tp, pp=pp, ep=e, attention_dp=attention_dp, n_gpus=ints["n_gpus"],
                                 dtype=dtype, kv_dtype=kv_dtype)
            out = inference.serve(packed_model[0], device[0], tiers, tiles, srv[0], float(batch or 0),
                                  float(ints["input_len"]), float(ints["output_len"]))
            value = float(out[column])
            cand = {"fits": out[inference.I_FITS] > 0, "value": value, "batch": float(out[inference.I_BATCH]),
                    "max_batch": float(out[inference.I_MAX_BATCH]), "replicas": float(out[inference.I_REPLICAS]),
                    "ep": e, "attention": "dp" if attention_dp else "tp", "srv": srv[0]}
            if math.isnan(value):
                continue
            key = (cand["fits"], value if higher_is_better else -value)
            if best is None or key > best[0]:
                best = (key, cand)  # type: ignore[assignment]
    if best is None:  # not one sequence fits beside the weights in any layout
        base.status = "no-candidate"
        base.reason = "not one sequence fits beside the weights in any layout"
        return base
    cand = best[1]
    base.predicted = cand["value"]
    base.status = "ok" if cand["fits"] else "oom"
    base.chosen = {"batch": int(cand["batch"]), "replicas": int(cand["replicas"])}
    if batch is None:  # what bounded the batch: the KV cache, or the runtime's cap below what it holds
        base.chosen["batch_limit"] = "runtime-cap" if cand["max_batch"] >= inference.BATCH_CAP else "kv-cache"
    for key in searched:
        base.chosen[key] = cand[key]
    if metric in LATENCY_BOUNDED or metric in THROUGHPUT_BOUNDED:
        b = float(batch) if metric in LATENCY_BOUNDED and batch else cand["batch"]
        base.ceiling = decode_ceiling(packed_model[0], device[0], cand["srv"], b, float(ints["input_len"]), metric,
                                      per=cand["replicas"])
    return base


def predict_row(predict: Any, row: dict[str, str | None], source: str, duplicate_of: int | None = None) -> RowResult:
    """``predict`` on one row; a row it cannot take (a field out of the schema, a GPU
    not in the catalog, a model the schema cannot hold, an id an earlier row has:
    ``duplicate_of`` its data row number) is ``unsupported`` with the reason, and the
    rest of the file is still predicted."""
    try:
        if duplicate_of is not None:  # counted once: the README's ids are unique across the files
            raise CatalogError(f"{source}: row {row.get('id')}", "id", row.get("id"),
                               f"an id no other row has (data row {duplicate_of} has it; this one is not predicted)")
        if row.get("quality") not in QUALITIES:
            raise CatalogError(f"{source}: row {row.get('id') or ''}", "quality", row.get("quality"),
                               f"one of {list(QUALITIES)}")
        result = predict(row, source)
    except CatalogError as err:
        result = RowResult(id=row.get("id") or "", source=row.get("source") or "", quality=row.get("quality") or "",
                           gpu=row.get("gpu") or "", metric=row.get("metric") or "", measured=None, predicted=None,
                           status="unsupported", reason=str(err).removeprefix(f"{source}: "))
    result.framework = framework_of(row.get("framework"))
    return result


def framework_of(text: str | None) -> str:
    """The serving engine a row's ``framework`` cell names: its first word, lower case
    (``trtllm 1.0.0rc3`` -> ``trtllm``, ``DeepSeek in-house inference engine`` ->
    ``deepseek``); EMPTY or missing: "". A grouping for the report, never an input
    of a prediction."""
    words = (text or "").split()
    return words[0].lower() if words else ""


def run(path: str | Path, on_row: Any = None) -> tuple[str, list[RowResult]]:
    """Every row of ``path`` predicted; ``on_row(done, total)`` hears each row as it is done."""
    df = read(path)
    kind = kind_of(df)
    predict = {"comm": predict_comm, "inference": predict_inference}.get(kind, predict_training)
    results = []
    seen: dict[str, int] = {}  # id -> its first data row (1-based)
    for number, row in enumerate(df.iter_rows(named=True), start=1):
        first = seen.setdefault(row["id"], number) if row.get("id") else number
        results.append(predict_row(predict, row, str(path), first if first != number else None))
        if on_row is not None:
            on_row(len(results), df.height)
    return kind, results


def summary(results: list[RowResult]) -> dict[str, Any]:
    """Mean/median absolute percentage error and worst rows, for ok and uncertain rows, and per
    source and per GPU (ok rows under the name, uncertain ones under "NAME (uncertain)")."""
    def stats(rows: list[RowResult]) -> dict[str, Any]:
        errs = [r.error for r in rows if r.error is not None and r.status == "ok"]
        if not errs:
            return {"n": 0}
        abs_err = np.abs(np.array(errs))
        worst = sorted((r for r in rows if r.error is not None and r.status == "ok"), key=lambda r: -abs(r.error))
        # rows whose run was measured but which no searched configuration fits (a memory
        # miss): left out of the MAPE above, which is of predictions the model stands by;
        # with their fastest configuration's error counted too
        missed = [r.error for r in rows if r.error is not None and r.status == "oom"]
        return {"n": len(errs), "mape": float(abs_err.mean()), "median_ape": float(np.median(abs_err)),
                "mean_signed": float(np.mean(errs)), "worst": [(r.id, round(r.error, 4)) for r in worst[:5]],
                "oom": len(missed), "mape_with_oom": float(np.abs(np.array(errs + missed)).mean())}

    out: dict[str, Any] = {q: stats([r for r in results if r.quality == q]) for q in QUALITIES}
    # per source and per GPU, ok and uncertain rows apart (the targets are on ok rows)
    groups = [("by_source", "source"), ("by_gpu", "gpu"), ("by_metric", "metric")]
    if any(r.framework for r in results):
        groups.append(("by_framework", "framework"))
    for key, attr in groups:
        out[key] = {}
        for name in sorted({getattr(r, attr) for r in results}):
            for q, suffix in (("ok", ""), ("uncertain", " (uncertain)")):
                st = stats([r for r in results if getattr(r, attr) == name and r.quality == q])
                if st["n"]:
                    out[key][name + suffix] = st
    out["status"] = {s: sum(r.status == s for r in results) for s in ("ok", "oom", "no-candidate", "unsupported")}
    out["ranking"] = ranking(results)
    out["memory"] = memory_error(results)
    bounded = [r for r in results if r.ceiling is not None and r.predicted is not None]
    if bounded:
        out["ceiling"] = {"checked": len(bounded), "beyond": [r.id for r in bounded if r.beyond_ceiling],
                          # how close the predictions come: predicted / bound (throughputs) or
                          # bound / predicted (latencies), at most 1 when the bound holds
                          "closest": max(ceiling_ratio(r) for r in bounded)}
    return out


def ceiling_ratio(r: RowResult) -> float:
    """How far along a prediction is toward its memory-bandwidth bound: predicted /
    ceiling for a throughput, floor / predicted for a per-token latency (1: on it)."""
    assert r.ceiling is not None and r.predicted is not None
    return r.ceiling / r.predicted if r.metric in LATENCY_BOUNDED else r.predicted / r.ceiling


def table(results: list[RowResult]) -> str:
    mw = max([len("metric"), *(len(r.metric) for r in results)]) + 2
    iw = max([len("id"), *(len(r.id) for r in results)]) + 2  # the longest id, so no id runs into its quality
    lines = [f"{'id':<{iw}}{'quality':<11}{'metric':<{mw}}{'measured':>12}{'predicted':>13}{'error':>9}  chosen / status"]
    for r in results:
        meas = f"{r.measured:.4g}" if r.measured is not None else "-"
        pred = f"{r.predicted:.4g}" if r.predicted is not None else "-"
        err = f"{100 * r.error:+.1f}%" if r.error is not None and not math.isnan(r.error) else "-"
        extra = (" ".join(f"{k}={v}" for k, v in r.chosen.items()) if r.status == "ok" else
                 f"unsupported: {r.reason}" if r.reason else r.status)
        if r.beyond_ceiling:
            extra = f"BEYOND MEMORY-BANDWIDTH BOUND {r.ceiling:.4g}; " + extra
        lines.append(f"{r.id:<{iw}}{r.quality:<11}{r.metric:<{mw}}{meas:>12}{pred:>13}{err:>9}  {extra}")
    return "\n".join(lines)


__all__ = ["RowResult", "predict_inference", "run", "summary", "table", "training_space"]
