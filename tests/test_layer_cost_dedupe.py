"""The analytic tier's grouped path equals its per-row path, bit for bit.

``kernels.training.evaluate_rows`` computes each distinct layer key's costs
(``kernels.layer_costs``) and each distinct step key's DP sync and optimizer
step once and hands every row its groups' numbers; ``evaluate_one`` computes
everything for one row. On random rows of every catalog space with every
strategy dimension widened, and on rows mixed so that each key meets many
values of every other column, both give the same bits. ``group_rows`` is
checked against a dictionary, the bottleneck's reuse of a middle stage
against passing every stage, and the event tier's columns of a chunk it
simulates no row of (``explorer.evaluate.unsimulated``) against
``simulate_rows``.
"""

from __future__ import annotations


import numpy as np
import pytest

from paraspace.explorer.evaluate import KERNEL_ARGS, analytic, pack, unsimulated
from paraspace.kernels.event_tier import DEFAULT_BUCKETS, SIM_OUTPUTS, simulate_rows
from paraspace.kernels.row_groups import MAX_KEY_COLUMNS, group_rows
from paraspace.kernels.stage_pass import bottleneck_s, stage_pass_s
from paraspace.kernels.training import N_COST, N_OUT, OUTPUTS, evaluate_one, evaluate_rows
from paraspace.spaces import catalog
from widened import SPACES, wide

#: columns that shape one layer's operators (what a layer group shares) and what
#: the step's DP sync and optimizer read (a step group's); the mixed rows take
#: these from one row and every other column from another
LAYER_SHAPE = ("tp", "cp", "micro_batch", "recompute", "sequence_parallel", "tp_overlap", "offload_activations",
               "offload_weights", "ep", "expert_tp", "ep_placement", "dispatch", "tbo")
STEP_SHAPE = ("tp", "pp", "dp", "cp", "zero", "optimizer", "schedule", "ep", "expert_tp", "ep_placement")


def valid_rows(name: str, seed: int, tries: int = 20000) -> dict[str, np.ndarray]:
    """The valid ones among ``tries`` random combinations of the widened space."""
    encoder, _ = wide(name)
    ids = np.unique(np.random.default_rng(seed).integers(0, encoder.n_combinations, tries))
    cols = encoder.encode_ids(ids).columns
    assert len(cols["tp"]) > 50, name
    return {k: np.ascontiguousarray(cols[k]) for k in KERNEL_ARGS}


def mixed(cols: dict[str, np.ndarray], shape: tuple[str, ...], seed: int, donors: int = 30,
          per_donor: int = 20) -> dict[str, np.ndarray]:
    """Rows whose ``shape`` columns come from one of ``donors`` rows and every other
    column from a random row: each donor's key meets many values of the rest."""
    rng = np.random.default_rng(seed)
    n = len(cols["tp"])
    donor = np.repeat(rng.integers(0, n, donors), per_donor)
    other = rng.integers(0, n, donors * per_donor)
    return {k: np.ascontiguousarray(cols[k][donor if k in shape else other]) for k in KERNEL_ARGS}


def per_row(cols: dict[str, np.ndarray], packed) -> np.ndarray:
    """``evaluate_one`` on each row: (rows, N_OUT)."""
    out = np.empty((len(cols["tp"]), N_OUT))
    for i in range(out.shape[0]):
        evaluate_one(*(cols[k][i] for k in KERNEL_ARGS), packed.model[0], packed.device[0], packed.tiers,
                     packed.tiles, packed.workload[0], out[i])
    return out


def assert_same_bits(got: np.ndarray, want: np.ndarray, cols: dict[str, np.ndarray]) -> None:
    same = np.ascontiguousarray(got).view(np.int64) == np.ascontiguousarray(want).view(np.int64)
    if not same.all():
        i, j = np.argwhere(~same)[0]
        row = {k: int(cols[k][i]) for k in KERNEL_ARGS}
        raise AssertionError(f"{OUTPUTS[j]}: grouped {got[i, j]!r}, per row {want[i, j]!r} on {row}")


@pytest.mark.parametrize("name", SPACES)
def test_grouped_rows_equal_per_row_on_widened_spaces(name):
    """Random valid rows (every schedule, recompute mode, optimizer, offload, ZeRO stage,
    dispatch, sizes) and rows mixed around 30 layer keys and 30 step keys."""
    _, packed = wide(name)
    cols = valid_rows(name, seed=sum(map(ord, name)))
    for batch in (cols, mixed(cols, LAYER_SHAPE, seed=1), mixed(cols, STEP_SHAPE, seed=2)):
        got = evaluate_rows(*(batch[k] for k in KERNEL_ARGS), packed.model, packed.device, packed.tiers,
                            packed.tiles, packed.workload)
        assert got.shape == (len(batch["tp"]), N_OUT)
        assert_same_bits(got, per_row(batch, packed), batch)


def test_grouping_is_invisible_in_any_order_and_chunking():
    """A row's outputs do not depend on which rows share its chunk or where it stands."""
    name = "deepseek-v3-h800"
    _, packed = wide(name)
    cols = valid_rows(name, seed=7)
    args = (packed.model, packed.device, packed.tiers, packed.tiles, packed.workload)
    whole = evaluate_rows(*(cols[k] for k in KERNEL_ARGS), *args)
    order = np.random.default_rng(3).permutation(len(cols["tp"]))
    shuffled = evaluate_rows(*(np.ascontiguousarray(cols[k][order]) for k in KERNEL_ARGS), *args)
    assert_same_bits(shuffled, whole[order], cols)
    for i in order[:5]:
        one = evaluate_rows(*(cols[k][i:i + 1] for k in KERNEL_ARGS), *args)
        assert_same_bits(one, whole[i:i + 1], cols)


