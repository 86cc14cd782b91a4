"""Every op of the portable_te namespace through the same checks on every backend (the CPU
kernels, the Triton kernels in the interpreter or on a GPU): equal to the plain-PyTorch
reference (FP8 codes bit for bit), opcheck (schema, fake kernel, autograd registration) and
torch.compile(fullgraph=True) equal to eager, the gradients too where inputs require grad;
over the calls of tests/helpers/op_cases.py: each op's basic call and the dtypes, options, mask kinds,
formats and odd shapes that take other paths. The op families' own tests go deeper (every
gradient against PyTorch, odd shapes, bad input, SIMD tiers); this one misses no op, and is
where ops are opchecked and compiled."""
import pytest
import torch

from numerics import assert_close, assert_same_fp8
from op_cases import build, names, op_of
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.custom_ops import _registry

ops = torch.ops.portable_te
E4M3 = torch.float8_e4m3fn
# The reference function of each op where its name differs.
REFERENCE = {"multi_tensor_adam": reference.adam_step}
# opcheck's schema test runs arithmetic PyTorch's CPU lacks for float8 tensors
# ("mul_cpu_reduced_float"): without it for ops that take FP8 codes.
FP8_OPCHECK = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_the_table_covers_every_op():
    assert sorted({op_of(name) for name in names()}) == _registry.op_names()
    assert set(_registry.op_names()) <= set(names()), "each op has its basic call, named after it"


def _outputs(result):
    if result is None:
        return ()
    return result if isinstance(result, (tuple, list)) else (result,)


def _copy(args):
    """The args with fresh copies of every tensor (in-place ops write into theirs), leaves that
    require grad where the case's do."""
    def one(a):
        if isinstance(a, torch.Tensor):
            return a.detach().clone().requires_grad_(a.requires_grad)
        if isinstance(a, list):
            return [one(t) for t in a]
        return a
    return tuple(one(a) for a in args)


def _mutated(op, args):
    """The tensors op writes in place: those its schema marks Tensor(a!) or Tensor(a!)[]."""
    written = [arg.alias_info is not None and arg.alias_info.is_write for arg in op.default._schema.arguments]
    return [t for a, write in zip(args, written) if write for t in (a if isinstance(a, list) else [a])]


def _leaves(args):
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


@pytest.mark.parametrize("name", names())
def test_matches_the_reference(backend, name):
    case = build(name, backend.device)
    ours_args, reference_args = _copy(case.args), _copy(case.args)
    op = op_of(name)
    got = _outputs(getattr(ops, op)(*ours_args))
    want = _outputs(REFERENCE.get(op, getattr(reference, op, None))(*reference_args))
    if not got:  # in place: the tensors written
        got, want = _mutated(getattr(ops, op), ours_args), _mutated(getattr(ops, op), reference_args)
        assert got, f"{name} returns nothing and writes nothing"
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want)):
        if index in case.fp8_outputs:
            assert_same_fp8(g, w)
        else:
            assert g.shape == w.shape and g.dtype == w.dtype, (index, g.shape, w.shape, g.dtype, w.dtype)
            assert_close(g.float(), w.float(), dtype=w.dtype if w.dtype.is_floating_point else torch.float32,
                         name=f"{name} output {index}", atol=1e-4)


def _takes_fp8(args):
    return any(isinstance(a, torch.Tensor) and a.dtype.itemsize == 1 and a.dtype.is_floating_point for a in args)


def _same(g, w):
    if g is None or w is None:
        return g is None and w is None
    if g.dtype.itemsize == 1:
        return torch.equal(g.view(torch.uint8), w.view(torch.uint8))
    return torch.equal(g.nan_to_num(7.0), w.nan_to_num(7.0))


def _run(op, fn, args):
    """fn's outputs (or the tensors it updated in place) and, where inputs require grad, the
    gradients of those inputs for fixed random output gradients."""
    outputs = _outputs(fn(*args))
    if not outputs:
        return _mutated(op, args), []
    leaves = _leaves(args)
    differentiable = [o for o in outputs if o.requires_grad]
    if not leaves or not differentiable:
        return outputs, []
    generator = torch.Generator().manual_seed(0)
    grad_outputs = [torch.randn(o.shape, generator=generator).to(o.device, o.dtype) for o in differentiable]
    return outputs, torch.autograd.grad(differentiable, leaves, grad_outputs, allow_unused=True)


@pytest.mark.parametrize("name", names())
def test_opcheck_and_compile(backend, name):
    case = build(name, backend.device)
    op = getattr(ops, op_of(name))
    if _takes_fp8(case.args):
        torch.library.opcheck(op, _copy(case.args), test_utils=FP8_OPCHECK)
    else:
        torch.library.opcheck(op, _copy(case.args))
    if not case.compile:
        return
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: op(*a), fullgraph=True)
    want, want_grads = _run(op, op, _copy(case.args))
    got, got_grads = _run(op, compiled, _copy(case.args))
    assert len(got) == len(want) and len(got_grads) == len(want_grads)
    for index, (g, w) in enumerate(zip(got, want)):
        assert _same(g, w), f"{name} output {index}"
    for index, (g, w) in enumerate(zip(got_grads, want_grads)):
        assert _same(g, w), f"{name} gradient {index}"


def test_compiled_fp8_codes_flow_between_ops(backend):
    """FP8 codes made and used inside one compiled graph: per-tensor and block quantise ->
    dequantise round trips, and block quantise -> block GEMM with an elementwise op on its
    result, equal eager."""
    device = backend.device
    x = torch.randn(70, 160).bfloat16().to(device)
    scale = torch.tensor([7.0], device=device)
    w = torch.randn(32, 160).to(device)

    def round_trips(x, scale, w):
        data, amax = ops.fp8_quantize(x, scale, E4M3)
        codes, scale_inv = ops.fp8_block_quantize(x, 1, 32, E4M3, "e8m0", 0.0)
        w_codes, w_scale_inv = ops.fp8_block_quantize(w, 1, 32, E4M3, "e8m0", 0.0)
        product = ops.fp8_block_gemm(codes, scale_inv, [1, 32], False, w_codes, w_scale_inv, [1, 32], False, None,
                                     torch.float32)
        return (ops.fp8_dequantize(data, 1 / scale, x.dtype), amax,
                ops.fp8_block_dequantize(codes, scale_inv, 1, 32, torch.float32), product * 2)

    torch._dynamo.reset()
    got, want = torch.compile(round_trips, fullgraph=True)(x, scale, w), round_trips(x, scale, w)
    for index, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), index
