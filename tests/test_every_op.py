"""Every op of the portable_te namespace through the same checks on every backend (the CPU
kernels, the Triton kernels in the interpreter or on a GPU): equal to the plain-PyTorch
reference (FP8 codes bit for bit), opcheck (schema, fake kernel, autograd registration) and
torch.compile(fullgraph=True) equal to eager. The op families' own tests go deeper (every
gradient through autograd, odd shapes, bad input); this one misses no op."""
import pytest
import torch

from numerics import assert_close, assert_same_fp8
from op_cases import cases
from transformer_engine.pytorch import reference
from transformer_engine.pytorch.kernels import _registry

ops = torch.ops.portable_te
# The reference function of each op where its name differs.
REFERENCE = {"multi_tensor_adam": reference.adam_step}
# opcheck's schema test runs arithmetic PyTorch's CPU lacks for float8 tensors ("mul_cpu_reduced_float").
FP8_OPCHECK = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_the_table_covers_every_op():
    assert sorted(cases(torch.device("cpu"))) == _registry.op_names()


def _outputs(result):
    if result is None:
        return ()
    return result if isinstance(result, (tuple, list)) else (result,)


def _copy(args):
    """The args with fresh copies of every tensor (in-place ops write into theirs)."""
    def one(a):
        if isinstance(a, torch.Tensor):
            return a.clone()
        if isinstance(a, list):
            return [one(t) for t in a]
        return a
    return tuple(one(a) for a in args)


def _mutated(args):
    return [t for a in args if isinstance(a, list) for t in a]


@pytest.mark.parametrize("name", sorted(cases(torch.device("cpu"))))
def test_matches_the_reference(backend, name):
    args, fp8_outputs = cases(backend.device)[name]
    ours_args, reference_args = _copy(args), _copy(args)
    got = _outputs(getattr(ops, name)(*ours_args))
    want = _outputs(REFERENCE.get(name, getattr(reference, name, None))(*reference_args))
    got, want = (got, want) if got else (_mutated(ours_args), _mutated(reference_args))  # in place: the tensors
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want)):
        if index in fp8_outputs:
            assert_same_fp8(g, w)
        else:
            assert g.shape == w.shape and g.dtype == w.dtype, (index, g.shape, w.shape, g.dtype, w.dtype)
            assert_close(g.float(), w.float(), dtype=w.dtype if w.dtype.is_floating_point else torch.float32,
                         name=f"{name} output {index}", atol=1e-4)


@pytest.mark.parametrize("name", sorted(cases(torch.device("cpu"))))
def test_opcheck_and_compile(backend, name):
    args, _ = cases(backend.device)[name]
    takes_fp8 = any(isinstance(a, torch.Tensor) and a.dtype.itemsize == 1 and a.dtype.is_floating_point
                    for a in args) or any(a in (torch.float8_e4m3fn, torch.float8_e5m2) for a in args
                                          if isinstance(a, torch.dtype))
    if takes_fp8:
        torch.library.opcheck(getattr(ops, name), _copy(args), test_utils=FP8_OPCHECK)
    else:
        torch.library.opcheck(getattr(ops, name), _copy(args))
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: getattr(ops, name)(*a), fullgraph=True)
    eager_args, compiled_args = _copy(args), _copy(args)
    want, got = _outputs(getattr(ops, name)(*eager_args)), _outputs(compiled(*compiled_args))
    got, want = (got, want) if want else (_mutated(compiled_args), _mutated(eager_args))
    for g, w in zip(got, want):
        same = torch.equal(g.view(torch.uint8), w.view(torch.uint8)) if g.dtype.itemsize == 1 else \
            torch.equal(g.nan_to_num(7.0), w.nan_to_num(7.0))
        assert same, name
