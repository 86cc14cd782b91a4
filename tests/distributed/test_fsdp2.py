"""FSDP2 (torch.distributed.fsdp.fully_shard) over te modules on 2 gloo ranks over this
machine's loopback (fsdp2_cases.py): data-parallel training of the sharded module equals
training it unsharded, without FP8 and under each recipe; FP8 weights (te.quantized_model_init)
whose all-gather moves their FP8 codes and gathers a quantized weight; deferred ("meta")
initialisation through reset_parameters; te.optimizers.FusedAdam over DTensor parameters;
MixedPrecisionPolicy's bf16 training of fp32 weights.
One pair of spawned processes runs every case."""
import pytest

import fsdp2_cases
from gloo_ranks import run_on_ranks

CASES = {case.name: case for case in fsdp2_cases.cases()}
# Current scaling and NVFP4 cast each rank's activations and gradients with that rank's own
# amax, the one-rank run with the whole batch's: the two differ within the format's error.
# Every other recipe casts alike on both sides (scales reduced over the ranks, or blocks within
# one rank's tokens), so that the runs differ by the order of fp32 sums only.
INEXACT = ("current", "nvfp4")
FP8_CLASS = {"delayed": "Float8Tensor", "current": "Float8Tensor", "mxfp8": "MXFP8Tensor",
             "block": "Float8BlockwiseQTensor", "nvfp4": "NVFP4Tensor"}
# What one FP8 weight's shard sends: per-tensor codes (the scale is metadata); MXFP8's codes and
# E8M0 scales of both usages; Float8BlockScaling's 128 x 128 codes and fp32 scales, one copy
# serving both usages; NVFP4's codes and E4M3 scales (as bytes) of both usages.
ALL_GATHER_INPUTS = {"delayed": ["torch.uint8"], "current": ["torch.uint8"], "mxfp8": ["torch.uint8"] * 4,
                     "block": ["torch.uint8", "torch.float32"], "nvfp4": ["torch.uint8"] * 4}
FUSED_ADAM_STATES = {"exp_avg": "torch.float32", "exp_avg_sq": "torch.float32"}


@pytest.fixture(scope="module")
def results():
    return run_on_ranks(fsdp2_cases.run_all, world=2)


def _bound(case, what: str, scale: float) -> float:
    """How far a loss or parameter of the sharded run may be from the one-rank run's."""
    if case.recipe in INEXACT:
        return (1e-3 if "loss" in what else 0.1) * max(scale, 1e-3)
    if case.optimizer is not None and "loss" not in what:
        # Adam's step is ~lr where a gradient is ~0, and there fp32 rounding moves it: within
        # a hundredth of lr (1e-3).
        return 1e-5
    return 1e-5 * max(scale, 1e-3)


@pytest.mark.parametrize("name", sorted(CASES))
def test_sharded_training_equals_unsharded(results, name):
    case = CASES[name]
    for rank, found in results.items():
        result = found[name]
        for what, diff, scale in result["checks"]:
            bound = _bound(case, what, scale)
            assert diff <= bound, f"rank {rank}, {name}: {what} differs by {diff:.3g} (max |expected| {scale:.3g})"
        if not case.fp8_weights:
            assert result["local_classes"] == ["Tensor"], result["local_classes"]
            continue
        fp8_class = FP8_CLASS[case.recipe]
        assert result["local_classes"] == sorted([fp8_class, "Tensor"]), f"the shards: {result['local_classes']}"
        gathered = result["gathered"]
        assert gathered["classes"] and set(gathered["classes"].values()) == {fp8_class}, gathered["classes"]
        assert gathered["codes_match"], f"{name}: the gathered FP8 codes are not the unsharded weights'"
        for weight, dtypes in result["all_gather_inputs"].items():
            assert dtypes == ALL_GATHER_INPUTS[case.recipe], f"{name}: {weight}'s shard sends {dtypes}"


MIXED_PRECISION_CASES = [f"mixed-bf16-{module}-{rec}" for module in fsdp2_cases.MIXED_PRECISION_MODULES
                         for rec in ("none", "delayed")]


@pytest.mark.parametrize("name", MIXED_PRECISION_CASES)
def test_mixed_precision_training_equals_bf16_steps_of_fp32_weights(results, name):
    """FSDP2's MixedPrecisionPolicy (bf16 computation, fp32 gradient reduction and weights)
    over te modules: bf16 outputs, fp32 weights, and training within bf16's rounding of the
    gradients of the one-rank run it stands for (each rank's half-batch gradients rounded to
    bf16 and summed in fp32, against the whole batch's rounded once): parameters, which the 3
    steps move by about 1e-3, within 5e-5; losses within 1e-4 of their size (5 and 9 times the
    largest differences measured on 2 ranks: 9.2e-6, and 1.1e-5 of a loss). A computation in
    fp32 stays within these too: the dtypes tell it."""
    for rank, found in results.items():
        result = found[name]
        assert result["dtypes"] == ["torch.bfloat16", "torch.float32"], result["dtypes"]
        for what, diff, scale in result["checks"]:
            bound = 1e-4 * scale if "loss" in what else 5e-5
            assert diff <= bound, f"rank {rank}, {name}: {what} differs by {diff:.3g} (max |expected| {scale:.3g})"


