"""MoE and MLA in the training kernel: parameter counts against the published
totals, hand-derived MoE parameters, memory and FLOP, and the directions the
expert-parallel knobs must move the columns in."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from rows import DEFAULTS, columns
from hypothesis import strategies as st

from paraspace.explorer.evaluate import pack_hardware, pack_model
from paraspace.kernels import params
from paraspace.kernels.codes import (
    DISPATCH_ALLGATHER,
    DISPATCH_ALLTOALL,
    DISPATCH_HIERARCHICAL,
    PLACEMENT_INNER,
    PLACEMENT_OUTER,
    OPTIMIZER_CPU_ADAM,
    RECOMPUTE_FULL,
    SCHEDULE_DUALPIPE,
)
from paraspace.kernels.training import (
    OUTPUTS,
    evaluate_rows,
    model_flop_per_sequence,
    model_params,
    moe_layer_params,
    stage_params,
)
from paraspace.kernels.routing import routing_imbalance
from paraspace.spaces.catalog import load_hardware, load_model

GIB = 2.0**30
PROPS = settings(max_examples=40, deadline=None)

# --------------------------------------------------------------------------- parameter counts


@pytest.mark.parametrize(("name", "total_b", "active_b"), [
    ("deepseek-v3", 671.0, None),  # arXiv:2412.19437: 671B total (main model, MTP excluded)
    ("deepseek-v2", 236.0, None),  # arXiv:2405.04434: 236B total
    ("mixtral-8x7b", 46.7, 12.9),  # arXiv:2401.04088: 46.7B total, 12.9B active
    ("mixtral-8x22b", 141.0, 39.0),  # Mistral AI: 141B total, 39B active
    ("qwen3-235b-a22b", 235.0, 22.0),  # Qwen3 report: 235B total, 22B activated
])
def test_parameter_counts_match_published_totals(name, total_b, active_b):
    """Counted from the spec (every matrix, norm, router and embedding) within 1%."""
    total, active = model_params(pack_model(load_model(name))[0])
    assert total / 1e9 == pytest.approx(total_b, rel=0.01)
    if active_b is not None:
        assert active / 1e9 == pytest.approx(active_b, rel=0.01)


@pytest.mark.parametrize(("name", "published_b"), [("deepseek-v3", 37), ("deepseek-v2", 21)])
def test_deepseek_active_parameters_round_down_to_the_published_figure(name, published_b):
    """DeepSeek quote active parameters in whole billions ("37B", "21B"): counting
    everything a token's forward touches (as Mixtral's 12.9B is counted, which
    this count matches to 0.2%) gives 37.55B and 21.38B, i.e. the published
    figures rounded down; within 1% of them would need the embedding left out."""
    _, active = model_params(pack_model(load_model(name))[0])
    assert published_b <= active / 1e9 < published_b + 1


def test_deepseek_v3_by_hand():
    """One expert 3 x 7168 x 2048 = 44,040,192 parameters = 0.082 GiB in bf16 (the
    documents' figure); 16 of them 1.31 GiB. MLA attention per layer: q down
    7168 x 1536, q up 1536 x 128 x 192, kv down 7168 x 576, kv up 512 x 128 x 256,
    out 128 x 128 x 7168, plus the 1536 + 512 latent norms and two 7168 norms =
    187,121,664. An MoE layer adds 257 experts and the 256 x 7168 router:
    187,121,664 + 257 x 44,040,192 + 1,835,008 = 11,507,286,016."""
    expert = 3 * 7168 * 2048
    assert expert == 44_040_192
    assert round(expert * 2 / GIB, 3) == 0.082 and round(16 * expert * 2 / GIB, 2) == 1.31
    attention = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    layer_dense_part = attention + 1536 + 512 + 2 * 7168 + 256 * 7168 + 1 * expert
    model = pack_model(load_model("deepseek-v3"))[0]
    dense, routed = moe_layer_params(model, 1.0, 1.0, 1.0)
    assert dense == layer_dense_part
    assert dense + routed == 11_507_286_016
    assert routed == 256 * expert
    # split over 8 EP ranks and 2 expert-TP ranks: 256 / 8 experts, each half as wide
    assert moe_layer_params(model, 1.0, 8.0, 2.0)[1] == 256 / 8 * expert / 2


# --------------------------------------------------------------------------- a toy MoE model by hand


def toy_moe(**changes: float) -> np.ndarray:
    """2 layers, hidden 64, 4 heads of 16 (MHA), dense ffn 256, vocab 100; 8 experts
    of width 32, top-2, one shared expert, no dense layers."""
    values = dict(layers=2.0, hidden=64.0, heads=4.0, kv_heads=4.0, head_dim=16.0, ffn=256.0, vocab=100.0, glu=1.0,
                  bias=0.0, tied_embeddings=0.0, dropout=0.0, experts=8.0, top_k=2.0, expert_ffn=32.0,
                  shared_experts=1.0, dense_layers=0.0)
    values.update(changes)
    return params.record(params.MODEL, **values)


def test_toy_moe_stage_parameters_by_hand():
    """Per MoE layer: attention 4 x 64 x 64 = 16,384; shared expert 3 x 64 x 32 =
    6,144; router 8 x 64 = 512; norms 2 x 64 = 128 -> non-expert 23,168; routed
    experts 8 x 6,144 = 49,152, over ep = 2: 24,576. One stage (pp = 1) of both
    layers plus embedding and head 2 x 100 x 64 and the final norm 64:
    non-expert 2 x 23,168 + 12,800 + 64 = 59,200; expert 2 x 24,576 = 49,152."""
    model = toy_moe()[0]
    assert moe_layer_params(model, 1.0, 2.0, 1.0) == (23_168.0, 24_576.0)
    assert stage_params(0, 1, 1.0, 2.0, 1.0, model) == (59_200.0, 49_152.0)
    # with 2 TP ranks: attention and shared expert split, router and norms not
    assert moe_layer_params(model, 2.0, 2.0, 1.0)[0] == (16_384 + 6_144) / 2 + 512 + 128


def test_toy_moe_model_flop_by_hand():
    """Forward FLOP per sequence of s = 128 tokens: per layer attention GEMMs
    2 s 16,384, causal core 2 s^2 heads head_dim = 2 x 128^2 x 64; MoE: (top-2 +
    1 shared) experts of 3 x 64 x 32 and the router 8 x 64, 2 s each; LM head
    2 s 64 x 100."""
    s = 128.0
    per_layer = 2 * s * 16_384 + 2 * s * s * 64 + 2 * s * (3 * 6_144 + 512)
    assert model_flop_per_sequence(toy_moe()[0], s) == pytest.approx(2 * per_layer + 2 * s * 64 * 100, rel=1e-15)


# --------------------------------------------------------------------------- rows through the kernel

BASE = dict(DEFAULTS, dp=8, ep=8, placement=PLACEMENT_INNER, dispatch=DISPATCH_ALLTOALL, n_micro=4)


@pytest.fixture(scope="module")
def h800():
    device, tiers, tiles = pack_hardware(load_hardware("h800-sxm5-80gb"), "bf16")
    return device, tiers, tiles


@pytest.fixture(scope="module")
def mixtral():
    return pack_model(load_model("mixtral-8x7b"))


def run(model, hw, work, **changes) -> dict[str, float]:
    s = {**BASE, **changes}
    cols = columns([s], BASE)
    out = evaluate_rows(*cols, model, *hw, work)
    return dict(zip(OUTPUTS, (float(x) for x in out[0])))


def test_toy_moe_weight_memory_by_hand(toy_dev, toy_tiles, make_tiers, make_workload):
    """pp = 1, no ZeRO: weights = (59,200 + 49,152) params x 2 bytes; gradients x 4;
    Adam states x 12 (nothing sharded without ZeRO)."""
    out = run(toy_moe(), (toy_dev, make_tiers((0.0, 100e9, 0.0)), toy_tiles),
              make_workload(global_batch=16.0, seq_len=128.0), dp=2, ep=2, n_micro=8)
    assert out["mem_weights_bytes"] == 108_352 * 2
    assert out["mem_grads_bytes"] == 108_352 * 4
    assert out["mem_optimizer_bytes"] == 108_352 * 12


def test_dualpipe_device_holds_both_stages_sharded_by_kind(toy_dev, toy_tiles, make_tiers, make_workload):
    """DualPipe on pp = 2: every device runs stage 0 and stage 1, i.e. the whole toy
    model, each kind of parameter sharded as its own under ZeRO-1 (dp = 8, ep = 2:
    non-expert over 8 ranks, experts over 4): (59,200 / 8 + 49,152 / 4) x 12 =
    236,256 bytes of Adam states, not stage 0's (29,568 / 8 + 24,576 / 4) x 12 =
    118,080 scaled by the parameter ratio 108,352 / 54,144 (236,295.3). CPU Adam's
    fp32 master and moments (12 bytes, ``OPT_HOST_STATE_FRACTION``) are on the
    host, for both stages alike: 236,256 host bytes."""
    hw = (toy_dev, make_tiers((0.0, 100e9, 0.0)), toy_tiles)
    work = make_workload(global_batch=64.0, seq_len=128.0)
    out = run(toy_moe(), hw, work, pp=2, dp=8, ep=2, zero=1, n_micro=8, schedule=SCHEDULE_DUALPIPE)
    assert out["mem_optimizer_bytes"] == pytest.approx((59_200 / 8 + 49_152 / 4) * 12, rel=1e-15)
    assert out["mem_weights_bytes"] == 108_352 * 2  # both stages' weights, unsharded under ZeRO-1
    cpu = run(toy_moe(), hw, work, pp=2, dp=8, ep=2, zero=1, n_micro=8, schedule=SCHEDULE_DUALPIPE,
              opt=OPTIMIZER_CPU_ADAM)
    assert cpu["mem_host_bytes"] == pytest.approx((59_200 / 8 + 49_152 / 4) * 12, rel=1e-15)


def test_zero1_shards_expert_states_over_expert_dp(toy_dev, toy_tiles, make_tiers, make_workload):
    """ZeRO-1 with dp = 8, ep = 2: non-expert states over the 8 DP ranks, expert
    states over the 8 / 2 = 4 expert-DP ranks: (59,200 / 8 + 49,152 / 4) x 12."""
    out = run(toy_moe(), (toy_dev, make_tiers((0.0, 100e9, 0.0)), toy_tiles),
              make_workload(global_batch=16.0, seq_len=128.0), dp=8, ep=2, zero=1, n_micro=2)
    assert out["mem_optimizer_bytes"] == pytest.approx((59_200 / 8 + 49_152 / 4) * 12, rel=1e-15)


def test_dense_model_has_no_moe_columns(h800, make_workload):
    out = run(pack_model(load_model("llama3-8b")), h800, make_workload(global_batch=32.0), ep=1)
    assert out["ep_comm_s"] == out["moe_dispatch_s"] == out["mem_moe_buffers_bytes"] == 0.0
    assert out["expert_gemm_rows"] == 0.0


def test_expert_gemm_rows(h800, mixtral, make_workload):
    """Forced balanced routing (moe_imbalance = 1): each of the E / ep local experts
    gets ep x T x k / E rows; mixtral (E = 8, top-2), ep = 8, T = 4096 tokens:
    8 x 4096 x 2 / 8 = 8192.
    Derived (uniform random routing, kernels.routing's normal branch): N = 32,768
    tokens, λ = 8192 rows per rank; variance = N k (1/8)(7/8)(6/7) = 6144,
    σ = 78.3837; z = Blom's 1.434200 x sqrt(8/7) = 1.533224; κ3 = 6144 x 0.75 x 4/6
    = 3072, γ = 3072 / 6144^1.5 = 0.0063788, z += (z² - 1) γ / 6 -> 1.534660;
    imbalance 1 + 78.3837 x 1.534660 / 8192 = 1.014684: 8312.29 rows."""
    out = run(mixtral, h800, make_workload(global_batch=32.0, seq_len=4096.0, moe_imbalance=1.0))
    assert out["expert_gemm_rows"] == 8 * 4096 * 2 / 8
    out = run(mixtral, h800, make_workload(global_batch=32.0, seq_len=4096.0))
    assert out["expert_gemm_rows"] == pytest.approx(8192 * 1.014684, rel=1e-6)


@pytest.mark.parametrize("dispatch", [DISPATCH_ALLGATHER, DISPATCH_ALLTOALL, DISPATCH_HIERARCHICAL])
def test_more_expert_parallelism_never_raises_weight_memory(h800, mixtral, make_workload, dispatch):
    work = make_workload(global_batch=32.0, seq_len=4096.0)
    mems = [run(mixtral, h800, work, ep=ep, dispatch=dispatch)["mem_weights_bytes"] for ep in (1, 2, 4, 8)]
    assert mems == sorted(mems, reverse=True) and mems[0] > mems[-1]


@PROPS
@given(ep=st.sampled_from([2, 4, 8]), mb=st.sampled_from([1, 2]), dispatch=st.sampled_from([0, 1, 2, 3, 4]),
       placement=st.sampled_from([PLACEMENT_INNER, PLACEMENT_OUTER]), recompute=st.sampled_from([0, 2]))
def test_two_batch_overlap_never_slows_a_step(h800, mixtral, make_workload, ep, mb, dispatch, placement, recompute):
    work = make_workload(global_batch=64.0, seq_len=4096.0)
    kw = dict(dp=16, ep=ep, mb=mb, dispatch=dispatch, placement=placement, recompute=recompute, n_micro=64 // (16 * mb))
    off = run(mixtral, h800, work, tbo=0, **kw)
    on = run(mixtral, h800, work, tbo=1, **kw)
    assert on["ep_comm_s"] <= off["ep_comm_s"] * (1 + 1e-12)
    assert on["step_time_analytic_s"] <= off["step_time_analytic_s"] * (1 + 1e-12)
    assert on["compute_s"] == pytest.approx(off["compute_s"], rel=1e-12)  # overlap hides comm, not compute


@PROPS
@given(imbalance=st.floats(1.0, 3.0), ep=st.sampled_from([2, 4, 8]), dispatch=st.sampled_from([0, 1, 2, 3, 4]))
def test_routing_imbalance_never_helps(h800, mixtral, make_workload, imbalance, ep, dispatch):
    kw = dict(dp=16, ep=ep, dispatch=dispatch, n_micro=2)
    even = run(mixtral, h800, make_workload(global_batch=32.0, seq_len=4096.0, moe_imbalance=1.0), **kw)
    skew = run(mixtral, h800, make_workload(global_batch=32.0, seq_len=4096.0, moe_imbalance=imbalance), **kw)
    assert skew["step_time_analytic_s"] >= even["step_time_analytic_s"] * (1 - 1e-12)
    assert skew["mem_peak_bytes"] >= even["mem_peak_bytes"] * (1 - 1e-12)


@pytest.mark.parametrize(("ep", "mb"), [(2, 1), (8, 1), (8, 4)])
def test_derived_imbalance_sets_the_busiest_ranks_rows(h800, mixtral, make_workload, ep, mb):
    """Without an override the busiest rank's grouped-GEMM rows are the mean
    times ``routing_imbalance`` of the EP group's micro-batch tokens: Mixtral
    (8 experts, top-2), tp 1, seq 4096: a rank dispatches 4096 mb tokens, the
    group ep * 4096 mb; rows per local expert = ep * 4096 mb * 2 * imbalance / 8.
    A forced balanced gate (moe_imbalance = 1) gives the mean, and is faster."""
    kw = dict(dp=16, ep=ep, mb=mb, n_micro=2)
    derived = run(mixtral, h800, make_workload(global_batch=32.0 * mb, seq_len=4096.0), **kw)
    forced = run(mixtral, h800, make_workload(global_batch=32.0 * mb, seq_len=4096.0, moe_imbalance=1.0), **kw)
    group_tokens = ep * 4096.0 * mb
    imb = routing_imbalance(group_tokens, 8.0, 2.0, float(ep))
    assert imb > 1.0
    assert derived["expert_gemm_rows"] == pytest.approx(group_tokens * 2 * imb / 8, rel=1e-12)
    assert forced["expert_gemm_rows"] == pytest.approx(group_tokens * 2 / 8, rel=1e-12)
    assert derived["step_time_analytic_s"] > forced["step_time_analytic_s"]
    assert derived["mem_peak_bytes"] > forced["mem_peak_bytes"]


def test_full_recompute_replays_the_dispatch(h800, mixtral, make_workload):
    """Full recompute re-runs each MoE layer's forward, dispatch and combine included:
    EP time grows by the forward's share and activation memory falls."""
    work = make_workload(global_batch=32.0, seq_len=4096.0)
    none = run(mixtral, h800, work, dp=16, ep=8, n_micro=2)
    full = run(mixtral, h800, work, dp=16, ep=8, n_micro=2, recompute=RECOMPUTE_FULL)
    assert full["ep_comm_s"] == pytest.approx(1.5 * none["ep_comm_s"], rel=1e-12)  # fwd + bwd + fwd again
    assert full["mem_activations_bytes"] < none["mem_activations_bytes"]
    assert full["step_time_analytic_s"] > none["step_time_analytic_s"]


def test_hierarchical_beats_flat_all_to_all_across_nodes(h800, mixtral, make_workload):
    """EP 8 spread one rank per node (outer placement over 16 x 8 ranks): every
    remote expert is on another node; DeepEP-style dispatch sends each token once
    per node instead of once per rank, so it moves fewer NIC bytes than the flat
    all-to-all (with 8 experts over 8 single-rank nodes both send the same count
    per node, so they tie or hierarchical wins by its link-speed forwarding)."""
    work = make_workload(global_batch=128.0, seq_len=4096.0)
    kw = dict(dp=128, ep=8, placement=PLACEMENT_OUTER, n_micro=1)
    flat = run(mixtral, h800, work, dispatch=DISPATCH_ALLTOALL, **kw)
    hier = run(mixtral, h800, work, dispatch=DISPATCH_HIERARCHICAL, **kw)
    gather = run(mixtral, h800, work, dispatch=DISPATCH_ALLGATHER, **kw)
    assert hier["moe_dispatch_s"] <= flat["moe_dispatch_s"]
    assert hier["moe_dispatch_s"] < gather["moe_dispatch_s"]


@pytest.mark.parametrize("tbo", [0, 1])
def test_moe_row_simulates_like_its_closed_form_with_one_stage(make_workload, tbo):
    """One stage, one micro-batch, no data parallelism (EP over the 8 TP ranks):
    the event engine's step equals the analytic tier's, MoE costs included.
    The engine runs the EP traffic as tasks (forward: compute -> dispatch ->
    experts -> combine; backward: combine's gradient -> experts -> dispatch's
    gradient -> the rest), so without TBO the step is the closed form's sum of
    the parts (nothing else to overlap with), and with TBO the engine's two
    halves expose d + max(0, d - x) + max(0, c - x) + c per pass (halves' d, c,
    x), which is ``two_batch_exposed_s`` the analytic tier adds per layer, times
    the layers (the super-layer is exact for identical layers)."""
    from paraspace.kernels.engine import K_EP
    from paraspace.kernels.event_tier import SIM_OUTPUTS, row_graph, simulate_rows

    device, tiers, tiles = pack_hardware(load_hardware("h800-sxm5-80gb"), "bf16")
    model = pack_model(load_model("mixtral-8x7b"))
    work = make_workload(global_batch=1.0, seq_len=4096.0)
    s = {**BASE, "tp": 8, "sp": 1, "dp": 1, "n_micro": 1, "tbo": tbo}
    cols = columns([s], BASE)
    out = evaluate_rows(*cols, model, device, tiers, tiles, work)
    analytic = dict(zip(OUTPUTS, out[0]))
    assert analytic["ep_comm_s"] > 0
    tokens = np.array([analytic["tokens_per_s_per_gpu"]])
    mfu = np.array([analytic["mfu"]])
    sim = simulate_rows(*cols, model, device, tiers, tiles, work, np.ones(1, bool),
                        np.array([analytic["step_time_analytic_s"]]), tokens, mfu, 4)
    got = dict(zip(SIM_OUTPUTS, sim[0]))
    assert got["simulated"] == 1.0
    assert got["step_time_s"] == pytest.approx(analytic["step_time_analytic_s"], rel=1e-6)
    # one device and one stream of traffic: whatever EP time compute does not cover is exposed
    assert got["ep_exposed_sim_s"] == pytest.approx(analytic["ep_comm_s"], rel=1e-6)
    g = row_graph(*[int(c[0]) for c in cols], model[0], device[0], tiers, tiles, work[0], 4)
    kind = g[2]
    # dispatch and combine, forward and backward, in (1 + tbo) halves each
    assert int((kind == K_EP).sum()) == 4 * (1 + tbo)


def test_bench_moe_runs(capsys):
    """bench/bench_moe.py at a tiny size, so the bench cannot rot."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "bench_moe.py"
    spec = importlib.util.spec_from_file_location("bench_moe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--rows", "2000"])
    assert result["dense"] > 0 and result["moe"] > 0
    assert "MoE / dense rate" in capsys.readouterr().out


def test_dualpipe_overlaps_expert_traffic_with_the_paired_chunk(h800, mixtral, make_workload):
    """DualPipe hides one micro-batch's dispatch/combine behind the paired chunk's
    expert compute: its exposed EP time is at most 1F1B's (and at most TBO's),
    and zero when the expert compute outlasts the traffic."""
    from paraspace.kernels.codes import SCHEDULE_1F1B, SCHEDULE_DUALPIPE

    work = make_workload(global_batch=64.0, seq_len=4096.0)
    for tbo in (0, 1):
        kw = dict(pp=2, dp=8, ep=8, n_micro=8, tbo=tbo)
        one = run(mixtral, h800, work, schedule=SCHEDULE_1F1B, **kw)
        dual = run(mixtral, h800, work, schedule=SCHEDULE_DUALPIPE, **kw)
        assert dual["ep_comm_s"] <= one["ep_comm_s"] * (1 + 1e-12)
        assert dual["moe_dispatch_s"] == one["moe_dispatch_s"]  # the traffic itself is the same
    # DeepSeek-V3 (256 small experts, top-8) with EP 64 spread over 64 nodes: the traffic
    # outlasts the paired expert compute, so part of it stays exposed
    deepseek = pack_model(load_model("deepseek-v3"))
    slow = dict(pp=2, dp=512, ep=64, placement=PLACEMENT_OUTER, n_micro=2)
    work = make_workload(global_batch=1024.0, seq_len=4096.0)
    one = run(deepseek, h800, work, schedule=SCHEDULE_1F1B, **slow)
    dual = run(deepseek, h800, work, schedule=SCHEDULE_DUALPIPE, **slow)
    assert 0 < dual["ep_comm_s"] < one["ep_comm_s"]


@pytest.mark.parametrize("tbo", [0, 1])
def test_dualpipe_row_runs_its_ep_traffic_as_tasks(h800, mixtral, make_workload, tbo):
    """The event tier gives a DualPipe row the whole dispatch/combine as EP
    tasks, like 1F1B's (``kernels.event_tier.row_graph``): the pass durations
    lose the analytic pairing credit's exposed time, so the compute tasks of
    both schedules add up to the same (every stage runs F and B of m
    micro-batches either way, DualPipe's W being part of B), and so does the
    traffic; the engine makes the overlap (``kernels.pipeline.build_step``),
    so the simulated EP exposure is below 1F1B's. The analytic tier keeps its
    credit (``test_dualpipe_overlaps_expert_traffic_with_the_paired_chunk``)."""
    from paraspace.kernels.codes import SCHEDULE_1F1B, SCHEDULE_DUALPIPE
    from paraspace.kernels.engine import K_EP, K_FIRST_COMM, K_OPTIMIZER
    from paraspace.kernels.event_tier import SIM_OUTPUTS, row_graph, simulate_rows

    work = make_workload(global_batch=64.0, seq_len=4096.0)
    graphs = {}
    sims = {}
    for schedule in (SCHEDULE_1F1B, SCHEDULE_DUALPIPE):
        s = {**BASE, "pp": 2, "dp": 8, "ep": 8, "n_micro": 8, "tbo": tbo, "schedule": schedule}
        cols = columns([s], BASE)
        graphs[schedule] = row_graph(*[int(c[0]) for c in cols], mixtral[0], h800[0][0], h800[1], h800[2], work[0], 4)
        out = evaluate_rows(*cols, mixtral, *h800, work)
        analytic = dict(zip(OUTPUTS, out[0]))
        sim = simulate_rows(*cols, mixtral, *h800, work, np.ones(1, bool),
                            np.array([analytic["step_time_analytic_s"]]), np.array([1.0]), np.array([1.0]), 4)
        sims[schedule] = dict(zip(SIM_OUTPUTS, sim[0]))
        assert sims[schedule]["simulated"] == 1.0
    one, dual = graphs[SCHEDULE_1F1B], graphs[SCHEDULE_DUALPIPE]
    assert int(one[0][one[2] == K_EP].sum()) == int(dual[0][dual[2] == K_EP].sum()) > 0
    compute = [int(g[0][(g[2] < K_FIRST_COMM) & (g[2] != K_OPTIMIZER)].sum()) for g in (one, dual)]
    assert abs(compute[0] - compute[1]) <= 2 * 8 * 2 * 2  # ns rounding of each pass
    assert sims[SCHEDULE_DUALPIPE]["ep_exposed_sim_s"] < sims[SCHEDULE_1F1B]["ep_exposed_sim_s"]


def test_fp8_dispatch_moves_a_byte_and_a_scale_per_element(toy_dev, toy_tiles, make_tiers, make_workload):
    """``dispatch_dtype = "fp8"`` (DeepSeek-V3's recipe, DeepEP's FP8 dispatch): a dispatch
    moves 1 + 4/128 = 1.03125 bytes an element against bf16's 2, the combine stays 2. On
    one latency-free tier the all-to-all's time is its bytes over the bandwidth, and a
    dispatch and a combine move the same elements, so the EP time (dispatch + combine,
    forward and backward) is (1.03125 + 2) / (2 + 2) = 0.7578125 of bf16's; nothing else
    changes in time (the local permute passes read the 16-bit tokens either way). The
    staging buffers hold what the dispatch moves at its width: an all-to-all rank's send
    and received rows, 2 x top-2 x imbalance x 128 tokens x 64 elements, at 1.03125 bytes
    instead of 2, so the peak falls by 2 x 2 x imb x 8,192 x 0.96875 bytes (imb = 1.0341,
    the busiest of 2 ranks when 256 tokens route top-2 over 8 experts)."""
    assert params.DISPATCH_BYTES["fp8"] == 1.03125
    hw = (toy_dev, make_tiers((0.0, 100e9, 0.0)), toy_tiles)
    kw = dict(dp=2, ep=2, n_micro=8)
    bf16 = run(toy_moe(), hw, make_workload(global_batch=16.0, seq_len=128.0), **kw)
    fp8 = run(toy_moe(), hw, make_workload(global_batch=16.0, seq_len=128.0,
                                            dispatch_bytes=params.DISPATCH_BYTES["fp8"]), **kw)
    assert bf16["ep_comm_s"] > 0
    assert fp8["ep_comm_s"] == pytest.approx(0.7578125 * bf16["ep_comm_s"], rel=1e-12)
    assert fp8["compute_s"] == pytest.approx(bf16["compute_s"], rel=1e-12)
    imb = routing_imbalance(2 * 128.0, 8.0, 2.0, 2.0)
    assert imb == pytest.approx(1.0341, abs=1e-4)
    assert bf16["mem_peak_bytes"] - fp8["mem_peak_bytes"] == pytest.approx(2 * 2 * imb * 8192 * (2 - 1.03125),
                                                                           rel=1e-9)


def test_staging_buffers_by_hand():
    """``moe.staging_bytes``, DeepSeek-V3's hidden 7,168, 4,096 tokens a rank (29,360,128
    elements), top-8, no imbalance. All-to-all: the rank's tokens at 2 bytes, 58,720,256,
    plus its send and received rows, 2 x 8 x 29,360,128 x 2 = 939,524,096 bytes in BF16 and
    x 1.03125 = 484,442,112 under an FP8 dispatch: 998,244,352 and 543,162,368 bytes.
    Gather-based over EP 8: the gathered 8 x 29,360,128 elements and the 8 x 29,360,128 of
    the rows, 16 x 29,360,128 x 2 = 939,524,096 bytes in BF16, x 1.03125 / 2 under FP8."""
    from paraspace.kernels.codes import DISPATCH_ALLGATHER, DISPATCH_ALLTOALL
    from paraspace.kernels.moe import staging_bytes

    elems = 4096 * 7168
    assert elems == 29_360_128
    assert staging_bytes(DISPATCH_ALLTOALL, elems, 2.0, 2.0, 8.0, 8.0, 1.0) == 998_244_352
    assert staging_bytes(DISPATCH_ALLTOALL, elems, 2.0, 1.03125, 8.0, 8.0, 1.0) == 543_162_368
    assert staging_bytes(DISPATCH_ALLGATHER, elems, 2.0, 2.0, 8.0, 8.0, 1.0) == 939_524_096
    assert staging_bytes(DISPATCH_ALLGATHER, elems, 2.0, 1.03125, 8.0, 8.0, 1.0) == 939_524_096 * 1.03125 / 2


def test_a_space_dispatching_in_fp8_is_faster_only_through_its_ep_traffic():
    """The space setting reaches the kernels: DeepSeek-V3 on H800 with EP groups over
    nodes: every row's dispatch and combine take less time with dispatch_dtype fp8, and
    no row's step is slower."""
    from pathlib import Path

    from paraspace.explorer.evaluate import evaluate, pack
    from paraspace.spaces.catalog import load_space, space_from_raw
    from paraspace.spaces.encode import Encoder

    loaded = load_space("deepseek-v3-h800")
    raw = {**loaded.raw, "dispatch_dtype": "bf16"}
    spaces = {d: space_from_raw({**raw, "dispatch_dtype": d}, "test", Path(".")) for d in ("bf16", "fp8")}
    enc = Encoder(spaces["bf16"]).encode_all()
    pick = np.flatnonzero(enc.columns["ep"] > 8)[:64]
    assert pick.size > 0
    cols = {k: v[pick] for k, v in enc.columns.items()}
    out = {d: evaluate(pack(s), cols) for d, s in spaces.items()}
    assert (out["fp8"]["moe_dispatch_s"] < out["bf16"]["moe_dispatch_s"]).all()
    assert (out["fp8"]["step_time_analytic_s"] <= out["bf16"]["step_time_analytic_s"] * (1 + 1e-12)).all()


def test_every_dispatch_dtype_a_space_accepts_has_its_bytes():
    """One list of dispatch precisions (``spaces.schema.DispatchDtype``), each priced."""
    from typing import get_args

    from paraspace.spaces.schema import DispatchDtype

    assert set(get_args(DispatchDtype)) == set(params.DISPATCH_BYTES)
