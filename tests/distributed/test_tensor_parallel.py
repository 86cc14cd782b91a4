"""Tensor and sequence parallelism on 2 gloo ranks over this machine's loopback: every module at
TP=2 (with and without sequence parallelism, without FP8 and under each recipe) against the
same module on one rank with the full weights (tensor_parallel_cases.py); TE's distributed
helpers; torch.compile of a tensor-parallel module. Each group of checks runs in one pair of
spawned processes."""
import pytest
import torch
import torch.distributed as dist

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.distributed import (allreduce, gather_along_first_dim, get_distributed_rank,
                                                    get_distributed_world_size, reduce_scatter_along_first_dim)
from transformer_engine.pytorch.parallel.gemm_split import GemmSplit
from gloo_ranks import run_on_ranks
import tensor_parallel_cases

CASES = {case.name: case for case in tensor_parallel_cases.cases()}
# The recipes whose casts are the same for a shard as for the whole tensor (per-tensor scales
# agreed over the ranks; MXFP8's 1 x 32 blocks, which the shards here keep whole): TP=2 equals
# TP=1 up to fp32 summation order. Current scaling casts each weight shard with its own amax,
# and Float8BlockScaling's 128 x 128 weight blocks span the shards, as in TE: within FP8's error.
EXACT_CASTS = ("none", "delayed", "mxfp8")


@pytest.fixture(scope="module")
def case_results():
    return run_on_ranks(tensor_parallel_cases.run_all, world=2)


@pytest.mark.parametrize("name", sorted(CASES))
def test_tp2_equals_tp1_with_full_weights(case_results, name):
    case = CASES[name]
    for rank, results in case_results.items():
        result = results[name]
        exact = case.recipe in EXACT_CASTS
        for what, diff, scale in result["checks"]:
            # A floor for gradients that are zero in exact arithmetic (a key bias's, softmax
            # being blind to it), which both sides compute as rounding noise.
            bound = (1e-5 if exact else 0.15) * max(scale, 1e-3)
            assert diff <= bound, f"rank {rank}, {name}: {what} differs by {diff:.3g} (max |expected| {scale:.3g})"
        if exact and case.recipe != "none":
            assert result["scales_agree"], f"{name}: the ranks end the steps with different FP8 scales"
            assert result["scales_match_full"], f"{name}: the scales differ from the one-rank module's"


