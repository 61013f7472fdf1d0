"""What a ZeRO-3 device stores of its own parameter shard (``SpaceSpec.zero3_shard``).

DeepSpeed's ZeRO-3 partitions the 16-bit parameters and keeps the optimizer's fp32 master
partition beside them: weights 2 + gradients 4 + Adam 12 (master, m, v) = 18 bytes a
parameter of the shard ("16-bit", the default). PyTorch FSDP's mixed precision keeps the
sharded parameters in fp32, updates them in place and casts them to 16 bits only as it
gathers them (FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16)``; FSDP1 frees its
low-precision shard after each gather): the master is the shard, 16 bytes ("master").
``validate`` reads ZeRO-3 rows as FSDP trainers' (``validate.FULLY_SHARDED``), unless their
notes name DeepSpeed: NeMo Automodel's Kimi K2 on 256 H100 and Qwen3-30B-A3B on 8 were
priced out of memory by the 2 bytes (90.3 and 89.6 GB against the 85.9 GB of an 80 GiB
card) though they ran."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_cross_entropy_memory import sweep_one
from test_memory_variants import P_8B, PROPS, candidates, run
from test_validate import ROW

from paraspace.explorer import validate
from paraspace.kernels import params
from paraspace.kernels.codes import (
    OPTIMIZER_ADAM,
    OPTIMIZER_ADAM_8BIT,
    OPTIMIZER_ADAM_8BIT_PAGED,
    OPTIMIZER_ADAM_BF16,
    OPTIMIZER_ADAM_NO_MASTER,
    OPTIMIZER_CPU_ADAM,
    ZERO_3_DEFERRED,
)
from paraspace.kernels.optimizer import OPT_DEVICE_MASTER

#: one Llama 3 8B layer: q and o 4,096 x 4,096 (16,777,216 each), k and v 4,096 x 1,024
#: (4,194,304 each), the SwiGLU's three 4,096 x 14,336 (176,160,768), two norms of 4,096
LAYER_8B = 2 * 16_777_216 + 2 * 4_194_304 + 176_160_768 + 2 * 4_096


@pytest.fixture(scope="module")
def llama(h100, llama3_8b, make_workload):
    """Llama 3 8B on H100s, bf16 weights, fp32 gradients, Adam's 12 state bytes; per shard."""
    return {shard: (llama3_8b, h100.device, h100.tiers, h100.tiles,
                    make_workload(global_batch=64.0, zero3_master_shard=shard)) for shard in (0.0, 1.0)}


@pytest.mark.parametrize("zero", [3, ZERO_3_DEFERRED])
@pytest.mark.parametrize("d", [8, 64])
def test_an_fsdp_shard_is_the_fp32_master_alone(llama, zero, d):
    """Adam on d ranks, ZeRO-3: the 16-bit storage holds its own shard, 2 x P / d bytes,
    and the two gathered layers, 2 x 2 x 218,112,000 = 872,448,000 bytes; the master
    storage only the gathered layers: 2 x 8,030,261,248 / 8 = 2,007,565,312 bytes fewer
    at d = 8 (16 bytes a parameter of the shard against 18). Gradients, optimizer
    states, activations and the step time do not change."""
    assert LAYER_8B == 218_112_000 and 2 * P_8B // 8 == 2_007_565_312
    bf16, master = (run(*llama[shard], dp=d, zero=zero, opt=OPTIMIZER_ADAM) for shard in (0.0, 1.0))
    assert master["mem_weights_bytes"] == pytest.approx(2 * 2 * LAYER_8B, rel=1e-14)
    assert bf16["mem_weights_bytes"] - master["mem_weights_bytes"] == pytest.approx(2 * P_8B / d, rel=1e-12)
    for key in ("mem_grads_bytes", "mem_optimizer_bytes", "mem_activations_bytes", "step_time_analytic_s"):
        assert master[key] == bf16[key], key
    assert bf16["mem_peak_bytes"] - master["mem_peak_bytes"] == pytest.approx(2 * P_8B / d, rel=1e-12)


def test_only_optimizers_with_a_device_master_drop_the_16_bit_shard(llama):
    """adam and adam-8bit keep an fp32 master on the device; cpu-adam keeps it on the host
    (the device holds the 16-bit shard the host's master is copied to), and adam-no-master,
    adam-8bit-paged and adam-bf16 have none (they update the 16-bit shard in place): their
    weights do not depend on the storage."""
    assert [OPT_DEVICE_MASTER[o] for o in (OPTIMIZER_ADAM, OPTIMIZER_ADAM_8BIT)] == [1.0, 1.0]
    for opt in (OPTIMIZER_ADAM, OPTIMIZER_ADAM_8BIT, OPTIMIZER_CPU_ADAM, OPTIMIZER_ADAM_NO_MASTER,
                OPTIMIZER_ADAM_8BIT_PAGED, OPTIMIZER_ADAM_BF16):
        bf16, master = (run(*llama[shard], dp=8, zero=3, opt=opt)["mem_weights_bytes"] for shard in (0.0, 1.0))
        assert (master < bf16) == bool(OPT_DEVICE_MASTER[opt]), opt


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_below_zero3_the_storage_changes_nothing(llama, zero):
    """ZeRO-0 to 2 keep every 16-bit weight on every rank: the setting names a ZeRO-3 shard only."""
    bf16, master = (run(*llama[shard], dp=8, zero=zero, opt=OPTIMIZER_ADAM) for shard in (0.0, 1.0))
    assert bf16 == master