def test_no_rows():
    _, packed = wide("llama3-8b-h100-64")
    cols = {k: v[:0] for k, v in valid_rows("llama3-8b-h100-64", seed=0).items()}
    out = evaluate_rows(*(cols[k] for k in KERNEL_ARGS), packed.model, packed.device, packed.tiers, packed.tiles,
                        packed.workload)
    assert out.shape == (0, N_OUT)


def reference_groups(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Groups numbered by first appearance, with a dictionary."""
    number: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    group = []
    for i, key in enumerate(map(tuple, keys.tolist())):
        if key not in number:
            number[key] = len(first)
            first.append(i)
        group.append(number[key])
    return np.array(group, dtype=np.int64), np.array(first, dtype=np.int64)


@pytest.mark.parametrize(("rows", "columns", "high"), [
    (0, 3, 5), (1, 1, 5), (1000, 3, 3), (20000, 10, 6), (5000, 15, 100), (3000, MAX_KEY_COLUMNS, 2**31 - 1),
    (4000, 2, 1),
])
def test_group_rows_numbers_groups_by_first_row(rows, columns, high):
    """Few groups in long runs, as many groups as rows (the table grows past its first 32),
    keys as large as an int32 holds, one group only."""
    rng = np.random.default_rng(rows + columns)
    keys = rng.integers(0, high, (rows, columns), endpoint=True).astype(np.int32)
    keys = np.repeat(keys, rng.integers(1, 4, rows), axis=0)  # runs of one key, as the encoder makes them
    group, first = group_rows(keys)
    want_group, want_first = reference_groups(keys)
    np.testing.assert_array_equal(group, want_group)
    np.testing.assert_array_equal(first, want_first)


def test_group_rows_refuses_keys_wider_than_its_mix():
    with pytest.raises(ValueError, match="MAX_KEY_COLUMNS"):
        group_rows(np.zeros((2, MAX_KEY_COLUMNS + 1), dtype=np.int32))


@pytest.mark.parametrize("pp", [1, 2, 3, 5, 7, 8, 13, 32, 61])
@pytest.mark.parametrize("recompute", [0, 2])
def test_bottleneck_reuses_a_middle_stage_only_where_it_passes_the_same(deepseek_v3_like, pp, recompute):
    """``bottleneck_s`` skips a middle stage with the previous one's layers; passing every
    stage with ``stage_pass_s`` gives the same bits (uneven splits, dense layers first)."""
    model = deepseek_v3_like
    costs = np.random.default_rng(pp).uniform(1e-4, 1e-2, N_COST)
    bn = bottleneck_s(pp, model, costs, recompute, 3)
    t_max, t_sum, at = -1.0, 0.0, 0
    for stage in range(pp):
        f, b, *_ = stage_pass_s(stage, pp, model, costs, recompute, 3)
        t_sum += f + b
        if f + b > t_max:
            t_max, at = f + b, stage
    f, b, w, rc, tp, ep, off, cp = stage_pass_s(at, pp, model, costs, recompute, 3)
    assert (bn.t_max, bn.t_sum, bn.fwd, bn.bwd, bn.wgrad, bn.rc, bn.tp, bn.ep, bn.off) == \
        (t_max, t_sum, f, b, w, rc, tp, ep, off)


@pytest.fixture(scope="module")
def deepseek_v3_like():
    """DeepSeek-V3's record with 61 layers, the first 3 dense: uneven splits on most pp."""
    return pack(catalog.load_space("deepseek-v3-h800")).model[0]


def test_unsimulated_columns_are_simulate_rows_with_no_row_selected():
    """``evaluate`` skips the event tier's pass over a chunk it simulates nothing of
    (``--no-simulate``, the sweep's first pass) and fills its columns as that pass would."""
    _, packed = wide("deepseek-v3-h800")
    cols = valid_rows("deepseek-v3-h800", seed=11)
    metrics = analytic(packed, cols)
    tokens, mfu = metrics["tokens_per_s_per_gpu"].copy(), metrics["mfu"].copy()
    sim = simulate_rows(*(cols[k] for k in KERNEL_ARGS), packed.model, packed.device, packed.tiers, packed.tiles,
                        packed.workload, np.zeros(len(cols["tp"]), dtype=bool), metrics["step_time_analytic_s"],
                        tokens, mfu, DEFAULT_BUCKETS)
    got = unsimulated(metrics["step_time_analytic_s"])
    assert list(got) == list(SIM_OUTPUTS)
    for i, name in enumerate(SIM_OUTPUTS):
        assert got[name].dtype == sim.dtype and got[name].flags.c_contiguous, name
        np.testing.assert_array_equal(got[name].view(np.int64), np.ascontiguousarray(sim[:, i]).view(np.int64), name)
    assert np.array_equal(tokens, metrics["tokens_per_s_per_gpu"]) and np.array_equal(mfu, metrics["mfu"])