def _helpers(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    x = torch.randn(4 * world, 6)  # the same on both ranks
    shard = x.chunk(world)[rank].contiguous()
    found = {"world": get_distributed_world_size(), "rank": get_distributed_rank()}
    gathered, handle = gather_along_first_dim(shard, dist.group.WORLD, async_op=True)
    handle.wait()
    found["gather"] = torch.equal(gathered, x)
    summed, _ = reduce_scatter_along_first_dim(x * (rank + 1), dist.group.WORLD)
    found["reduce_scatter"] = torch.equal(summed, (x * sum(range(1, world + 1))).chunk(world)[rank])
    total, _ = allreduce(shard.clone(), dist.group.WORLD)
    found["allreduce"] = torch.equal(total, sum(x.chunk(world)))
    # Quantized gather: per-tensor codes travel, cast with the scale of the group's amax.
    quantizer = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, with_amax_reduction=True,
                                                 amax_reduction_group=dist.group.WORLD)
    whole = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)(x)
    fp8, _ = gather_along_first_dim(shard * 10 ** rank, dist.group.WORLD, quantizer=quantizer)
    scaled = torch.cat([c * 10 ** r for r, c in enumerate(x.chunk(world))])
    whole = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)(scaled)
    found["fp8_gather"] = (torch.equal(fp8._data, whole._data) and torch.equal(fp8._scale_inv, whole._scale_inv))
    # A block-scaled gather of shards of whole blocks is the cast of the whole tensor, bit for bit.
    blocks = te.MXFP8Quantizer(te.DType.kFloat8E4M3)
    x64 = torch.randn(64 * world, 64)
    split = GemmSplit(dist.group.WORLD, "column", True)
    gathered, expected = split.gather_operand(x64.chunk(world)[rank], blocks).finish(), blocks.operand_of(x64)
    found["block_gather"] = all(torch.equal(getattr(getattr(gathered, usage), field),
                                            getattr(getattr(expected, usage), field))
                                for usage in ("rowwise", "columnwise") for field in ("data", "scale_inv"))
    # Sequence parallelism refuses a row GEMM whose tokens do not split over the ranks.
    row = te.Linear(8, 4, parallel_mode="row", tp_size=world, tp_group=dist.group.WORLD, sequence_parallel=True)
    try:
        row(torch.randn(3, 8 // world))
        found["odd_tokens"] = "no error"
    except ValueError as error:
        found["odd_tokens"] = str(error)
    layer = te.TransformerLayer(16, 32, 2, tp_size=world, tp_group=dist.group.WORLD, set_parallel_mode=True,
                                sequence_parallel=True, seq_length=8)
    try:
        layer(torch.randn(8, 1, 16))  # the whole sequence, where this rank's half is expected
        found["seq_length"] = "no error"
    except ValueError as error:
        found["seq_length"] = str(error)
    return found


def test_te_distributed_helpers():
    for rank, found in run_on_ranks(_helpers, world=2).items():
        assert (found["world"], found["rank"]) == (2, rank)
        assert found["gather"] and found["reduce_scatter"] and found["allreduce"], found
        assert found["fp8_gather"], "the gathered FP8 codes and scale are those of the whole tensor"
        assert found["block_gather"], "the gathered MXFP8 codes and block scales are those of the whole tensor"
        assert "3" in found["odd_tokens"] and "2 ranks" in found["odd_tokens"], found["odd_tokens"]
        assert "8 // 2" in found["seq_length"] and "(8, 1, 16)" in found["seq_length"], found["seq_length"]


def _compiled(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    found = {}
    for mode, sp in (("column", True), ("row", True), ("column", False), ("row", False)):
        module = te.Linear(32, 16, parallel_mode=mode, tp_size=world, tp_group=dist.group.WORLD, sequence_parallel=sp)
        x = torch.randn(8, 32 // world if mode == "row" else 32, requires_grad=True)
        y = module(x)
        y.sum().backward()
        grads = (x.grad.clone(), module.weight.grad.clone())
        x.grad = module.weight.grad = None
        compiled = torch.compile(module, fullgraph=True)
        y_compiled = compiled(x)
        y_compiled.sum().backward()
        found[(mode, sp)] = (torch.equal(y, y_compiled) and torch.equal(grads[0], x.grad)
                             and torch.equal(grads[1], module.weight.grad))
    return found


def test_compile_fullgraph_equals_eager_over_ranks():
    for found in run_on_ranks(_compiled, world=2).values():
        assert all(found.values()), found


def _delayed_backward_update(rank: int, world: int) -> dict:
    """Two FP8 steps of a Linear whose ranks see different gradients, its amaxes reduced over
    both ranks, then over a group of this rank alone: the backward update reduces over the
    forward autocast's amax_reduction_group (so the backward scales agree only in the first)."""
    own = [dist.new_group([r]) for r in range(world)][rank]  # every rank makes every group
    found = {}
    for label, group in (("world", dist.group.WORLD), ("own", own)):
        torch.manual_seed(0)
        module = te.Linear(16, 8)
        for _ in range(2):
            with te.autocast(recipe=recipe.DelayedScaling(), amax_reduction_group=group):
                y = module(torch.randn(4, 16))
            (y * (rank + 1) * 100).sum().backward()
        found[label] = module.fp8_meta["scaling_bwd"].scale.tolist()
    return found


def test_delayed_scaling_backward_amaxes_reduced_over_the_forward_group():
    results = run_on_ranks(_delayed_backward_update, world=2)
    assert results[0]["world"] == results[1]["world"]
    assert results[0]["own"] != results[1]["own"]


def _overlap_and_serial(rank: int, world: int) -> dict:
    """Sequence-parallel Linears (column: input gathered with this rank's rows multiplied while
    the others travel, re-gathered beside the dgrad GEMM, dgrad reduce-scattered beside the
    wgrad GEMM; row: output gradient gathered the same way in the backward), without FP8 and
    under per-tensor and MXFP8 recipes, against the same with every collective waited for where
    it is issued."""
    from transformer_engine.pytorch.module import _linear_function
    from transformer_engine.pytorch.parallel import collectives, gemm_split

    recipes = {"none": None, "delayed": recipe.DelayedScaling(), "mxfp8": recipe.MXFP8BlockScaling()}

    def step(fp8_recipe):
        torch.manual_seed(0)
        kwargs = dict(tp_size=world, tp_group=dist.group.WORLD, sequence_parallel=True, params_dtype=torch.bfloat16)
        column = te.Linear(64, 64, parallel_mode="column", **kwargs)
        row = te.Linear(64, 64, parallel_mode="row", **kwargs)
        x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)  # this rank's 32 tokens
        with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
            y = row(column(x))  # [32 * world, 32] between them, [32, 64] out
        (y.float() * torch.randn(32, 64)).sum().backward()
        return (y, x.grad, column.weight.grad, column.bias.grad, row.weight.grad, row.bias.grad)

    def serial(gather):
        def waited_at_issue(self, *args):
            gathered = gather(self, *args)
            whole = gathered.finish()
            return gemm_split.GatheredRows(gathered.own, lambda: whole)
        return waited_at_issue

    overlapped = {name: step(r) for name, r in recipes.items()}
    patches = {(_linear_function, "all_gather"): lambda t, g: collectives.wait(collectives.all_gather(t, g)),
               (gemm_split.GemmSplit, "reduce_grad_input"):
                   lambda self, dgrad, reduce=gemm_split.GemmSplit.reduce_grad_input: collectives.wait(reduce(self, dgrad)),
               (gemm_split.GemmSplit, "gather_rows"): serial(gemm_split.GemmSplit.gather_rows),
               (gemm_split.GemmSplit, "gather_operand"): serial(gemm_split.GemmSplit.gather_operand)}
    originals = {key: getattr(*key) for key in patches}
    for (owner, name), patched in patches.items():
        setattr(owner, name, patched)
    try:
        waited = {name: step(r) for name, r in recipes.items()}
    finally:
        for (owner, name), original in originals.items():
            setattr(owner, name, original)
    found = {name: all(torch.equal(a, b) for a, b in zip(overlapped[name], waited[name])) for name in recipes}
    # The order: this rank's rows, then the wait, then the other rank's rows; joined in rank order.
    split, order = GemmSplit(dist.group.WORLD, "column", True), []
    own = torch.arange(6.0).reshape(3, 2) + 10 * rank
    gathered = gemm_split.GatheredRows(own, lambda: order.append("wait") or split.gather(own))
    y, _ = split.gemm_gathered(gathered, lambda rows: order.append(rows[0, 0].item()) or rows * 2)
    found["order"] = order
    found["joined"] = torch.equal(y, 2 * torch.cat([torch.arange(6.0).reshape(3, 2) + 10 * r for r in range(world)]))
    return found


def test_overlapped_collectives_give_the_same_bits_as_serial_ones():
    for rank, found in run_on_ranks(_overlap_and_serial, world=2).items():
        for name in ("none", "delayed", "mxfp8"):
            assert found[name], f"rank {rank}, {name}: overlapped and waited-for collectives give different bits"
        assert found["order"] == [10.0 * rank, "wait", 10.0 * (1 - rank)], found["order"]
        assert found["joined"]
