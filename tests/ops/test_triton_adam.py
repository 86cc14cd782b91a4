"""The Triton multi-tensor Adam step (transformer_engine/pytorch/triton/adam.py) against the
reference: on CUDA tensors where a GPU is present, else on CPU tensors in Triton's interpreter
(conftest.py). Every param / grad dtype pairing, with and without masters, AdamW and L2 Adam,
both branches of PyTorch's lerp, no bias correction, grad scaling; tensors spanning several
chunks, empty tensors and lists, unaligned views into a flat buffer next to aligned tensors
(two launches), non-contiguous grads; the caller's tensors updated in place; the chunk table;
that the op dispatches to it; and that it compiles for sm_90 and sm_100 with no float64 and
only correctly rounded divisions (tests/helpers/triton_harness.py)."""
import copy

import pytest
import torch

from backends import TRITON_DEVICE as DEVICE
from numerics import assert_close
from triton_harness import assert_compiles, compile_report
from transformer_engine.pytorch.custom_ops import _registry
from transformer_engine.pytorch.reference import adam as reference

pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from transformer_engine.pytorch.triton import adam as kernels  # noqa: E402

SIZES = [(7, 3), (33,), (1,), (0, 4), (kernels.CHUNK + 2049,)]  # the last: a whole chunk, then a block and a tail


def _lists(param_dtype, grad_dtype, with_master, sizes=SIZES, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def randn(size):
        return torch.randn(size, generator=generator)
    params = [randn(size).to(param_dtype) for size in sizes]
    grads = [randn(size).to(grad_dtype) for size in sizes]
    exp_avgs = [randn(size) * 0.1 for size in sizes]
    exp_avg_sqs = [randn(size).abs() * 0.1 for size in sizes]
    masters = [p.float() + 0.01 * randn(p.shape) for p in params] if with_master else []
    return [[t.to(DEVICE) for t in tensors] for tensors in (params, grads, exp_avgs, exp_avg_sqs, masters)]


def _assert_step_matches_reference(lists, hyper):
    want = copy.deepcopy(lists)
    storage = [t.data_ptr() for tensors in lists for t in tensors]
    kernels.multi_tensor_adam(*lists, *hyper)
    reference.adam_step(*want, *hyper)
    assert storage == [t.data_ptr() for tensors in lists for t in tensors]
    for name, got_list, want_list in zip(("param", "grad", "exp_avg", "exp_avg_sq", "master"), lists, want):
        for got, expected in zip(got_list, want_list):
            # PyTorch's CPU sqrt is not correctly rounded (1 ulp off in ~1 case of 6): float32
            # results differ by an ulp or two, and a bf16 / fp16 param without master may then round
            # to the neighbouring value.
            assert_close(got.cpu(), expected.cpu(), dtype=torch.float32 if got.dtype == torch.float32 else None,
                         name=name)


@pytest.mark.parametrize("beta1", [0.9, 0.5, 0.0], ids=lambda b: f"beta1={b}")  # lerp from m; from g (w >= 0.5)
@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "adam_l2"])
@pytest.mark.parametrize("param_dtype,grad_dtype,with_master", [
    (torch.float32, torch.float32, False), (torch.float32, torch.bfloat16, True),
    (torch.bfloat16, torch.bfloat16, True), (torch.bfloat16, torch.float32, False),
    (torch.float16, torch.float32, True), (torch.float16, torch.float16, False)],
    ids=str)
def test_matches_reference(param_dtype, grad_dtype, with_master, adam_w_mode, beta1):
    lists = _lists(param_dtype, grad_dtype, with_master)
    _assert_step_matches_reference(lists, (1e-2, beta1, 0.999, 1e-8, 3, True, 0.05, adam_w_mode, 0.5))


def test_without_bias_correction_and_with_grad_scale():
    lists = _lists(torch.bfloat16, torch.float32, True)
    _assert_step_matches_reference(lists, (3e-3, 0.8, 0.95, 1e-6, 7, False, 0.0, True, 1 / 1024))


def test_unaligned_views_beside_aligned_tensors():
    """Params and states viewed at odd offsets of flat buffers (no 16-byte alignment) take their
    own launch, with unvectorised loads; the aligned tensors of the same call take another."""
    aligned = _lists(torch.bfloat16, torch.bfloat16, True, sizes=[(5, 7), (300,)])
    flat = _lists(torch.bfloat16, torch.bfloat16, True, sizes=[(1 + 35 + 300 + 3,)], seed=1)
    views = [[buffer[0][1:36].view(5, 7), buffer[0][36:336]] for buffer in flat]
    lists = [a + v for a, v in zip(aligned, views)]
    assert any(t.data_ptr() % 16 for t in views[0])
    before = [buffer[0].clone() for buffer in flat]
    _assert_step_matches_reference(lists, (1e-2, 0.9, 0.999, 1e-8, 2, True, 0.1, True, 1.0))
    for buffer, old in zip(flat, before):  # only the viewed elements change
        assert torch.equal(buffer[0][0], old[0]) and torch.equal(buffer[0][336:], old[336:])


