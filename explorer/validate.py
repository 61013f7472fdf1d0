"""``paraspace validate``: predict published measurements and report the error.

Reads a file in the schema of ``shared/validation/README.md``. Training rows
(``training.csv``, dense and MoE) and communication rows (``comm.csv``: DeepEP
dispatch/combine) are predicted; inference rows are counted as not supported
until the inference kernels land. For each training row the model comes from
the row's own columns (not the catalog), the hardware from the catalog entry
named by ``gpu``, the strategy from the row; a field the source left EMPTY is
searched over its valid values and the fastest feasible candidate is the
prediction (the published runs were tuned), as the reported ``chosen`` values
show. A comm row drives ``kernels.moe``'s dispatch with DeepEP's algorithm for
its mode. No per-row, per-model or per-source correction exists anywhere in
this path. ``measured`` and ``predicted`` are in the unit of the row's metric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from explorer.evaluate import evaluate, pack, pack_hardware
from kernels.codes import DISPATCH_HIERARCHICAL, DISPATCH_LOW_LATENCY
from kernels.moe import dispatch_s
from spaces.catalog import LoadedSpace, load_hardware, names
from spaces.encode import Encoder
from spaces.enums import Dispatch, Recompute, Schedule, label, labels
from spaces.errors import CatalogError
from spaces.schema import Model, SpaceSpec, validate

TRAINING_REQUIRED = ("id", "source", "quality", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "glu",
                     "gpu", "n_gpus", "tp", "pp", "dp", "cp", "global_batch", "dtype", "metric", "value", "step_time_s")
#: values searched where a source left a field EMPTY
UNKNOWN_SEARCH: dict[str, list[Any]] = {
    "micro_batch": [1, 2, 4, 8],
    "recompute": labels(Recompute),
    "sequence_parallel": [False, True],
    "zero": [0, 1, 2, 3],
    # not a column of the schema, so always unknown: Megatron-Core and NeMo benchmark
    # configurations turn it on with sequence parallelism
    "tp_overlap": [False, True],
    "ep": [1, 2, 4, 8, 16, 32, 64],
    "dispatch": ["alltoall", "allgather"],
}
#: sources that predate FlashAttention (2022): their attention materialised s x s scores
PRE_FLASH_SOURCES = frozenset({"narayanan2021", "megatron-lm-readme-gpt3-example"})


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

    @property
    def error(self) -> float | None:
        if self.measured is None or self.predicted is None:
            return None
        return (self.predicted - self.measured) / self.measured


def _num(row: dict[str, str | None], key: str, source: str, kind: type = int) -> Any:
    text = row.get(key)
    if text is None or text == "":
        return None
    try:
        value = kind(float(text)) if kind is int and float(text).is_integer() else kind(text)
    except ValueError:
        raise CatalogError(source, f"row {row.get('id')}: {key}", text, f"a {kind.__name__} number") from None
    return value


def read(path: str | Path) -> pl.DataFrame:
    """The CSV with every field as text (EMPTY -> null); checks the training header."""
    path = Path(path)
    if not path.is_file():
        raise CatalogError("command line", "FILE", str(path), "an existing validation CSV")
    df = pl.read_csv(path, infer_schema_length=0)
    if kind_of(df) == "training":
        missing = [c for c in TRAINING_REQUIRED if c not in df.columns]
        if missing:
            raise CatalogError(path, "header", missing[0], f"the training.csv columns {list(TRAINING_REQUIRED)}")
    return df


def kind_of(df: pl.DataFrame) -> str:
    """comm (has tokens_per_rank), inference (has input_len), else training."""
    if "tokens_per_rank" in df.columns:
        return "comm"
    if "input_len" in df.columns:
        return "inference"
    return "training"


def training_space(row: dict[str, str | None], source: str) -> tuple[LoadedSpace, dict[str, Any]]:
    """The row as a space: known fields fixed, EMPTY fields searched. Returns it and the search lists."""
    rid = row["id"]
    where = f"{source}: row {rid}"
    gpu = row.get("gpu") or ""
    if gpu not in names("hardware"):
        raise CatalogError(where, "gpu", gpu, f"one of {names('hardware')}")
    ints = {k: _num(row, k, source) for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "glu",
                                             "n_gpus", "tp", "pp", "dp", "cp", "global_batch")}
    for key, value in ints.items():
        if value is None:
            raise CatalogError(where, key, None, "a value (EMPTY is not allowed here)")
    if ints["tp"] * ints["pp"] * ints["dp"] * ints["cp"] != ints["n_gpus"]:
        raise CatalogError(where, "dp", ints["dp"], f"tp*pp*dp*cp == n_gpus = {ints['n_gpus']}")
    glu = ints["glu"] == 1
    # GPT-style (GeLU) Megatron models carry biases, dropout and tied embeddings; gated ones none of them
    raw_model: dict[str, Any] = {
        "name": rid, "description": row.get("model") or rid, "layers": ints["layers"], "hidden": ints["hidden"],
        "heads": ints["heads"], "kv_heads": ints["kv_heads"], "ffn": ints["ffn"], "vocab": ints["vocab"], "glu": glu,
        "bias": not glu, "tied_embeddings": not glu, "dropout": not glu,
    }
    searched: dict[str, Any] = {}
    dims: dict[str, Any] = {"tp": [ints["tp"]], "pp": [ints["pp"]], "dp": [ints["dp"]], "cp": [ints["cp"]]}
    if row.get("n_experts"):
        moe = {k: _num(row, col, source) for k, col in (("experts", "n_experts"), ("top_k", "topk"),
                                                        ("expert_ffn", "expert_ffn"),
                                                        ("shared_experts", "n_shared_experts"),
                                                        ("dense_layers", "first_dense_layers"))}
        raw_model["moe"] = {k: v for k, v in moe.items() if v is not None}
        if _num(row, "mla", source) == 1:
            raise CatalogError(where, "mla", 1, "0: MLA rows need per-head dims the schema does not carry")
        ep = _num(row, "ep", source)
        dims["ep"] = [ep] if ep is not None else UNKNOWN_SEARCH["ep"]
        if ep is None:
            searched["ep"] = dims["ep"]
        # Megatron-Core's MoE token dispatchers: all-to-all(v) or all-gather
        dims["dispatch"] = searched["dispatch"] = UNKNOWN_SEARCH["dispatch"]
    model = validate(Model, raw_model, where)
    for key in ("micro_batch", "zero"):
        value = _num(row, key, source)
        dims[key] = [value] if value is not None else UNKNOWN_SEARCH[key]
        if value is None:
            searched[key] = dims[key]
    sp = _num(row, "sequence_parallel", source)
    dims["sequence_parallel"] = [bool(sp)] if sp is not None else UNKNOWN_SEARCH["sequence_parallel"]
    if sp is None:
        searched["sequence_parallel"] = dims["sequence_parallel"]
    if any(dims["sequence_parallel"]) and ints["tp"] > 1:
        dims["tp_overlap"] = searched["tp_overlap"] = UNKNOWN_SEARCH["tp_overlap"]
    recompute = row.get("recompute")
    if recompute:
        if recompute not in labels(Recompute):
            raise CatalogError(where, "recompute", recompute, f"one of {labels(Recompute)} or EMPTY")
        dims["recompute"] = [recompute]
    else:
        dims["recompute"] = searched["recompute"] = UNKNOWN_SEARCH["recompute"]
    vpp = _num(row, "vpp", source)
    if vpp is None:  # interleaving degree not stated: every degree that divides the layers
        vpps = [v for v in range(1, 17) if ints["layers"] % (ints["pp"] * v) == 0] if ints["pp"] > 1 else [1]
        dims["vpp"] = searched["vpp"] = vpps
    else:
        dims["vpp"] = [vpp]
    dims["schedule"] = [label(Schedule.ONE_F_ONE_B)] + ([label(Schedule.INTERLEAVED)] if max(dims["vpp"]) > 1 else [])
    spec = validate(SpaceSpec, {
        "name": rid, "description": f"{source} row {rid}", "model": rid, "hardware": gpu,
        "devices": ints["n_gpus"], "global_batch": ints["global_batch"], "seq_len": ints["seq"],
        "dtype": row.get("dtype") or "bf16", "flash_attention": row["source"] not in PRE_FLASH_SOURCES,
        # a published pipeline whose stages cannot hold equal layer counts ran uneven ones
        "uneven_layers": ints["layers"] % ints["pp"] != 0,
        "dimensions": dims,
    }, where)
    return LoadedSpace(spec=spec, model=model, hardware=load_hardware(gpu), source=where, raw={}), searched


def predict_training(row: dict[str, str | None], source: str) -> RowResult:
    base = RowResult(id=row["id"] or "", source=row.get("source") or "", quality=row.get("quality") or "",
                     gpu=row.get("gpu") or "", metric="step_time_s", measured=_num(row, "step_time_s", source, float),
                     predicted=None, status="unsupported")
    space, searched = training_space(row, source)
    enc = Encoder(space).encode_all()
    if enc.n_rows == 0:
        base.status = "no-candidate"
        return base
    out = evaluate(pack(space), enc.columns)
    feasible = out["feasible"] > 0
    pool = np.flatnonzero(feasible) if feasible.any() else np.arange(enc.n_rows)
    best = pool[np.argmin(out["step_time_s"][pool])]
    base.predicted = float(out["step_time_s"][best])
    base.status = "ok" if feasible.any() else "oom"
    for key in searched:
        value = enc.columns[key][best]
        base.chosen[key] = (labels(Recompute)[int(value)] if key == "recompute" else
                            labels(Dispatch)[int(value)] if key == "dispatch" else
                            bool(value) if key in ("sequence_parallel", "tp_overlap") else int(value))
    if "vpp" in searched:
        base.chosen["schedule"] = labels(Schedule)[int(enc.columns["schedule"][best])]
    return base


#: bytes per element of a DeepEP payload precision
PAYLOAD_BYTES = {"fp8": 1.0, "bf16": 2.0, "fp16": 2.0}
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
                     gpu=row.get("gpu") or "", metric=metric, measured=_num(row, "value", source, float),
                     predicted=None, status="unsupported")
    gpu = row.get("gpu") or COMM_DEFAULT_GPU
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
    if dtype not in PAYLOAD_BYTES:
        raise CatalogError(where, f"{op}_dtype", dtype, f"one of {sorted(PAYLOAD_BYTES)}")
    experts = _num(row, "n_experts", source) or COMM_DEFAULT_EXPERTS
    hw = load_hardware(gpu)
    if hw.links[0].domain_devices != ints["gpus_per_node"]:
        raise CatalogError(where, "gpus_per_node", ints["gpus_per_node"],
                           f"{hw.links[0].domain_devices}, the node size of {gpu}")
    _, tiers, _ = pack_hardware(hw, "bf16")
    token_bytes = ints["tokens_per_rank"] * ints["hidden"] * PAYLOAD_BYTES[dtype]
    algorithm = DISPATCH_HIERARCHICAL if mode == "normal" else DISPATCH_LOW_LATENCY
    max_nodes = NORMAL_MAX_NODES if mode == "normal" else 0
    seconds, intra, inter = dispatch_s(algorithm, token_bytes, float(ints["ep"]), 1.0, float(experts),
                                       float(ints["topk"]), float(max_nodes), tiers)
    if metric == "latency_us":
        base.predicted = seconds * 1e6
    else:
        bottleneck = inter if ints["n_nodes"] > 1 or mode == "low_latency" else intra
        base.predicted = bottleneck / seconds / 1e9
    base.status = "ok"
    base.chosen = {"gpu": gpu, "experts": experts, "algorithm": label(Dispatch(algorithm))}
    return base


def run(path: str | Path) -> tuple[str, list[RowResult]]:
    df = read(path)
    kind = kind_of(df)
    if kind == "inference":
        rows = [RowResult(id=r["id"], source=r["source"], quality=r["quality"], gpu=r.get("gpu") or "",
                          metric=r["metric"], measured=None, predicted=None, status="unsupported")
                for r in df.iter_rows(named=True)]
        return kind, rows
    predict = predict_comm if kind == "comm" else predict_training
    return kind, [predict(r, str(path)) for r in df.iter_rows(named=True)]


def summary(results: list[RowResult]) -> dict[str, Any]:
    """Mean/median absolute percentage error and worst rows, for ok and uncertain rows and per source."""
    def stats(rows: list[RowResult]) -> dict[str, Any]:
        errs = [r.error for r in rows if r.error is not None and r.status == "ok"]
        if not errs:
            return {"n": 0}
        abs_err = np.abs(np.array(errs))
        worst = sorted((r for r in rows if r.error is not None and r.status == "ok"), key=lambda r: -abs(r.error))
        return {"n": len(errs), "mape": float(abs_err.mean()), "median_ape": float(np.median(abs_err)),
                "mean_signed": float(np.mean(errs)), "worst": [(r.id, round(r.error, 4)) for r in worst[:5]]}

    out: dict[str, Any] = {q: stats([r for r in results if r.quality == q]) for q in ("ok", "uncertain")}
    out["by_source"] = {s: stats([r for r in results if r.source == s]) for s in sorted({r.source for r in results})}
    out["by_gpu"] = {g: stats([r for r in results if r.gpu == g]) for g in sorted({r.gpu for r in results})}
    out["status"] = {s: sum(r.status == s for r in results) for s in ("ok", "oom", "no-candidate", "unsupported")}
    return out


def table(results: list[RowResult]) -> str:
    lines = [f"{'id':<44}{'quality':<11}{'metric':<16}{'measured':>12}{'predicted':>13}{'error':>9}  chosen / status"]
    for r in results:
        meas = f"{r.measured:.4g}" if r.measured is not None else "-"
        pred = f"{r.predicted:.4g}" if r.predicted is not None else "-"
        err = f"{100 * r.error:+.1f}%" if r.error is not None and not math.isnan(r.error) else "-"
        extra = " ".join(f"{k}={v}" for k, v in r.chosen.items()) if r.status == "ok" else r.status
        lines.append(f"{r.id:<44}{r.quality:<11}{r.metric:<16}{meas:>12}{pred:>13}{err:>9}  {extra}")
    return "\n".join(lines)


__all__ = ["RowResult", "run", "summary", "table", "training_space"]
