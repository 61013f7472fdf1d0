"""The space encoder against a plain-Python reference.

``reference`` below walks ``itertools.product`` row by row and applies each
rule as ``spaces.enums.Reason`` documents it; the vectorized encoder must keep
the same rows (every column, in the same order), charge every dropped
combination to the same first rule and count the same rule breaks.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraspace.spaces.catalog import space_from_raw
from paraspace.spaces.encode import Encoder
from paraspace.spaces.enums import Reason

HERE = Path(__file__).parent

# --------------------------------------------------------------------------- the reference

#: product order, slowest first
ORDER = ("devices", "tp", "pp", "dp", "cp", "vpp", "micro_batch", "recompute", "recompute_layers",
         "offload_activations", "offload_weights", "sequence_parallel", "tp_overlap", "zero", "defer_grad_sync",
         "optimizer", "schedule", "ep", "expert_tp", "ep_placement", "dispatch", "tbo")
#: storage type of every column (architecture.md: int32 sizes, int8 enums and flags)
DTYPES = {
    "devices": np.int32, "tp": np.int32, "pp": np.int32, "dp": np.int32, "cp": np.int32, "vpp": np.int32, "micro_batch": np.int32,
    "recompute": np.int8, "recompute_layers": np.int32, "offload_activations": np.int8, "offload_weights": np.int8,
    "sequence_parallel": np.int8, "tp_overlap": np.int8, "zero": np.int8, "defer_grad_sync": np.int8, "optimizer": np.int8,
    "schedule": np.int8, "ep": np.int32, "expert_tp": np.int32, "ep_placement": np.int8, "dispatch": np.int8,
    "tbo": np.int8,
    "row_id": np.int64, "n_microbatches": np.int32,
}  # fmt: skip
#: enum codes spelt out on purpose (a renumbering shows up as a failure)
RECOMPUTE = {"none": 0, "selective": 1, "full": 2, "norms": 3, "moe-dispatch": 4, "selective-ops": 5}
GPIPE, ONE_F_ONE_B, INTERLEAVED, DUALPIPE = 0, 1, 2, 4
SCHEDULE = {"gpipe": GPIPE, "1f1b": ONE_F_ONE_B, "interleaved": INTERLEAVED, "zb-h1": 3, "dualpipe": DUALPIPE,
            "pipedream": 5}
OPTIMIZER = {"adam": 0, "adam-8bit": 1, "cpu-adam": 2, "adam-no-master": 3, "adam-8bit-paged": 4, "adam-bf16": 5}
PLACEMENT = {"inner": 0, "outer": 1}
ALLTOALL = 1
DISPATCH = {"allgather": 0, "alltoall": ALLTOALL, "hierarchical": 2, "sendrecv-allgather": 3,
            "sendrecv-allgather-split": 4, "low-latency": 5}
VALID, DEVICE_COUNT, TP_HEADS, PP_LAYERS, CP_SEQUENCE, BATCH = 0, 1, 2, 3, 4, 5
VPP_SCHEDULE, INTERLEAVE_MICROBATCHES, PP1_SCHEDULE, SP_WITHOUT_TP, ZERO_WITHOUT_DP = 6, 7, 8, 9, 10
TP_OVERLAP_WITHOUT_SP, EP_DENSE, EP_EXPERTS, EP_GROUP, EP1_DISPATCH = 11, 12, 13, 14, 15
RECOMPUTE_LAYERS, WEIGHT_OFFLOAD, DUALPIPE_SHAPE, MOE_RECOMPUTE_DENSE, DEFER_WITHOUT_ACCUMULATION = 16, 17, 18, 19, 20
N_REASONS = 21


def broken_rules(row: dict, devices: int, global_batch: int, seq_len: int, model) -> list[int]:
    """Every rule one combination breaks, in Reason order. ``row["dp"]`` is None
    where a derived data-parallel size does not exist (tp * pp * cp does not
    divide the devices); the rules about dp apply to rows with a dp only."""
    tp, pp, dp, cp, vpp, mb = (row[k] for k in ("tp", "pp", "dp", "cp", "vpp", "micro_batch"))
    schedule = row["schedule"]
    out = []
    if dp is None or tp * pp * dp * cp != devices:
        out.append(DEVICE_COUNT)
    if model.heads % tp or model.kv_heads % tp or model.ffn % tp:
        out.append(TP_HEADS)
    if model.layers % (pp * vpp):
        out.append(PP_LAYERS)
    if cp > 1 and seq_len % (2 * cp):  # load-balanced causal CP: 2*cp chunks
        out.append(CP_SEQUENCE)
    if dp is not None and global_batch % (dp * mb):
        out.append(BATCH)
    if (vpp > 1) != (schedule == INTERLEAVED):
        out.append(VPP_SCHEDULE)
    # judged only where the number of micro-batches is a whole number
    if dp is not None and schedule == INTERLEAVED and global_batch % (dp * mb) == 0:
        if (global_batch // (dp * mb)) % pp:
            out.append(INTERLEAVE_MICROBATCHES)
    if pp == 1 and schedule != ONE_F_ONE_B:
        out.append(PP1_SCHEDULE)
    if row["sequence_parallel"] and tp == 1:
        out.append(SP_WITHOUT_TP)
    if dp is not None and row["zero"] > 0 and dp * cp == 1:
        out.append(ZERO_WITHOUT_DP)
    if row["tp_overlap"] and not row["sequence_parallel"]:
        out.append(TP_OVERLAP_WITHOUT_SP)
    ep, etp = row["ep"], row["expert_tp"]
    if model.moe is None and (ep > 1 or etp > 1):
        out.append(EP_DENSE)
    if model.moe is not None and (model.moe.experts % ep or model.moe.expert_ffn % etp):
        out.append(EP_EXPERTS)
    if dp is not None and (tp * cp * dp) % (ep * etp):
        out.append(EP_GROUP)
    if ep == 1 and (row["dispatch"] != ALLTOALL or row["tbo"] or row["ep_placement"]):
        out.append(EP1_DISPATCH)
    if row["recompute_layers"] > 0 and row["recompute"] != RECOMPUTE["full"]:
        out.append(RECOMPUTE_LAYERS)
    if row["offload_weights"] and row["optimizer"] != OPTIMIZER["cpu-adam"]:
        out.append(WEIGHT_OFFLOAD)
    # DualPipe feeds half the micro-batches from each end: pp and the micro-batches even
    if schedule == DUALPIPE and (pp % 2 or (dp is not None and global_batch % (dp * mb) == 0
                                            and (global_batch // (dp * mb)) % 2)):
        out.append(DUALPIPE_SHAPE)
    # a dense model has no dispatch to recompute: the row would repeat recompute = none
    if model.moe is None and row["recompute"] == RECOMPUTE["moe-dispatch"]:
        out.append(MOE_RECOMPUTE_DENSE)
    # deferring the gradient reduction changes a row only under ZeRO-3 with several
    # micro-batches per step (judged where that number is known: rows with a dp)
    one_micro = dp is not None and global_batch == dp * mb
    if row["defer_grad_sync"] and (row["zero"] < 3 or one_micro):
        out.append(DEFER_WITHOUT_ACCUMULATION)
    return out


@dataclass
class Reference:
    columns: dict[str, np.ndarray]
    n_combinations: int
    first_reason: np.ndarray
    breaks: np.ndarray


def reference(space, start: int = 0, stop: int | None = None) -> Reference:
    spec, model = space.spec, space.model
    dims = spec.dimensions
    derive_dp = dims.dp is None
    lists = {
        "devices": list(spec.device_counts),
        "tp": list(dims.tp),
        "pp": list(dims.pp),
        "dp": [None] if derive_dp else list(dims.dp),
        "cp": list(dims.cp),
        "vpp": list(dims.vpp),
        "micro_batch": list(dims.micro_batch),
        "recompute": [RECOMPUTE[v] for v in dims.recompute],
        "recompute_layers": list(dims.recompute_layers),
        "offload_activations": [int(v) for v in dims.offload_activations],
        "offload_weights": [int(v) for v in dims.offload_weights],
        "sequence_parallel": [int(v) for v in dims.sequence_parallel],
        "tp_overlap": [int(v) for v in dims.tp_overlap],
        "zero": list(dims.zero),
        "defer_grad_sync": [int(v) for v in dims.defer_grad_sync],
        "optimizer": [OPTIMIZER[v] for v in dims.optimizer],
        "schedule": [SCHEDULE[v] for v in dims.schedule],
        "ep": list(dims.ep),
        "expert_tp": list(dims.expert_tp),
        "ep_placement": [PLACEMENT[v] for v in dims.ep_placement],
        "dispatch": [DISPATCH[v] for v in dims.dispatch],
        "tbo": [int(v) for v in dims.tbo],
    }
    kept: dict[str, list] = {k: [] for k in (*ORDER, "row_id", "n_microbatches")}
    first = [0] * N_REASONS
    breaks = [0] * N_REASONS
    n = 0
    for row_id, values in enumerate(itertools.product(*(lists[k] for k in ORDER))):
        if row_id < start or (stop is not None and row_id >= stop):
            continue
        n += 1
        row = dict(zip(ORDER, values))
        if derive_dp:
            others = row["tp"] * row["pp"] * row["cp"]
            row["dp"] = row["devices"] // others if row["devices"] % others == 0 else None
        broken = broken_rules(row, row["devices"], spec.global_batch, spec.seq_len, model)
        for code in broken:
            breaks[code] += 1
        first[broken[0] if broken else VALID] += 1
        if not broken:
            for k in ORDER:
                kept[k].append(row[k])
            kept["row_id"].append(row_id)
            kept["n_microbatches"].append(spec.global_batch // (row["dp"] * row["micro_batch"]))
    return Reference(
        columns={k: np.asarray(v, dtype=DTYPES[k]) for k, v in kept.items()},
        n_combinations=n,
        first_reason=np.asarray(first, dtype=np.int64),
        breaks=np.asarray(breaks, dtype=np.int64),
    )


def assert_same(encoded, ref: Reference) -> None:
    assert set(encoded.columns) == set(ref.columns)
    for name, want in ref.columns.items():
        got = encoded.columns[name]
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert encoded.n_combinations == ref.n_combinations
    np.testing.assert_array_equal(encoded.first_reason, ref.first_reason)
    np.testing.assert_array_equal(encoded.breaks, ref.breaks)
    assert encoded.n_rows == int(ref.first_reason[VALID])


def concat(parts) -> dict[str, np.ndarray]:
    parts = list(parts)
    return {name: np.concatenate([p.columns[name] for p in parts]) for name in parts[0].columns}


def make(base_dir: Path = HERE, *, dims: dict | None = None, **top):
    raw = {
        "name": "test",
        "description": "a test space",
        "model": "llama3-8b",
        "hardware": "h100-sxm5-80gb",
        "devices": 8,
        "global_batch": 8,
        "seq_len": 4096,
        **top,
    }
    if dims is not None:
        raw["dimensions"] = dims
    return space_from_raw(raw, "test", base_dir)


# --------------------------------------------------------------------------- spaces compared with the reference

#: small spaces whose dimension lists together exercise every rule
SPACES = {
    # derived dp; llama3-8b: 32 layers, 32 heads, 8 kv heads
    "llama3-8b-24": dict(
        devices=24, global_batch=12, seq_len=12,
        dims=dict(
            tp=[1, 2, 3, 4, 8], pp=[1, 2, 3, 4], cp=[1, 2, 4], vpp=[1, 2], micro_batch=[1, 2, 3],
            recompute=["none", "full"], sequence_parallel=[False, True], zero=[0, 1],
            schedule=["1f1b", "interleaved", "gpipe"],
        ),
    ),
    # several cluster sizes: dp derived per size
    "llama3-8b-sizes": dict(
        devices=[8, 12, 16], global_batch=48, seq_len=64,
        dims=dict(tp=[1, 2, 4, 8], pp=[1, 2, 3, 4], micro_batch=[1, 2, 4], zero=[0, 1]),
    ),
    # explicit dp, some never fitting; llama3-70b: 80 layers, 64 heads, 8 kv heads
    "llama3-70b-8": dict(
        model="llama3-70b", devices=8, global_batch=16, seq_len=8192,
        dims=dict(
            tp=[1, 2, 4, 8], pp=[1, 2, 4, 8], dp=[1, 2, 4, 8, 16], cp=[1, 2], vpp=[1, 2, 5], micro_batch=[1, 2, 4],
            recompute=["none", "full"], sequence_parallel=[True, False], zero=[0, 1, 2, 3],
            defer_grad_sync=[False, True], schedule=["gpipe", "1f1b", "interleaved"],
        ),
    ),
    # gpt3-175b (96 layers, 96 heads) on A100 in fp16, lists not sorted, dp = "auto"
    "gpt3-a100-32": dict(
        model="gpt3-175b", hardware="a100-sxm4-80gb", dtype="fp16", devices=32, global_batch=64, seq_len=2048,
        dims=dict(
            tp=[16, 1, 2, 8, 4], pp=[1, 2, 4, 8, 16, 3], dp="auto", cp=[4, 1, 2], vpp=[1, 2, 3, 4], micro_batch=[4, 1, 3, 2],
            recompute=["selective"], sequence_parallel=[True, False], zero=[3, 0],
            schedule=["interleaved", "1f1b", "gpipe"],
        ),
    ),
    # explicit dp with values that do not divide the devices, odd sequence length
    "megatron-1t-12": dict(
        model="megatron-1t", devices=12, global_batch=36, seq_len=4098,
        dims=dict(
            tp=[1, 2, 4, 5], pp=[1, 2, 4], dp=[1, 2, 3, 5, 6], cp=[1, 2, 3], vpp=[1, 2, 4], micro_batch=[1, 2, 3],
            sequence_parallel=[False, True], tp_overlap=[False, True], zero=[0, 2],
            schedule=["1f1b", "interleaved", "gpipe"],
        ),
    ),
    # memory knobs: partial recompute (full only), weight offload (cpu-adam only), moe-dispatch
    # recompute (MoE models only), the optimizer variants
    "llama3-8b-offload": dict(
        devices=8, global_batch=16,
        dims=dict(tp=[1, 2], pp=[1, 2], recompute=["none", "selective", "full", "norms", "moe-dispatch"],
                  recompute_layers=[0, 4], offload_activations=[False, True], offload_weights=[False, True],
                  optimizer=["adam", "cpu-adam", "adam-no-master", "adam-8bit-paged"]),
    ),
    # the bidirectional and asynchronous schedules: DualPipe needs an even pp and micro-batch count
    "llama3-8b-schedules": dict(
        devices=8, global_batch=12,
        dims=dict(tp=[1, 2], pp=[1, 2, 4], micro_batch=[1, 2, 3], schedule=["1f1b", "dualpipe", "pipedream"]),
    ),
    # expert dimensions on a dense model: every ep > 1 row is dropped
    "llama3-8b-ep": dict(
        devices=8, global_batch=16,
        dims=dict(tp=[1, 2], pp=[1, 2], ep=[1, 2, 4], expert_tp=[1, 2], dispatch=["alltoall", "allgather"],
                  tbo=[False, True]),
    ),
    # mixtral-8x7b (8 experts of 14336, 32 layers) on 24 devices: ep 3 and 16 never divide the experts,
    # ep * expert_tp must divide tp * cp * dp
    "mixtral-24": dict(
        model="mixtral-8x7b", devices=24, global_batch=48, seq_len=4096,
        dims=dict(
            tp=[1, 2, 4], pp=[1, 2], cp=[1, 2], ep=[1, 2, 3, 4, 8, 16], expert_tp=[1, 2, 3, 7],
            ep_placement=["inner", "outer"], dispatch=["alltoall", "hierarchical", "sendrecv-allgather-split"],
            tbo=[False, True], recompute=["none", "moe-dispatch"],
        ),
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def cases():
    out = {}
    for name, kwargs in SPACES.items():
        space = make(**kwargs)
        out[name] = (space, Encoder(space), reference(space))
    return out


@pytest.mark.parametrize("name", SPACES)
def test_encode_all_matches_reference(cases, name):
    _, encoder, ref = cases[name]
    encoded = encoder.encode_all()
    assert encoder.n_combinations == ref.n_combinations
    assert_same(encoded, ref)
    assert 0 < encoded.n_rows < encoded.n_combinations


def test_every_reason_is_exercised(cases):
    first = sum(ref.first_reason for _, _, ref in cases.values())
    breaks = sum(ref.breaks for _, _, ref in cases.values())
    for reason in Reason:
        if reason is Reason.VALID:
            assert breaks[reason] == 0
            continue
        assert first[reason] > 0, f"{reason.name} is never the first rule broken"
        assert breaks[reason] >= first[reason] > 0
    # a row may break several rules, so breaks exceed the first-rule charges somewhere
    assert breaks[1:].sum() > first[1:].sum()


def test_reason_codes_match_the_reference_numbering():
    assert [int(r) for r in Reason] == list(range(N_REASONS))
    assert (Reason.DEVICE_COUNT, Reason.ZERO_WITHOUT_DP) == (DEVICE_COUNT, ZERO_WITHOUT_DP)
    assert Reason.INTERLEAVE_MICROBATCHES == INTERLEAVE_MICROBATCHES


@pytest.mark.parametrize("name", SPACES)
def test_partial_ranges_match_reference(cases, name):
    space, encoder, _ = cases[name]
    n = encoder.n_combinations
    for start, stop in [(0, 1), (n // 3, n // 3 + 101), (n - 7, n), (n - 1, n + 10)]:
        assert_same(encoder.encode(start, stop), reference(space, start, min(stop, n)))


def test_custom_model_ffn_clause(tmp_path):
    """tp must divide ffn too: a model whose ffn (12) is not a multiple of its heads (8)."""
    (tmp_path / "odd-ffn.toml").write_text(
        'name = "odd-ffn"\ndescription = "ffn not a multiple of 8"\nlayers = 4\nhidden = 64\n'
        "heads = 8\nkv_heads = 8\nffn = 12\nvocab = 100\nglu = false\n"
    )
    space = make(tmp_path, model="odd-ffn.toml", devices=8, dims=dict(tp=[1, 2, 4, 8], pp=[1, 2, 4]))
    encoded = Encoder(space).encode_all()
    assert_same(encoded, reference(space))
    assert encoded.first_reason[Reason.TP_HEADS] == 1  # tp = 8, pp = 1
    assert 8 not in encoded.columns["tp"] and 4 in encoded.columns["tp"]


# --------------------------------------------------------------------------- each rule on its own


def onehot(code: Reason, count: int = 1) -> np.ndarray:
    out = np.zeros(len(Reason), np.int64)
    out[code] = count
    return out


#: (reason, space kwargs, kept rows, dropped rows) where nothing but ``reason`` is broken
ALONE = [
    (Reason.DEVICE_COUNT, dict(devices=2, global_batch=2, dims=dict(dp=[1, 2])), 1, 1),
    (Reason.DEVICE_COUNT, dict(devices=2, global_batch=2, dims=dict(tp=[1, 4])), 1, 1),  # derived dp: 4 does not divide 2
    (Reason.TP_HEADS, dict(devices=3, global_batch=3, dims=dict(tp=[1, 3])), 1, 1),  # 32 heads
    (Reason.TP_HEADS, dict(devices=16, global_batch=16, dims=dict(tp=[8, 16])), 1, 1),  # 8 kv heads
    (Reason.PP_LAYERS, dict(devices=3, global_batch=3, dims=dict(pp=[1, 3])), 1, 1),  # 32 layers
    (Reason.PP_LAYERS, dict(devices=2, global_batch=2, dims=dict(pp=[2], vpp=[2, 3], schedule=["interleaved"])), 1, 1),
    (Reason.CP_SEQUENCE, dict(devices=2, global_batch=2, seq_len=6, dims=dict(cp=[1, 2])), 1, 1),
    (Reason.BATCH, dict(devices=1, global_batch=3, dims=dict(micro_batch=[1, 2, 3])), 2, 1),
    (Reason.BATCH, dict(devices=4, global_batch=6, dims=dict(tp=[2, 1])), 1, 1),  # derived dp = 4 does not divide 6
    (Reason.VPP_SCHEDULE, dict(devices=2, global_batch=2, dims=dict(pp=[2], vpp=[1, 2])), 1, 1),
    (Reason.VPP_SCHEDULE, dict(devices=2, global_batch=2, dims=dict(pp=[2], schedule=["1f1b", "interleaved"])), 1, 1),
    (Reason.INTERLEAVE_MICROBATCHES,
     dict(devices=2, global_batch=2, dims=dict(pp=[2], vpp=[2], micro_batch=[1, 2], schedule=["interleaved"])), 1, 1),
    (Reason.PP1_SCHEDULE, dict(devices=1, global_batch=1, dims=dict(schedule=["gpipe", "1f1b"])), 1, 1),
    (Reason.SP_WITHOUT_TP, dict(devices=2, global_batch=2, dims=dict(tp=[1, 2], sequence_parallel=[True])), 1, 1),
    (Reason.SP_WITHOUT_TP, dict(devices=1, global_batch=1, dims=dict(sequence_parallel=[False, True])), 1, 1),
    (Reason.ZERO_WITHOUT_DP, dict(devices=2, global_batch=2, dims=dict(tp=[1, 2], zero=[1])), 1, 1),
    (Reason.ZERO_WITHOUT_DP, dict(devices=1, global_batch=1, dims=dict(zero=[0, 1, 2, 3])), 1, 3),
    (Reason.TP_OVERLAP_WITHOUT_SP, dict(devices=2, global_batch=2, dims=dict(tp=[2], sequence_parallel=[False, True],
                                                                            tp_overlap=[True])), 1, 1),
    (Reason.EP_DENSE, dict(devices=2, global_batch=2, dims=dict(ep=[1, 2])), 1, 1),
    (Reason.EP_EXPERTS, dict(model="mixtral-8x7b", devices=3, global_batch=3, dims=dict(ep=[1, 3])), 1, 1),  # 8 experts
    (Reason.EP_GROUP, dict(model="mixtral-8x7b", devices=2, global_batch=2, dims=dict(ep=[2, 4])), 1, 1),
    (Reason.EP1_DISPATCH, dict(model="mixtral-8x7b", devices=1, global_batch=1, dims=dict(tbo=[False, True])), 1, 1),
    (Reason.RECOMPUTE_LAYERS, dict(devices=1, global_batch=1, dims=dict(recompute=["full", "selective"],
                                                                        recompute_layers=[2])), 1, 1),
    (Reason.WEIGHT_OFFLOAD, dict(devices=1, global_batch=1, dims=dict(optimizer=["cpu-adam", "adam"],
                                                                      offload_weights=[True])), 1, 1),
    (Reason.DUALPIPE_SHAPE, dict(devices=2, global_batch=2, dims=dict(pp=[2], micro_batch=[1, 2],
                                                                      schedule=["dualpipe"])), 1, 1),  # m = 2, 1
    (Reason.MOE_RECOMPUTE_DENSE, dict(devices=1, global_batch=1, dims=dict(recompute=["moe-dispatch", "norms"])), 1, 1),
    # ZeRO-2 deferring: dropped; ZeRO-3 with 2 micro-batches (dp 2, micro-batch 1, batch 4) kept both ways
    (Reason.DEFER_WITHOUT_ACCUMULATION, dict(devices=2, global_batch=4, dims=dict(zero=[2, 3],
                                                                                  defer_grad_sync=[False, True])), 3, 1),
    # ZeRO-3 with one micro-batch per step (dp 2 x micro-batch 2 = batch 4): deferring changes nothing
    (Reason.DEFER_WITHOUT_ACCUMULATION, dict(devices=2, global_batch=4, dims=dict(zero=[3], micro_batch=[1, 2],
                                                                                  defer_grad_sync=[True])), 1, 1),
]  # fmt: skip


@pytest.mark.parametrize("reason,kwargs,kept,dropped", ALONE, ids=lambda v: v.name if isinstance(v, Reason) else None)
def test_each_rule_alone(reason, kwargs, kept, dropped):
    space = make(**kwargs)
    encoded = Encoder(space).encode_all()
    assert encoded.n_combinations == kept + dropped
    assert encoded.n_rows == kept
    np.testing.assert_array_equal(encoded.first_reason, onehot(Reason.VALID, kept) + onehot(reason, dropped))
    np.testing.assert_array_equal(encoded.breaks, onehot(reason, dropped))
    assert_same(encoded, reference(space))


def test_every_reason_has_a_lone_case():
    assert {r for r, *_ in ALONE} == set(Reason) - {Reason.VALID}


def test_rules_that_do_not_drop():
    """Boundaries the rules leave alone: CP of 1 needs no even sequence; ZeRO with
    dp = 1 but cp > 1 still shards; interleaving whose micro-batches divide by pp;
    moe-dispatch recompute on an MoE model."""
    cases = [
        dict(devices=1, global_batch=1, seq_len=7),
        dict(devices=2, global_batch=2, seq_len=8, dims=dict(cp=[2], zero=[1, 2, 3])),
        dict(devices=4, global_batch=8, dims=dict(pp=[4], vpp=[2], micro_batch=[1, 2], schedule=["interleaved"])),
        dict(devices=8, global_batch=8, dims=dict(tp=[8], sequence_parallel=[False, True])),
        dict(model="mixtral-8x7b", devices=1, global_batch=1, dims=dict(recompute=["moe-dispatch", "norms"])),
    ]
    for kwargs in cases:
        encoded = Encoder(make(**kwargs)).encode_all()
        assert encoded.n_rows == encoded.n_combinations, kwargs
        assert encoded.breaks.sum() == 0


def test_first_rule_wins():
    """tp = 3 on 8 devices breaks the device count and the heads: charged to DEVICE_COUNT, both counted."""
    encoded = Encoder(make(devices=8, dims=dict(tp=[3], dp=[1]))).encode_all()
    np.testing.assert_array_equal(encoded.first_reason, onehot(Reason.DEVICE_COUNT))
    assert encoded.breaks[Reason.DEVICE_COUNT] == encoded.breaks[Reason.TP_HEADS] == 1


# --------------------------------------------------------------------------- determinism and chunks


def test_encode_twice_is_identical(cases):
    space, encoder, _ = cases["llama3-8b-24"]
    a, b = encoder.encode_all(), encoder.encode_all()
    c = Encoder(make(**SPACES["llama3-8b-24"])).encode_all()
    for other in (b, c):
        assert list(other.columns) == list(a.columns)
        for name in a.columns:
            assert other.columns[name].dtype == a.columns[name].dtype
            np.testing.assert_array_equal(other.columns[name], a.columns[name])
        np.testing.assert_array_equal(other.first_reason, a.first_reason)
        np.testing.assert_array_equal(other.breaks, a.breaks)
    assert np.all(np.diff(a.columns["row_id"]) > 0)


def _check_chunks(encoder, k):
    whole = encoder.encode_all()
    parts = list(encoder.chunks(k))
    assert len(parts) == -(-encoder.n_combinations // k)
    assert all(p.n_combinations == k for p in parts[:-1]) and 0 < parts[-1].n_combinations <= k
    assert sum(p.n_combinations for p in parts) == encoder.n_combinations
    joined = concat(parts)
    for name in whole.columns:
        assert joined[name].dtype == whole.columns[name].dtype
        np.testing.assert_array_equal(joined[name], whole.columns[name], err_msg=name)
    np.testing.assert_array_equal(sum(p.first_reason for p in parts), whole.first_reason)
    np.testing.assert_array_equal(sum(p.breaks for p in parts), whole.breaks)


@pytest.mark.parametrize("k", [7, 97, 1000, 4096, 8640, 10**6])
def test_chunks_concatenate_to_encode_all(cases, k):
    _check_chunks(cases["llama3-8b-24"][1], k)


def test_chunks_of_one_row():
    space = make(devices=8, global_batch=16, dims=dict(tp=[1, 2, 4, 8], pp=[1, 2, 4], cp=[1, 2], vpp=[1, 2],
                                                      sequence_parallel=[False, True], zero=[0, 1],
                                                      schedule=["1f1b", "interleaved"]))  # fmt: skip
    encoder = Encoder(space)
    assert encoder.n_combinations == 384
    for k in (1, 2, 13, 383, 384, 385):
        _check_chunks(encoder, k)


def test_chunks_of_a_range(cases):
    _, encoder, _ = cases["llama3-70b-8"]
    whole = encoder.encode_all()
    start, stop = 1234, 40_000
    parts = list(encoder.chunks(997, start, stop))
    assert sum(p.n_combinations for p in parts) == stop - start
    joined = concat(parts)
    inside = (whole.columns["row_id"] >= start) & (whole.columns["row_id"] < stop)
    for name in whole.columns:
        np.testing.assert_array_equal(joined[name], whole.columns[name][inside], err_msg=name)


# --------------------------------------------------------------------------- derived dp


def test_dp_omitted_is_derived_per_row():
    space = make(devices=16, global_batch=32, dims=dict(tp=[1, 2, 4, 8], pp=[1, 2, 4], cp=[1, 2]))
    encoder = Encoder(space)
    assert encoder.n_combinations == 4 * 3 * 2  # no dp axis to enumerate
    encoded = encoder.encode_all()
    cols = encoded.columns
    np.testing.assert_array_equal(cols["dp"], 16 // (cols["tp"] * cols["pp"] * cols["cp"]))
    # tp * pp * cp of 32 or 64 (tp 8 pp 4; tp 8 pp 2 cp 2; tp 4 pp 4 cp 2; tp 8 pp 4 cp 2) leaves no dp
    np.testing.assert_array_equal(encoded.first_reason, onehot(Reason.VALID, 20) + onehot(Reason.DEVICE_COUNT, 4))
    np.testing.assert_array_equal(encoded.breaks, onehot(Reason.DEVICE_COUNT, 4))
    assert_same(encoded, reference(space))


def test_dp_omitted_gives_every_divisor():
    """With tp, pp, cp free enough, the derived data-parallel sizes are all divisors of the devices."""
    space = make(devices=12, global_batch=24, seq_len=24576, dims=dict(cp=[1, 2, 3, 4, 6, 12]))
    encoded = Encoder(space).encode_all()
    assert encoded.n_rows == 6
    assert sorted(encoded.columns["dp"].tolist()) == [1, 2, 3, 4, 6, 12]
    assert_same(encoded, reference(space))


@pytest.mark.parametrize("name", ["llama3-8b-24", "gpt3-a100-32"])
def test_dp_omitted_keeps_the_rows_of_all_divisors(name):
    """Deriving dp keeps exactly the candidates that listing every divisor of the devices keeps."""
    kwargs = SPACES[name]
    devices = kwargs["devices"]
    divisors = [d for d in range(1, devices + 1) if devices % d == 0]
    derived = Encoder(make(**kwargs)).encode_all()
    listed = Encoder(make(**{**kwargs, "dims": {**kwargs["dims"], "dp": divisors}})).encode_all()
    assert listed.n_combinations == derived.n_combinations * len(divisors)
    assert derived.n_rows == listed.n_rows > 0

    def rows(enc):
        names = [*ORDER, "n_microbatches"]
        return sorted(zip(*(enc.columns[n].tolist() for n in names)))

    assert rows(derived) == rows(listed)


def test_dp_auto_equals_omitted():
    dims = dict(tp=[1, 2, 4, 8], pp=[1, 2])
    a = Encoder(make(dims=dims)).encode_all()
    b = Encoder(make(dims={**dims, "dp": "auto"})).encode_all()
    for name in a.columns:
        np.testing.assert_array_equal(a.columns[name], b.columns[name])
    np.testing.assert_array_equal(a.first_reason, b.first_reason)


# --------------------------------------------------------------------------- property test


def _sub(values, max_size):
    return st.lists(st.sampled_from(values), min_size=1, max_size=max_size, unique=True)


@st.composite
def small_spaces(draw):
    dims = dict(
        tp=draw(_sub([1, 2, 3, 4, 8, 16], 3)),
        pp=draw(_sub([1, 2, 3, 4, 8], 3)),
        cp=draw(_sub([1, 2, 3, 4], 2)),
        vpp=draw(_sub([1, 2, 3, 5], 2)),
        micro_batch=draw(_sub([1, 2, 3, 4], 2)),
        recompute=draw(_sub(["none", "selective", "full"], 2)),
        sequence_parallel=draw(_sub([False, True], 2)),
        tp_overlap=draw(_sub([False, True], 2)),
        zero=draw(_sub([0, 1, 2, 3], 2)),
        defer_grad_sync=draw(_sub([False, True], 2)),
        optimizer=draw(_sub(["adam", "adam-8bit", "cpu-adam"], 2)),
        schedule=draw(_sub(["gpipe", "1f1b", "interleaved", "zb-h1"], 4)),
    )
    if draw(st.booleans()):
        dims["dp"] = draw(_sub([1, 2, 3, 4, 6, 8, 16], 3))
    return dict(
        model=draw(st.sampled_from(["llama3-8b", "llama3-70b", "gpt3-175b"])),
        devices=draw(st.sampled_from([1, 2, 4, 6, 8, 12, 16, 24])),
        global_batch=draw(st.sampled_from([1, 4, 6, 8, 12, 16, 48])),
        seq_len=draw(st.sampled_from([6, 7, 12, 16, 2048, 4097])),
        dims=dims,
    )


@settings(max_examples=60, deadline=None)
@given(small_spaces())
def test_property_counts_and_invariants(kwargs):
    space = make(**kwargs)
    spec, model = space.spec, space.model
    encoder = Encoder(space)
    encoded = encoder.encode_all()
    dims = kwargs["dims"]

    n = 1
    for name in ORDER:
        n *= len(dims.get(name, [1])) if name != "dp" else len(dims.get("dp", [None]))
    assert encoder.n_combinations == encoded.n_combinations == n
    assert encoded.n_rows + encoded.first_reason[1:].sum() == n
    assert encoded.first_reason[Reason.VALID] == encoded.n_rows
    assert np.all(encoded.breaks >= encoded.first_reason * (np.arange(len(Reason)) > 0))

    c = {k: v.astype(np.int64) for k, v in encoded.columns.items()}
    tp, pp, dp, cp, vpp, mb, sched = (c[k] for k in ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "schedule"))
    assert np.all(tp * pp * dp * cp == spec.devices)
    assert np.all((model.heads % tp == 0) & (model.kv_heads % tp == 0) & (model.ffn % tp == 0))
    assert np.all(model.layers % (pp * vpp) == 0)
    assert np.all((cp == 1) | (spec.seq_len % (2 * cp) == 0))
    assert np.all(c["n_microbatches"] * dp * mb == spec.global_batch)
    assert np.all((vpp > 1) == (sched == INTERLEAVED))
    assert np.all((sched != INTERLEAVED) | (c["n_microbatches"] % pp == 0))
    assert np.all((pp > 1) | (sched == ONE_F_ONE_B))
    assert np.all((c["sequence_parallel"] == 0) | (tp > 1))
    assert np.all((c["zero"] == 0) | (dp * cp > 1))
    assert np.all(np.diff(c["row_id"]) > 0)
    assert np.all((c["row_id"] >= 0) & (c["row_id"] < n))
    for name in ("tp", "pp", "cp", "vpp", "micro_batch", "zero"):
        assert set(c[name].tolist()) <= set(dims.get(name, [1] if name != "zero" else [0]))
    if "dp" in dims:
        assert set(dp.tolist()) <= set(dims["dp"])

    assert_same(encoded, reference(space))


def test_uneven_layers_flag(tmp_path):
    """llama3-8b has 32 layers: pp = 3 or 5 does not divide them, so only
    uneven_layers admits them; pp = 3 with vpp = 11 would leave a chunk empty
    (32 // 3 = 10 < 11) and stays out either way."""
    base = {"name": "u", "description": "u", "model": "llama3-8b", "hardware": "h100-sxm5-80gb", "devices": 15,
            "global_batch": 15 * 33, "seq_len": 2048,
            "dimensions": {"tp": [1], "pp": [3, 5], "vpp": [1, 11], "schedule": ["1f1b", "interleaved"]}}
    even = Encoder(space_from_raw(base, "t", tmp_path)).encode_all()
    uneven = Encoder(space_from_raw({**base, "uneven_layers": True}, "t", tmp_path)).encode_all()
    assert even.n_rows == 0 and even.first_reason[Reason.PP_LAYERS] > 0
    kept = sorted(zip(uneven.columns["pp"].tolist(), uneven.columns["vpp"].tolist()))
    assert (3, 1) in kept and (5, 1) in kept and (3, 11) not in kept