@pytest.mark.parametrize("name", ["hooks-Float8Tensor-uneven-shards", "hooks-MXFP8Tensor",
                                  "hooks-Float8BlockwiseQTensor", "hooks-MXFP8Tensor-HSDP-shards-of-one-rank",
                                  "hooks-NVFP4Tensor-16x16", "hooks-NVFP4Tensor-1x16",
                                  "hooks-NVFP4Tensor-HSDP-shards-of-one-rank"])
def test_all_gather_of_a_quantized_parameter(results, name):
    """Per-tensor codes over shards of unequal sizes (FSDP2 pads the last one), block-scaled
    codes over shards of whole blocks, and over HSDP's one-rank shard groups (the tensors
    packed into one), gather into the whole tensor's codes and scales."""
    expected = name.split("-")[1]
    for found in results.values():
        result = found[name]
        assert (result["shard"], result["gathered"]) == (expected, expected), result
        assert result["codes_match"], result


def test_block_scaled_shards_must_be_whole_blocks(results):
    """MXFP8 rows [96] over 2 ranks: 48-row shards, not whole 32-row column-wise blocks."""
    for found in results.values():
        error = found["hooks-MXFP8Tensor-not-whole-blocks"]["error"]
        assert error is not None and "48 rows" in error and "(32, 1)" in error and "(96, 64)" in error, error


def test_nvfp4_shards_must_be_whole_blocks(results):
    """NVFP4 rows [48] over 2 ranks: 24-row shards, not whole 16-row column-wise blocks."""
    for found in results.values():
        error = found["hooks-NVFP4Tensor-not-whole-blocks"]["error"]
        assert error is not None and "24 rows" in error and "16 rows" in error and "(48, 32)" in error, error


def test_shards_written_before_the_first_gather_are_cast_again_at_one_scale(results):
    """A current-scaling weight written shard by shard before FSDP2 ever gathered it: each
    shard was cast with its own amax, and the first all-gather brings them to one scale (the
    ranks' gathered scales are equal; the values are the whole weight's within FP8's error,
    not those of codes read under another rank's scale)."""
    for found in results.values():
        result = found["hooks-Float8Tensor-written-before-gather"]
        assert result["gathered"] == "Float8Tensor" and result["scales_agree"], result
        assert result["relative_error"] < 0.07, result


@pytest.mark.parametrize("variant", sorted(fsdp2_cases.FUSED_ADAM_PARAMS))
def test_fused_adam_over_dtensors_equals_unsharded(results, variant):
    """FusedAdam's steps of each shard are the whole parameter's, bit for bit; its states are
    DTensors, in their dtypes."""
    rec, _, options = fsdp2_cases.FUSED_ADAM_PARAMS[variant]
    expected = dict(FUSED_ADAM_STATES)
    if options.get("master_weights"):
        expected["master_param"] = "torch.int16" if options.get("store_param_remainders") else "torch.float32"
    for rank, found in results.items():
        result = found[f"FusedAdam-dtensor-{variant}"]
        assert result["diff"] == 0.0, f"rank {rank}, {variant}: the sharded steps differ by {result['diff']:.3g}"
        assert result["shard"] == (FP8_CLASS[rec] if rec else "Tensor"), result["shard"]
        assert result["states"] == {key: ("DTensor", dtype) for key, dtype in expected.items()}, result["states"]


def test_prepare_te_modules_for_fsdp(results):
    """FSDP1: the wrapped te module gets its unit's process group; FP8 weights and a root not
    wrapped in FullyShardedDataParallel are refused."""
    for found in results.values():
        result = found["prepare_te_modules_for_fsdp"]
        assert result["group_set"] and result["trained"], result
        assert result["fp8_weights"] and "te.quantized_model_init" in result["fp8_weights"], result
        assert result["unwrapped"] and "FullyShardedDataParallel" in result["unwrapped"], result


def test_checkpoint_of_fp8_weights(results):
    """torch.distributed.checkpoint: an asynchronous save of sharded FP8 weights loads into a
    fresh sharded module that computes the same outputs, its weights still FP8."""
    for found in results.values():
        result = found["checkpoint-fp8-weights-current"]
        assert result["shard"] == "Float8Tensor" and result["output_diff"] == 0.0, result
