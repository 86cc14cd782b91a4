"""The calls every op of the portable_te namespace is checked with, and the checks.

Each op family declares its calls in its own test file, beside its other tests:

    CASES = OpCases("rope")                     # the family: its reference module's name

    @CASES.case("rope_fwd")                     # the op's one small, valid call
    def _(d):
        return (randn(d, 4, 2, 2, 16), ...), ()  # (args, which outputs hold FP8 codes)

    test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family = CASES.tests()

A case named after its op is the op's basic call; a case named "op[what]" calls it again where
its dtypes, options, mask kinds, formats or odd shapes take other paths. Inputs made with
grad=True require grad: opcheck then tests the autograd registration with them, and the compile
check compares the gradients too. Cases are built on demand, on the backend's device, one at a
time. The tests run every case on every backend (the CPU kernels, the Triton kernels in the
interpreter or on a GPU): equal to the plain-PyTorch reference (FP8 codes bit for bit), opcheck
(schema, fake kernel, autograd registration) and torch.compile(fullgraph=True) equal to eager,
the gradients too; and the family's cases name every op of the family.
tests/ops/test_every_op.py checks that every family declares its cases."""
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import pytest
import torch

from numerics import assert_close, assert_same_fp8
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.custom_ops import _registry

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
F32, BF16 = torch.float32, torch.bfloat16
ops = torch.ops.portable_te
# opcheck's schema test runs arithmetic PyTorch's CPU lacks for float8 tensors
# ("mul_cpu_reduced_float"): without it for ops that take FP8 codes.
FP8_OPCHECK = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


class Case(NamedTuple):
    args: tuple
    fp8_outputs: tuple = ()  # which outputs hold FP8 codes, compared bit for bit
    compile: bool = True  # also torch.compile(fullgraph=True) against eager (else opcheck only)


def op_of(name: str) -> str:
    return name.split("[")[0]


class OpCases:
    """The calls of one op family's ops. references: the reference function of an op whose
    reference is named otherwise (multi_tensor_adam: reference.adam_step)."""

    def __init__(self, family: str, references: Optional[Dict[str, Callable]] = None):
        self.family = family
        self._references = references or {}
        self._builders: Dict[str, Tuple[Callable, bool]] = {}  # name -> (build(device), compile)

    def case(self, name: str, compile: bool = True):
        """Decorator: build(device) -> (args, fp8_outputs) is the call `name`."""
        def register(build):
            assert name not in self._builders, name
            self._builders[name] = (build, compile)
            return build
        return register

    def names(self) -> list:
        return sorted(self._builders)

    def build(self, name: str, device: torch.device) -> Case:
        make, compile = self._builders[name]
        args, fp8_outputs = make(torch.device(device))
        return Case(tuple(args), tuple(fp8_outputs), compile)

    def reference(self, op: str) -> Callable:
        return self._references.get(op) or getattr(reference, op)

    def tests(self):
        """(test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family):
        the checks of these cases, for the test file to collect under those names."""
        cases = self

        @pytest.mark.parametrize("name", self.names())
        def test_matches_the_reference(backend, name):
            _check_against_the_reference(cases, name, backend.device)

        @pytest.mark.parametrize("name", self.names())
        def test_opcheck_and_compile(backend, name):
            _check_opcheck_and_compile(cases.build(name, backend.device), name)

        def test_cases_cover_the_family():
            family_ops = sorted(op for op in _registry.op_names() if _registry.op_family(op) == cases.family)
            assert family_ops, f"no op of the portable_te namespace is in the family {cases.family!r}"
            assert sorted({op_of(name) for name in cases.names()}) == family_ops
            assert set(family_ops) <= set(cases.names()), "each op has its basic call, named after it"

        return test_matches_the_reference, test_opcheck_and_compile, test_cases_cover_the_family


# --- inputs the families share ----------------------------------------------------------------

def randn(device, *shape, dtype=BF16, scale=1.0, shift=0.0, grad=False):
    return (torch.randn(*shape) * scale + shift).to(dtype).to(device).requires_grad_(grad)


def dtype_name(dtype):
    return {F32: "fp32", BF16: "bf16"}[dtype]


def basic_inputs(device):
    """x [6, 96] bf16, weight and bias [96] fp32 (the weight around 1), dy [6, 96] bf16: the
    basic calls of the norms, activations, FP8 casts and GEMMs."""
    x, w = randn(device, 6, 96), randn(device, 96, dtype=F32, shift=1.0)
    b, dy = randn(device, 96, dtype=F32), randn(device, 6, 96)
    return x, w, b, dy


# --- the checks -------------------------------------------------------------------------------

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


def _check_against_the_reference(cases: OpCases, name: str, device) -> None:
    case = cases.build(name, device)
    ours_args, reference_args = _copy(case.args), _copy(case.args)
    op = op_of(name)
    got = _outputs(getattr(ops, op)(*ours_args))
    want = _outputs(cases.reference(op)(*reference_args))
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


def _check_opcheck_and_compile(case: Case, name: str) -> None:
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