def test_the_default_is_deepspeeds_16_bit_shard():
    from paraspace.spaces.schema import SpaceSpec

    assert SpaceSpec.model_fields["zero3_shard"].default == "16-bit"
    assert params.DEFAULTS["zero3_master_shard"] == 0.0


@pytest.mark.parametrize(("zero", "shard"), [("3", "master"), ("2", "16-bit"), ("1", "16-bit"), ("0", "16-bit")])
def test_validate_reads_zero3_rows_as_fsdp_shards(zero, shard):
    """No column names the trainer; ZeRO-3 rows are read as FSDP trainers' (as their
    checkpoint is: ``tests/test_checkpoint_early_stop.py``)."""
    row = {**ROW, "zero": zero, "attention": "flash2", "head_dim": "", "qk_nope_head_dim": "", "v_head_dim": ""}
    assert validate.training_space(row, "test.csv")[0].spec.zero3_shard == shard


def test_sweep_with_the_master_shard_needs_less_memory(tmp_path):
    """End to end: Llama 3 8B on 8 H100 with ZeRO-3 through ``paraspace sweep`` with either
    storage: the master one's rows hold 2 x 8,030,261,248 / 8 bytes fewer weights."""
    weights = {kind: sweep_one(tmp_path, "zero3_shard", kind, "full")["mem_weights_bytes"][0]
               for kind in ("16-bit", "master")}
    assert weights["16-bit"] - weights["master"] == pytest.approx(2 * P_8B / 8, rel=1e-12)


def test_a_zero3_row_whose_notes_name_deepspeed_is_read_as_deepspeeds():
    """Narayanan et al.'s ZeRO-3 rows say "DeepSpeed ZeRO-3 without model parallelism": the
    trainer is named, so they keep DeepSpeed's 16-bit partition beside the master and its
    reentrant checkpoint (the whole forward again), where an FSDP trainer's row stores the
    master alone and stops early. The name is read from the notes, not the source."""
    assert validate.deepspeed_trainer("DeepSpeed ZeRO-3 without model parallelism; recompute not stated")
    assert not validate.deepspeed_trainer("PyTorch FSDP FULL_SHARD (Composer); MFU 41.25%")
    base = {**ROW, "zero": "3", "recompute": "full", "attention": "flash2", "head_dim": "", "qk_nope_head_dim": "",
            "v_head_dim": ""}
    deepspeed = validate.training_space({**base, "notes": "DeepSpeed ZeRO-3 without model parallelism"}, "t")[0]
    fsdp = validate.training_space({**base, "notes": "PyTorch FSDP FULL_SHARD"}, "t")[0]
    assert (deepspeed.spec.zero3_shard, deepspeed.spec.checkpoint) == ("16-bit", "reentrant")
    assert (fsdp.spec.zero3_shard, fsdp.spec.checkpoint) == ("master", "early-stop")


@PROPS
@given(s=candidates(), zero=st.sampled_from([3, ZERO_3_DEFERRED]),
       opt=st.sampled_from([OPTIMIZER_ADAM, OPTIMIZER_ADAM_8BIT, OPTIMIZER_CPU_ADAM, OPTIMIZER_ADAM_NO_MASTER,
                            OPTIMIZER_ADAM_8BIT_PAGED, OPTIMIZER_ADAM_BF16]))
def test_the_master_shard_only_ever_takes_the_16_bit_shard_off(h100, llama3_8b, make_workload, s, zero, opt):
    """Any ZeRO-3 strategy and optimizer: the master storage's peak is at most the 16-bit
    one's, lower by at most the whole 16-bit shard (2 x P / (d x c): a pipeline stage's
    share is less) and lower at all only with an optimizer that keeps its master on the
    device (every stage holds more than the two gathered layers of Llama 3 8B's 32 at p <= 4);
    every time column is the same (the memory columns are the peak stage's, which may move)."""
    s = {**s, "zero": zero, "opt": opt, "off_act": 0}
    work = {shard: make_workload(global_batch=float(s["dp"] * s["mb"] * s["n_micro"]), seq_len=2048.0,
                                 zero3_master_shard=shard) for shard in (0.0, 1.0)}
    bf16, master = (run(llama3_8b, h100.device, h100.tiers, h100.tiles, work[k], base=s) for k in (0.0, 1.0))
    saved = bf16["mem_peak_bytes"] - master["mem_peak_bytes"]
    assert 0.0 <= saved <= 2 * P_8B / (s["dp"] * s["cp"]) * (1 + 1e-12)
    assert (saved > 0.0) == bool(OPT_DEVICE_MASTER[opt])
    for key, value in bf16.items():
        if not key.startswith("mem_") and key not in ("feasible", "infeasible_reason"):
            assert master[key] == value, key