def test_non_contiguous_grads():
    params, grads, exp_avgs, exp_avg_sqs, _ = _lists(torch.float32, torch.float32, False, sizes=[(6, 10)])
    strided = [g.t().contiguous().t() for g in grads]  # the same values, column-major
    assert not strided[0].is_contiguous()
    _assert_step_matches_reference([params, strided, exp_avgs, exp_avg_sqs, []],
                                   (1e-2, 0.9, 0.999, 1e-8, 1, True, 0.0, False, 1.0))


def test_empty_lists_and_empty_tensors_launch_nothing():
    kernels.multi_tensor_adam([], [], [], [], [], 1e-3, 0.9, 0.999, 1e-8, 1, True, 0.0, True, 1.0)
    lists = _lists(torch.float32, torch.float32, True, sizes=[(0,), (0, 3)])
    kernels.multi_tensor_adam(*lists, 1e-3, 0.9, 0.999, 1e-8, 1, True, 0.0, True, 1.0)


def test_chunk_table():
    """One row per chunk: addresses advanced by the chunk's first element times each column's
    element size, and the chunk's length; tensors without elements own no row."""
    chunk = kernels.CHUNK
    rows = [[1000, 2000, 3000, 4000, 0, 2 * chunk + 5], [10, 20, 30, 40, 0, 0], [7, 8, 9, 10, 0, 3]]
    table = kernels._chunk_table(rows, [2, 4, 4, 4, 0])
    assert table.tolist() == [
        [1000, 2000, 3000, 4000, 0, chunk],
        [1000 + 2 * chunk, 2000 + 4 * chunk, 3000 + 4 * chunk, 4000 + 4 * chunk, 0, chunk],
        [1000 + 4 * chunk, 2000 + 8 * chunk, 3000 + 8 * chunk, 4000 + 8 * chunk, 0, 5],
        [7, 8, 9, 10, 0, 3]]


def test_the_op_dispatches_to_the_kernel_on_accelerators():
    assert _registry.op_paths("multi_tensor_adam") == {"cpu": "kernel", "cuda": "triton", "musa": "triton"}
    params = [torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16)]
    assert kernels.supports("multi_tensor_adam", (params, params, [], [], [], 1e-3, 0.9, 0.999, 1e-8, 1, True,
                                                  0.0, True, 1.0))


_TYPES = {"fp32": tl.float32, "bf16": tl.bfloat16, "fp16": tl.float16}


def compile_variants():
    """What tests/helpers/triton_compile.py compiles of triton/adam.py: AdamW and L2 Adam, with and without fp32
    masters, lerp from m (beta1 above 0.5) or from the gradient, aligned or not, over bf16, fp32 and fp16 params and
    grads."""
    found = []
    for param, grad, master, adam_w, from_grad, aligned in (
            ("fp32", "fp32", False, True, False, True), ("bf16", "bf16", True, True, False, True),
            ("fp16", "fp32", True, False, True, False), ("bf16", "bf16", False, False, False, False)):
        signature = {"TABLE": "*i64", **{name: "fp32" for name in (
            "inv_grad_scale", "weight_decay", "lerp_weight", "beta2", "one_minus_beta2", "decay",
            "bias_correction2_sqrt", "eps", "neg_step_size")},
            **{name: "constexpr" for name in ("PARAM_TYPE", "GRAD_TYPE", "HAS_MASTER", "ADAM_W", "LERP_FROM_GRAD",
                                              "ALIGNED", "BLOCK")}}
        constexprs = {"PARAM_TYPE": _TYPES[param], "GRAD_TYPE": _TYPES[grad], "HAS_MASTER": master,
                      "ADAM_W": adam_w, "LERP_FROM_GRAD": from_grad, "ALIGNED": aligned, "BLOCK": 2048}
        name = (f"adam[{param},grad={grad},master={master},{'adamw' if adam_w else 'l2'},"
                f"lerp_from={'grad' if from_grad else 'm'},aligned={aligned}]")
        found.append((name, kernels._adam_kernel, signature, constexprs))
    return found


def test_kernel_compiles_for_hopper_and_blackwell():
    """sm_90 and sm_100 cubins for 4 variants (compile_variants: AdamW and L2,
    masters or not, both lerp branches, aligned or not; bf16, fp32 and fp16 params and grads),
    with no float64 instruction and only IEEE divisions in the PTX. The unaligned variant
    loads element by element by design: vector accesses are checked on the aligned ones."""
    assert_compiles(compile_variants, count=4, exact_division=True, vectorized=False)
    aligned = [entry for entry in compile_report(compile_variants) if "aligned=True" in entry["kernel"]]
    assert aligned and all(entry["vector_accesses"] > 0 for entry in aligned), aligned
