"""Serving spaces: a model on a device budget, a request workload, SLA targets,
and the deployment dimensions to search (issue 15, modeling.md section 8).

A serving space is TOML in ``spaces/catalog/serving/NAME.toml`` (or any path)::

    name = "llama3.1-70b-h100-8-fp8"
    model = "llama3-70b"
    hardware = "h100-sxm5-80gb"
    devices = 8
    [workload]
    input_len = 2048                                   # fixed, or
    output_len = { distribution = "lognormal", mean = 256, sigma = 0.5 }
    concurrency = 64                                   # closed loop, or rate_per_s = 20.0 (Poisson)
    [sla]
    tpot_s = 0.05
    [dimensions]
    tp = [1, 2, 4, 8]
    ...

It is validated like a training space (``CatalogError`` naming file, field,
value and what was expected) and encoded into columns, one row per valid
candidate; each dropped combination is charged to the first ``ServingReason``
it breaks. An aggregated candidate runs ``instances = devices / (tp * pp)``
replicas that prefill and decode; a disaggregated one runs
``prefill_instances`` prefill replicas of ``prefill_tp`` devices (pp 1, TP
attention, the row's ep) and ``instances = (devices - prefill_instances *
prefill_tp) / (tp * pp)`` decode replicas of the row's shape, the KV cache of
each prompt moving from the one to the other; the serving enums below are mirrored as integers in
``kernels.serving`` (pinned by ``tests/test_serving.py``).

Speculative decoding / MTP: ``dimensions.draft_tokens`` (0: off) drafts that
many tokens a decode step, from the model's MTP modules (``mtp_depth``) or,
for a model without them, an EAGLE-style one-layer draft head
(``kernels.serving`` module doc); ``workload.acceptance_rate`` is the
probability that each draft is accepted (DeepSeek-V3 reports 0.85-0.9 for its
MTP module), required when a draft_tokens value is above 0::

    [workload]
    acceptance_rate = 0.85
    [dimensions]
    draft_tokens = [0, 1, 2, 3]

MoE expert parallelism (``kernels.inference`` module doc for the layouts):

- ``redundant_experts``: expert slots beyond the routed experts, holding copies
  of the hot ones, in every replica's EP group (prefill and decode): a rank
  holds (experts + redundant) / ep slots, and a load balancer
  (``spaces.expert_balance``, DeepSeek's EPLB) places the copies so that the
  busiest rank's share of the routed rows falls; how unequal the experts' loads
  are is ``workload.expert_popularity_sigma`` (0: equal). DeepSeek-V3's
  deployment: 32 redundant experts, 288 slots, 2 a GPU at EP144, 9 at EP32.
- ``dispatch``: how tokens reach their experts under attention DP
  (``spaces.enums.Dispatch``, the training dimension's values and kernels,
  ``kernels.moe.dispatch_s``); ``prefill_dispatch`` the same for the prefill
  replicas of a disaggregated row. Without attention DP (or with ep 1) there is
  no all-to-all and only the first value is kept.
- ``tbo``: two-batch overlap, the batch of an iteration run as two halves so
  that one half's dispatch and combine run under the other half's compute
  (SGLang / DeepSeek; ``kernels.inference.forward_s``); needs attention DP and
  ep > 1. It applies to the prefill replicas too where they have both.
- ``prefill_ep`` and ``prefill_attention_dp``: the prefill replicas' own EP
  size and attention layout (DeepSeek prefills at EP32 with DP attention and
  decodes at EP144)::

    [dimensions]
    tp = [144]
    ep = [144]
    attention_dp = [true]
    redundant_experts = [0, 32]
    dispatch = ["low-latency", "hierarchical"]
    tbo = [false, true]
    mode = ["disagg"]
    prefill_tp = [32]
    prefill_ep = [32]
    prefill_attention_dp = [true]
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from paraspace.spaces.catalog import CATALOG_DIR, load_hardware, load_model, read_toml
from paraspace.spaces.encode import Encoded
from paraspace.spaces import enums
from paraspace.spaces.enums import Dispatch, Dtype, label, parse
from paraspace.spaces.errors import MISSING, CatalogError
from paraspace.spaces.schema import (MAX_COUNT, AttentionKernel, DispatchDtype, Fp8Scaling, Hardware, Model, Record,
                                     validate)

#: value types of serving records: lengths, rates and latencies share the catalog's bound on
#: counts (spaces.schema.MAX_COUNT, 2**24: far past any prompt, rate or SLA in seconds)
Positive = Annotated[float, Field(gt=0, le=MAX_COUNT, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, le=MAX_COUNT, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(gt=0, le=MAX_COUNT)]
Text = Annotated[str, Field(min_length=1)]

SERVING_DIR = CATALOG_DIR / "serving"

#: most draft tokens a decode step may verify (speculative decoding); engines draft a handful
#: (vLLM and SGLang examples use 1-7), and the expected gain a^k of one more vanishes beyond
MAX_DRAFT_TOKENS = 16

#: bytes per element of the precisions a serving space may name (weights and KV cache)
DTYPE_BYTES = {name: enums.DTYPE_BYTES[name] for name in ("bf16", "fp16", "fp8", "int8", "fp4")}


class Scheduler(IntEnum):
    """How an engine batches requests."""

    STATIC = 0  #: a batch is admitted only when the previous one has finished (whole prompts, no chunking)
    CONTINUOUS = 1  #: requests join and leave every iteration; prompts chunked under max_tokens
    #: continuous batching, prompts whole: an iteration takes the prompts (in order) that fit
    #: the rest of max_tokens; TensorRT-LLM's default (``enable_chunked_prefill`` false)
    CONTINUOUS_UNCHUNKED = 2


class Mode(IntEnum):
    """Where prompts are prefilled."""

    AGG = 0  #: every replica prefills and decodes (chunked prefill mixed into decode iterations)
    DISAGG = 1  #: prefill replicas and decode replicas apart; the KV cache moves between them


class ServingReason(IntEnum):
    """Why a combination of serving dimension values is not a candidate (precedence order)."""

    VALID = 0
    DEVICE_BUDGET = 1  #: tp * pp does not divide the devices
    TP_HEADS = 2  #: tp does not divide the attention heads (or, without attention DP, the FFN width)
    PP_LAYERS = 3  #: pp exceeds the layers
    EP_DENSE = 4  #: ep > 1 or attention DP on a dense model
    EP_SHAPE = 5  #: ep does not divide tp, or the routed experts, or tp / ep the expert FFN width
    ATTENTION_DP_TP1 = 6  #: attention DP with tp = 1 is the same row without it
    #: continuous batching with max_tokens < max_batch * (draft_tokens + 1): a full batch's decode rows do not fit
    TOKEN_BUDGET = 7
    STATIC_TOKENS = 8  #: static batching has no token budget: only the first max_tokens value is kept
    AGG_PREFILL_GROUP = 9  #: aggregated: the prefill group's dimensions are unused, only their first values kept
    DISAGG_BUDGET = 10  #: disaggregated: the prefill replicas leave no whole decode replica
    #: disaggregated decode replicas batch continuously and prefill replicas chunk: only "continuous" is kept
    DISAGG_STATIC = 11
    #: redundant experts without an EP group to balance (dense model or ep = 1), or more slots than ep copies of each
    REDUNDANT_EXPERTS = 12
    TBO_SHAPE = 13  #: two-batch overlap without attention DP and ep > 1: no all-to-all to hide
    #: a dispatch algorithm other than the first where the replica has no all-to-all (no attention DP, or ep = 1)
    DISPATCH_UNUSED = 14
    #: disaggregated prefill replica: prefill_ep does not divide prefill_tp, the expert slots or (with
    #: prefill_tp / prefill_ep) the expert FFN; EP or attention DP on a dense model; attention DP with prefill_tp = 1
    PREFILL_EP_SHAPE = 15
    #: the overlap scheduler where it changes nothing modelled (static batches, disaggregated): first value kept
    OVERLAP_UNUSED = 16


REASON_TEXT: dict[ServingReason, str] = {
    ServingReason.VALID: "valid candidates",
    ServingReason.DEVICE_BUDGET: "tp*pp does not divide devices",
    ServingReason.TP_HEADS: "tp does not divide heads and ffn (without attention DP)",
    ServingReason.PP_LAYERS: "pp > layers",
    ServingReason.EP_DENSE: "ep>1 or attention_dp on a dense model",
    ServingReason.EP_SHAPE: "ep does not divide tp and the expert slots (experts + redundant), or tp/ep the expert FFN",
    ServingReason.ATTENTION_DP_TP1: "attention_dp with tp=1 (same as without)",
    ServingReason.TOKEN_BUDGET: "continuous (chunked or not): max_tokens < max_batch * (draft_tokens + 1)",
    ServingReason.STATIC_TOKENS: "static: no token budget, only the first max_tokens kept",
    ServingReason.AGG_PREFILL_GROUP: "agg: the prefill_* dimensions are unused, only their first values kept",
    ServingReason.DISAGG_BUDGET: "disagg: devices - prefill_instances*prefill_tp not a multiple of tp*pp (or 0), "
                                 "or prefill_tp does not divide heads (ffn) under TP attention",
    ServingReason.DISAGG_STATIC: "disagg with a scheduler other than continuous (decode replicas batch "
                                 "continuously, prefill replicas chunk)",
    ServingReason.REDUNDANT_EXPERTS: "redundant_experts > 0 with a dense model or ep=1, or slots > experts*ep",
    ServingReason.TBO_SHAPE: "tbo without attention_dp and ep>1 (no all-to-all to overlap)",
    ServingReason.DISPATCH_UNUSED: "dispatch / prefill_dispatch unused (no attention_dp or ep=1): first value kept",
    ServingReason.PREFILL_EP_SHAPE: "disagg: prefill_ep does not divide prefill_tp and the slots (or the expert FFN), "
                                    "or prefill EP / attention DP impossible",
    ServingReason.OVERLAP_UNUSED: "overlap_scheduler with static batches or disagg (not modelled there): first value "
                                  "kept",
}


class Feasible(IntEnum):
    """Whether an evaluated serving candidate meets memory and the SLA, and if not why."""

    OK = 0
    WEIGHTS_OOM = 1  #: the weights and the framework overhead exceed HBM
    #: a request of the workload does not fit an engine's KV cache: its longest (prompt + output), or not one of
    #: the mean length (the analytic tier), or the simulation's head-of-queue request in an empty engine
    KV_TOO_SMALL = 2
    OVERLOADED = 3  #: the Poisson rate exceeds what the engines sustain (the queue grows without bound)
    SLA_TTFT = 4
    SLA_TTFT_P90 = 5
    SLA_TPOT = 6
    SLA_TPOT_P90 = 7
    PROMPT_TOO_LONG = 8  #: continuous-unchunked: the longest prompt exceeds max_tokens (it is never scheduled)
    MEMORY_CAP = 9  #: a study's --max-mem: the peak memory per device exceeds the cap the user set


FEASIBLE_TEXT: dict[Feasible, str] = {
    Feasible.OK: "fits in memory, sustains the load and meets the SLA",
    Feasible.WEIGHTS_OOM: "the weights and the framework overhead do not fit a device's HBM",
    Feasible.KV_TOO_SMALL: "a request does not fit the replica's KV cache",
    Feasible.OVERLOADED: "the request rate exceeds what the engines sustain (the queue grows without bound)",
    Feasible.PROMPT_TOO_LONG: "continuous-unchunked: the longest prompt exceeds max_tokens",
    Feasible.MEMORY_CAP: "the peak memory per device exceeds the study's cap (--max-mem)",
    Feasible.SLA_TTFT: "misses the mean TTFT target (sla.ttft_s)",
    Feasible.SLA_TTFT_P90: "misses the 90th-percentile TTFT target (sla.ttft_p90_s)",
    Feasible.SLA_TPOT: "misses the mean TPOT target (sla.tpot_s)",
    Feasible.SLA_TPOT_P90: "misses the 90th-percentile TPOT target (sla.tpot_p90_s)",
}
#: the SLA targets: (field of Sla, the metric column it bounds, the reason a miss is charged to)
SLA_TARGETS: tuple[tuple[str, str, Feasible], ...] = (
    ("ttft_s", "ttft_s", Feasible.SLA_TTFT), ("ttft_p90_s", "ttft_p90_s", Feasible.SLA_TTFT_P90),
    ("tpot_s", "tpot_s", Feasible.SLA_TPOT), ("tpot_p90_s", "tpot_p90_s", Feasible.SLA_TPOT_P90),
)


def _label(member: IntEnum) -> str:
    return member.name.lower().replace("_", "-")


def enum_labels(enum: type[IntEnum]) -> list[str]:
    """Parquet / TOML spellings of a serving enum, in value order."""
    return [_label(m) for m in sorted(enum)]


# --------------------------------------------------------------------------- records


#: a request length in tokens: at least one (a request is whole tokens), at most the catalog's count bound
Tokens = Annotated[float, Field(ge=1, le=MAX_COUNT, allow_inf_nan=False)]


class Lengths(Record):
    """Request lengths in tokens: every request ``mean`` (fixed), lognormal with
    that mean and log-standard deviation ``sigma`` (rounded, at least 1), or
    ``empirical``: drawn with replacement from ``column`` of the CSV file
    ``path`` (relative to the space's TOML; ``column`` may be left out when
    the file has one column), whose mean ``load_serving`` fills in::

        input_len = { distribution = "empirical", path = "prompts.csv", column = "input_tokens" }
    """

    distribution: Literal["fixed", "lognormal", "empirical"] = "fixed"
    #: fixed and lognormal: required; empirical: the column's mean, filled in on load
    mean: Tokens | None = None
    #: at most 5: a log-standard deviation of 5 already spans e^-10 .. e^10 around the mean at 2 sigma
    sigma: Annotated[float, Field(ge=0, le=5, allow_inf_nan=False)] = 0.0
    #: empirical: the CSV file of lengths and the column to read
    path: Text | None = None
    column: Text | None = None

    @model_validator(mode="after")
    def _shape(self) -> Lengths:
        empirical = self.distribution == "empirical"
        if self.distribution == "fixed" and self.sigma != 0.0:
            raise ValueError("sigma: 0 for a fixed length (or distribution = \"lognormal\")")
        if not empirical and self.mean is None:
            raise ValueError(f"mean: a length in tokens >= 1 (required for a {self.distribution} length)")
        if self.distribution == "fixed" and self.mean is not None and not self.mean.is_integer():
            raise ValueError("mean: a whole number of tokens for a fixed length (every request is that long; "
                             "a lognormal length may have a fractional mean)")
        if not empirical and (self.path is not None or self.column is not None):
            key = "path" if self.path is not None else "column"
            raise ValueError(f"{key}: no {key} for a {self.distribution} length (or distribution = \"empirical\")")
        if empirical and self.path is None:
            raise ValueError("path: a CSV file of request lengths (required for an empirical length)")
        if empirical and self.mean is not None:
            raise ValueError("mean: no mean for an empirical length (it is the CSV column's mean)")
        if empirical and self.sigma != 0.0:
            raise ValueError("sigma: no sigma for an empirical length (the CSV's lengths are drawn as they are)")
        return self


class Workload(Record):
    """The requests: their lengths and how they arrive."""

    input_len: Lengths
    output_len: Lengths
    #: closed loop: this many users, each sending its next request when the last one finishes
    concurrency: PositiveInt | None = None
    #: open loop: Poisson arrivals at this many requests per second (the whole deployment)
    rate_per_s: Positive | None = None
    #: share of each prompt found in the prefix cache (not recomputed at prefill)
    prefix_hit_rate: Annotated[float, Field(ge=0, lt=1)] = 0.0
    #: speculative decoding: probability that each draft token is accepted (required with drafts)
    acceptance_rate: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    #: MoE: log-standard deviation of the routed experts' shares of the tokens (``spaces.expert_balance``;
    #: 0: every expert equally loaded); at most 3, where the hottest of 256 experts already takes ~5,000x
    #: the coldest's share
    expert_popularity_sigma: Annotated[float, Field(ge=0, le=3, allow_inf_nan=False)] = 0.0
    #: requests each simulated engine serves (a disaggregated deployment, simulated whole: each decode engine);
    #: a closed loop reaches its steady state only with several requests per user
    n_requests: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    seed: Annotated[int, Field(ge=0)] = 0
    #: closed loop: the simulation's statistics leave out the start-up burst (every user's first
    #: request, sent at once at t = 0) and the drain after the last request is sent, so that they
    #: describe the loop's steady state whatever n_requests (``kernels.serving_sim`` module doc);
    #: false: over every request, as a benchmark of n_requests started cold reports them
    steady_state: bool = True

    @model_validator(mode="before")
    @classmethod
    def _fixed_lengths(cls, data: Any) -> Any:
        """``input_len = 1024`` is the short spelling of a fixed length."""
        if isinstance(data, dict):
            data = dict(data)
            for key in ("input_len", "output_len"):
                if isinstance(data.get(key), int | float) and not isinstance(data.get(key), bool):
                    data[key] = {"distribution": "fixed", "mean": float(data[key])}
                elif isinstance(data.get(key), dict) and isinstance(data[key].get("mean"), int):
                    data[key] = {**data[key], "mean": float(data[key]["mean"])}
        return data

    @model_validator(mode="after")
    def _one_arrival_process(self) -> Workload:
        if (self.concurrency is None) == (self.rate_per_s is None):
            raise ValueError("concurrency: exactly one of concurrency (closed loop) and rate_per_s (Poisson)")
        return self


class Sla(Record):
    """Latency targets; an omitted one is not checked."""

    ttft_s: Positive | None = None
    ttft_p90_s: Positive | None = None
    tpot_s: Positive | None = None
    tpot_p90_s: Positive | None = None

    @model_validator(mode="after")
    def _p90_not_below_mean(self) -> Sla:
        """A 90th-percentile target tighter than the mean target of the same latency is
        taken for swapped values: a latency whose p90 is below its mean needs more than a
        tenth of the requests far out in the tail, not what an SLA is written for."""
        for metric in ("ttft", "tpot"):
            mean, p90 = getattr(self, f"{metric}_s"), getattr(self, f"{metric}_p90_s")
            if mean is not None and p90 is not None and p90 < mean:
                raise ValueError(f"{metric}_p90_s: a 90th-percentile target at least the mean target "
                                 f"sla.{metric}_s = {mean:g} (the two swapped?)")
        return self


class ServingDimensions(Record):
    """The values each serving dimension may take."""

    tp: tuple[PositiveInt, ...] = (1,)
    pp: tuple[PositiveInt, ...] = (1,)
    #: expert-parallel ranks among the tp ranks (MoE models)
    ep: tuple[PositiveInt, ...] = (1,)
    #: attention data parallelism: attention replicated per rank with its own requests (MoE models)
    attention_dp: tuple[bool, ...] = (False,)
    #: GEMM weight precision (a Dtype label the hardware has a peak for)
    dtype: tuple[Text, ...] = ("bf16",)
    kv_dtype: tuple[Text, ...] = ("bf16",)
    #: speculative decoding: tokens drafted per decode step (0: off), MTP modules or a one-layer draft head
    draft_tokens: tuple[Annotated[int, Field(ge=0, le=MAX_DRAFT_TOKENS)], ...] = (0,)
    #: most requests an engine runs at once
    max_batch: tuple[PositiveInt, ...] = (256,)
    #: tokens per iteration (decode tokens plus prefill chunks): the chunked-prefill budget
    max_tokens: tuple[PositiveInt, ...] = (8192,)
    scheduler: tuple[Literal["static", "continuous", "continuous-unchunked"], ...] = ("continuous",)
    #: the overlap scheduler: the next iteration is scheduled while this one runs, so a busy
    #: engine admits an arrival one iteration later (TensorRT-LLM's PyTorch executor by default,
    #: SGLang's zero-overhead scheduler); aggregated continuous batching only
    overlap_scheduler: tuple[bool, ...] = (False,)
    #: aggregated replicas, or prefill and decode replicas apart
    mode: tuple[Literal["agg", "disagg"], ...] = ("agg",)
    #: disaggregated: tensor-parallel size of a prefill replica
    prefill_tp: tuple[PositiveInt, ...] = (8,)
    #: disaggregated: prefill replicas (the decode replicas take the devices left)
    prefill_instances: tuple[PositiveInt, ...] = (1,)
    #: MoE: expert slots beyond the routed experts (copies of hot experts) in every EP group
    redundant_experts: tuple[Annotated[int, Field(ge=0, le=MAX_COUNT)], ...] = (0,)
    #: MoE under attention DP: the dispatch algorithm (spaces.enums.Dispatch labels)
    dispatch: tuple[Text, ...] = ("alltoall",)
    #: MoE under attention DP: two-batch overlap of one half's all-to-all with the other half's compute
    tbo: tuple[bool, ...] = (False,)
    #: disaggregated: expert-parallel ranks among a prefill replica's prefill_tp ranks
    prefill_ep: tuple[PositiveInt, ...] = (1,)
    #: disaggregated: attention data parallelism in the prefill replicas
    prefill_attention_dp: tuple[bool, ...] = (False,)
    #: disaggregated: the prefill replicas' dispatch algorithm
    prefill_dispatch: tuple[Text, ...] = ("alltoall",)


class ServingSpec(Record):
    """A serving space as written in TOML."""

    name: Text
    description: Text
    model: Text
    hardware: Text
    devices: PositiveInt
    workload: Workload
    sla: Sla = Sla()
    #: share of the HBM left beside weights and overhead that the KV cache takes
    kv_fraction: Annotated[float, Field(gt=0, le=1)] = 0.9
    #: host and scheduler time per engine iteration
    host_overhead_us: NonNegative = 0.0
    #: candidates the iteration-level simulation refines: the ranking's best, re-ranked by
    #: the simulated values until the best this many are simulated (``explorer.serve.evaluate``)
    simulate_top: Annotated[int, Field(ge=0)] = 32
    #: the fused attention kernel of prefill and decode (``schema.AttentionKernel``): its
    #: achieved FLOP/s where attention is compute-bound (MLA decode, long prefills); an MLA
    #: model runs the FlashAttention-3 class whichever is named (``Model.attention_kernel``)
    attention_kernel: AttentionKernel = "flash2"
    #: how the FP8 GEMMs of an "fp8" dtype candidate are scaled (``schema.Fp8Scaling``): the
    #: recipe the checkpoint was quantized with (block-quantized checkpoints load "block")
    fp8_scaling: Fp8Scaling = "tensor"
    #: the precision of an MoE dispatch under attention DP (``kernels.params.DISPATCH_BYTES``):
    #: "bf16", or "fp8" (a byte an element plus a scale per 128: DeepEP's FP8 dispatch, as
    #: DeepSeek's V3/R1 deployment sends it); combines stay 16-bit
    dispatch_dtype: DispatchDtype = "bf16"
    dimensions: ServingDimensions = ServingDimensions()


@dataclass(frozen=True)
class LoadedServing:
    spec: ServingSpec
    model: Model
    hardware: Hardware
    source: str
    raw: dict[str, Any]
    #: the lengths of each empirical workload length ("input_len", "output_len") read from its CSV
    empirical: dict[str, np.ndarray] = field(default_factory=dict)


def names() -> list[str]:
    return sorted(p.stem for p in SERVING_DIR.glob("*.toml"))


def load_serving(ref: str) -> LoadedServing:
    """A serving space by catalog name (``spaces/catalog/serving``) or TOML path."""
    path = Path(ref)
    if not (ref.endswith(".toml") or path.exists()):
        path = SERVING_DIR / f"{ref}.toml"
        if not path.is_file():
            raise CatalogError("command line", "space", ref, f"a serving TOML path or one of {names()}")
    elif not path.is_file():
        raise CatalogError("command line", "space", ref, "an existing TOML file")
    return serving_from_raw(read_toml(path), str(path), path.parent)


def serving_from_raw(raw: dict[str, Any], source: str, base_dir: Path) -> LoadedServing:
    spec = validate(ServingSpec, raw, source)
    is_name = lambda ref: not ref.endswith(".toml") and "/" not in ref  # noqa: E731
    model = load_model(spec.model, relative_to=None if is_name(spec.model) else base_dir, source=source)
    hw = load_hardware(spec.hardware, relative_to=None if is_name(spec.hardware) else base_dir, source=source)
    empirical: dict[str, np.ndarray] = {}
    workload = spec.workload
    for key in ("input_len", "output_len"):
        lengths: Lengths = getattr(workload, key)
        if lengths.distribution == "empirical":
            empirical[key] = read_lengths_csv(lengths, base_dir, source, f"workload.{key}")
            filled = lengths.model_copy(update={"mean": float(empirical[key].mean())})
            workload = workload.model_copy(update={key: filled})
    spec = spec.model_copy(update={"workload": workload})
    loaded = LoadedServing(spec=spec, model=model, hardware=hw, source=source, raw=raw, empirical=empirical)
    check_serving(loaded)
    return loaded


def read_lengths_csv(lengths: Lengths, base_dir: Path, source: str, where: str) -> np.ndarray:
    """The request lengths of an empirical ``Lengths``: the numbers of its CSV
    column (a header row, then one length a row, each in [1, MAX_COUNT] tokens);
    a ``CatalogError`` naming the space file, the field and the value otherwise."""
    assert lengths.path is not None  # Lengths requires it for an empirical distribution
    path = Path(lengths.path)
    path = path if path.is_absolute() else base_dir / path
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:  # a BOM (spreadsheet exports) is not text
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        why = getattr(err, "strerror", None) or ("not UTF-8 text" if isinstance(err, UnicodeDecodeError) else str(err))
        raise CatalogError(source, f"{where}.path", lengths.path,
                           f"a readable CSV file of request lengths, relative to the space's folder ({path}: {why})"
                           ) from None
    header = [name.strip() for name in rows[0]] if rows else []
    if lengths.column is None:
        if len(header) != 1:
            raise CatalogError(source, f"{where}.column", MISSING,
                               f"the column of {lengths.path} to read, one of {header}")
        column = header[0]
    else:
        column = lengths.column
    if column not in header:
        raise CatalogError(source, f"{where}.column", column, f"a column of {lengths.path}: one of {header}")
    index = header.index(column)
    values: list[float] = []
    for line, row in enumerate(rows[1:], start=2):
        if not row:  # a blank line
            continue
        cell = row[index].strip() if index < len(row) else ""
        try:
            value = float(cell)
        except ValueError:
            value = math.nan
        if not 1.0 <= value <= MAX_COUNT:  # nan fails too
            raise CatalogError(source, f"{where}.column", column,
                               f"request lengths in tokens, each in [1, {MAX_COUNT}] "
                               f"({lengths.path} line {line} holds {cell!r})")
        values.append(value)
    if not values:
        raise CatalogError(source, f"{where}.path", lengths.path,
                           f"a CSV file with at least one length under its header ({column!r} has none)")
    return np.rint(np.asarray(values))


def check_serving(space: LoadedServing) -> None:
    """Checks beyond the schema: precisions known and on the hardware, distinct
    values, an acceptance rate where tokens are drafted."""
    peaks = space.hardware.device.peak_TFLOP_per_s
    dims = space.spec.dimensions
    if max(dims.draft_tokens, default=0) > 0 and space.spec.workload.acceptance_rate is None:
        raise CatalogError(space.source, "workload.acceptance_rate", MISSING,
                           f"a probability in [0, 1] (dimensions.draft_tokens = {list(dims.draft_tokens)})")
    for name in ("dtype", "kv_dtype"):
        for value in getattr(dims, name):
            if value not in DTYPE_BYTES:
                raise CatalogError(space.source, f"dimensions.{name}", value, f"one of {sorted(DTYPE_BYTES)}")
    for name in ("dispatch", "prefill_dispatch"):
        for value in getattr(dims, name):
            try:
                parse(Dispatch, value)
            except ValueError:
                raise CatalogError(space.source, f"dimensions.{name}", value,
                                   f"one of {[label(m) for m in Dispatch]}") from None
    # the GEMMs run in dtype, and the KV cache is stored (and read by attention) in kv_dtype:
    # both a precision the hardware has (an FP4 cache needs FP4 hardware, e.g. Blackwell)
    supported = [d for d in sorted(peaks) if d in DTYPE_BYTES]
    for name, what in (("dtype", "a precision"), ("kv_dtype", "a KV cache precision")):
        for value in getattr(dims, name):
            if value not in peaks:
                raise CatalogError(space.source, f"dimensions.{name}", value,
                                   f"{what} {space.hardware.name} has a peak for: {supported}")
    for dim in DIMENSIONS:
        raw = getattr(dims, dim)
        if len(raw) == 0:
            raise CatalogError(space.source, f"dimensions.{dim}", list(raw), "at least one value")
        if len(set(raw)) != len(raw):
            raise CatalogError(space.source, f"dimensions.{dim}", list(raw), "distinct values")


# --------------------------------------------------------------------------- encoding

#: the product's dimensions, slowest first (the Parquet strategy columns, with instances)
DIMENSIONS = ("mode", "tp", "pp", "ep", "attention_dp", "redundant_experts", "dispatch", "tbo", "dtype", "kv_dtype",
              "draft_tokens", "max_batch", "max_tokens", "scheduler", "overlap_scheduler", "prefill_tp",
              "prefill_instances", "prefill_ep", "prefill_attention_dp", "prefill_dispatch")
#: enum-valued dimensions: Parquet dictionary columns with these labels
DIMENSION_ENUMS: dict[str, list[str]] = {"scheduler": enum_labels(Scheduler), "mode": enum_labels(Mode),
                                         "dispatch": [label(m) for m in sorted(Dispatch)],
                                         "prefill_dispatch": [label(m) for m in sorted(Dispatch)]}
#: boolean dimensions (int8 0/1 in the columns)
BOOL_DIMENSIONS = ("attention_dp", "tbo", "overlap_scheduler", "prefill_attention_dp")


def dimension_values(space: LoadedServing) -> dict[str, np.ndarray]:
    dims = space.spec.dimensions
    out: dict[str, np.ndarray] = {}
    for name in DIMENSIONS:
        raw = getattr(dims, name)
        if name in ("dtype", "kv_dtype"):
            out[name] = np.asarray([int(parse(Dtype, v)) for v in raw], np.int8)
        elif name in ("scheduler", "mode"):
            enum = Scheduler if name == "scheduler" else Mode
            out[name] = np.asarray([int(next(m for m in enum if _label(m) == v)) for v in raw], np.int8)
        elif name in ("dispatch", "prefill_dispatch"):
            out[name] = np.asarray([int(parse(Dispatch, v)) for v in raw], np.int8)
        elif name in BOOL_DIMENSIONS:
            out[name] = np.asarray(raw, np.int8)
        else:
            out[name] = np.asarray(raw, np.int32)
    return out


def encode(space: LoadedServing, ids: np.ndarray | None = None) -> Encoded:
    """Every combination of the dimensions (C order, the last fastest), or the
    combinations ``ids`` (flat positions, in their order: ``paraspace study``),
    filtered by vectorised rules; kept rows carry ``row_id`` and the derived
    ``instances``; the reason counts are over the combinations encoded."""
    values = dimension_values(space)
    shape = tuple(len(values[n]) for n in DIMENSIONS)
    n = int(np.prod(shape, dtype=np.int64))
    flat = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, np.int64)
    index = np.unravel_index(flat, shape)
    cols = {name: values[name][i] for name, i in zip(DIMENSIONS, index)}
    reason, breaks = _reasons(space, cols, values)
    keep = reason == ServingReason.VALID
    out = {k: np.ascontiguousarray(v[keep]) for k, v in cols.items()}
    out["row_id"] = flat[keep]
    decode_devices = space.spec.devices - np.where(out["mode"] == Mode.DISAGG,
                                                   out["prefill_instances"] * out["prefill_tp"], 0)
    out["instances"] = (decode_devices // (out["tp"] * out["pp"])).astype(np.int32)
    return Encoded(out, n, np.bincount(reason, minlength=len(ServingReason)).astype(np.int64), breaks)


def _reasons(space: LoadedServing, c: dict[str, np.ndarray],
             values: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    model = space.model
    moe = model.moe
    dense = np.full(c["tp"].shape, moe is None)
    tp, pp, ep = (c[k].astype(np.int64) for k in ("tp", "pp", "ep"))
    adp = c["attention_dp"] != 0
    experts = moe.experts if moe is not None else 1
    expert_ffn = moe.expert_ffn if moe is not None else 1
    slots = experts + c["redundant_experts"].astype(np.int64)
    redundant = c["redundant_experts"] > 0
    continuous = c["scheduler"] == Scheduler.CONTINUOUS
    static = c["scheduler"] == Scheduler.STATIC
    disagg = c["mode"] == Mode.DISAGG
    ptp = c["prefill_tp"].astype(np.int64)
    pep = c["prefill_ep"].astype(np.int64)
    padp = c["prefill_attention_dp"] != 0
    left = space.spec.devices - c["prefill_instances"].astype(np.int64) * ptp  # devices for decode replicas
    safe_ep = np.maximum(ep, 1)
    all_to_all = adp & (ep > 1)  # the decode (or aggregated) replica dispatches tokens
    prefill_all_to_all = disagg & padp & (pep > 1)
    prefill_group = ((c["prefill_tp"] != values["prefill_tp"][0])
                     | (c["prefill_instances"] != values["prefill_instances"][0])
                     | (c["prefill_ep"] != values["prefill_ep"][0])
                     | (c["prefill_attention_dp"] != values["prefill_attention_dp"][0])
                     | (c["prefill_dispatch"] != values["prefill_dispatch"][0]))
    rules: dict[ServingReason, np.ndarray] = {
        ServingReason.DEVICE_BUDGET: ~disagg & (space.spec.devices % (tp * pp) != 0),
        # under attention DP every rank runs all heads and the dense MLPs whole
        ServingReason.TP_HEADS: ~adp & ((model.heads % tp != 0) | (model.ffn % tp != 0)),
        ServingReason.PP_LAYERS: pp > model.layers,
        ServingReason.EP_DENSE: dense & ((ep > 1) | adp),
        ServingReason.EP_SHAPE: (tp % safe_ep != 0) | (slots % safe_ep != 0)
        | (~dense & (expert_ffn % np.maximum(tp // safe_ep, 1) != 0)),
        ServingReason.ATTENTION_DP_TP1: adp & (tp == 1),
        ServingReason.TOKEN_BUDGET: ~static & (c["max_tokens"].astype(np.int64)
                                                  < c["max_batch"].astype(np.int64) * (c["draft_tokens"] + 1)),
        ServingReason.STATIC_TOKENS: static & (c["max_tokens"] != values["max_tokens"][0]),
        ServingReason.AGG_PREFILL_GROUP: ~disagg & prefill_group,
        ServingReason.DISAGG_BUDGET: disagg & ((left < tp * pp) | (left % (tp * pp) != 0)
                                               | (~padp & ((model.heads % ptp != 0)
                                                           | (dense & (model.ffn % ptp != 0))))),
        ServingReason.DISAGG_STATIC: disagg & ~continuous,
        ServingReason.REDUNDANT_EXPERTS: redundant & (dense | (ep == 1) | (slots > experts * safe_ep)),
        ServingReason.TBO_SHAPE: (c["tbo"] != 0) & ~all_to_all,
        ServingReason.DISPATCH_UNUSED: (~all_to_all & (c["dispatch"] != values["dispatch"][0]))
        | (~prefill_all_to_all & (c["prefill_dispatch"] != values["prefill_dispatch"][0])),
        ServingReason.PREFILL_EP_SHAPE: disagg & ((ptp % pep != 0) | (dense & ((pep > 1) | padp)) | (padp & (ptp == 1))
                                                  | ((pep > 1) & ((slots % pep != 0) | (slots > experts * pep)))
                                                  | (~dense & (expert_ffn % np.maximum(ptp // pep, 1) != 0))),
        ServingReason.OVERLAP_UNUSED: (static | disagg) & (c["overlap_scheduler"] != values["overlap_scheduler"][0]),
    }
    reason = np.zeros(tp.shape[0], np.int64)
    breaks = np.zeros(len(ServingReason), np.int64)
    for code, broken in rules.items():
        reason[(reason == 0) & broken] = int(code)
        breaks[int(code)] = int(broken.sum())
    return reason, breaks


def dtype_bytes_table() -> np.ndarray:
    """Bytes per element indexed by Dtype code (0 where a precision cannot be stored)."""
    out = np.zeros(len(Dtype))
    for name, nbytes in DTYPE_BYTES.items():
        out[int(parse(Dtype, name))] = nbytes
    return out


__all__ = [
    "DIMENSIONS", "DTYPE_BYTES", "FEASIBLE_TEXT", "MAX_DRAFT_TOKENS", "SLA_TARGETS", "Feasible", "LoadedServing",
    "Mode", "REASON_TEXT", "Scheduler", "ServingReason", "ServingSpec", "dimension_values", "dtype_bytes_table",
    "encode", "enum_labels", "load_serving", "names", "read_lengths_csv", "serving_from_raw",
]
