"""Where each op has a compiled kernel, a Triton kernel, or runs the plain-PyTorch reference.

An accelerator key with no compiled kernel for an op gets a Triton kernel (triton/) when the op
has one and triton is installed, else the reference, registered as its implementation: the
same torch.ops call works on every device and build_info() says exactly which path runs.
Also the rules every family's wrapper shares: the refusal of a second derivative of a backward
op, and when a family may take its direct call.
"""
import functools
import importlib
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .._extension import NAMESPACE
from ..triton import triton_status

# Device type -> the dispatch key its tensors use (torch_musa runs under PrivateUse1).
ACCELERATOR_KEYS = {"cuda": "CUDA", "musa": "PrivateUse1"}

_library = torch.library.Library(NAMESPACE, "IMPL")
_served: Dict[str, Dict[str, str]] = {}  # op -> {device: "triton" | "reference"} where not compiled
_families: Dict[str, str] = {}  # op -> its family: the name of the reference module defining it
_triton_impls: Dict[str, Callable] = {}  # op -> what the accelerators run where it is "triton"


@functools.lru_cache(maxsize=None)
def _triton_module(module: str):
    """triton/<module>.py, imported (with triton) on the first GPU call of one of its ops."""
    return importlib.import_module(f"{__package__.rpartition('.')[0]}.triton.{module}")


def _triton_or_reference(module: str, op_name: str, reference: Callable) -> Callable:
    """The op on an accelerator: triton/<module>.py's function of the same name where the
    module's supports(op_name, args) accepts the arguments (dtypes, sizes), the reference
    elsewhere. The module, and triton with it, is imported on the first call."""

    @functools.wraps(reference)
    def run(*args):
        kernels = _triton_module(module)
        return (getattr(kernels, op_name) if kernels.supports(op_name, args) else reference)(*args)

    return run


def _checked(check: Optional[Callable], run: Callable) -> Callable:
    """run, after check(*args) has refused bad arguments as the compiled ops do."""
    if check is None:
        return run

    @functools.wraps(run)
    def checked(*args):
        check(*args)
        return run(*args)

    return checked


def serve_on_accelerators(op_name: str, reference: Callable, triton_module: Optional[str] = None,
                          check: Optional[Callable] = None) -> None:
    """Registers, for every accelerator key that has no compiled `op_name`, the Triton kernel
    of triton/<triton_module>.py when given and triton is installed, else `reference`; both
    after `check` (the op's argument checks, raising the compiled op's ValueError) when given."""
    _families[op_name] = _family_of(reference)
    qualified = f"{NAMESPACE}::{op_name}"
    use_triton = triton_module is not None and triton_status()[0]
    if use_triton:
        _triton_impls[op_name] = _checked(check, _triton_or_reference(triton_module, op_name, reference))
    for device, key in ACCELERATOR_KEYS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key):
            impl = _triton_impls[op_name] if use_triton else _checked(check, reference)
            _library.impl(op_name, impl, key)
            _served.setdefault(op_name, {})[device] = "triton" if use_triton else "reference"


def serve_reference_on_cpu(op_name: str, reference: Callable, check: Optional[Callable] = None) -> None:
    """For an op defined in Python with no compiled CPU kernel: the reference serves the CPU
    (build_info says "reference" there)."""
    _families[op_name] = _family_of(reference)
    _library.impl(op_name, _checked(check, reference), "CPU")
    _served.setdefault(op_name, {})["cpu"] = "reference"


def _family_of(reference: Callable) -> str:
    """An op's family: the reference module that defines its semantics (reference/rope.py ->
    "rope"), which the op's wrapper, kernels and tests are named after."""
    return reference.__module__.rpartition(".")[2]


def op_names() -> List[str]:
    return sorted(_served)


def op_family(op_name: str) -> str:
    return _families[op_name]


def op_paths(op_name: str) -> Dict[str, str]:
    """{"cpu": "kernel" | "reference", "cuda": "triton" | "reference" | "kernel", "musa": ...} for one op."""
    qualified = f"{NAMESPACE}::{op_name}"
    compiled = torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CPU")
    paths = {"cpu": _served.get(op_name, {}).get("cpu", "kernel" if compiled else "missing")}
    for device in ACCELERATOR_KEYS:
        paths[device] = _served.get(op_name, {}).get(device, "kernel")
    return paths


def triton_impls() -> Dict[str, Callable]:
    """op -> the callable an accelerator runs for it (the Triton kernel where it supports the
    arguments, the reference elsewhere), for every op with a Triton kernel; empty without
    triton. The tests also serve these under the CPU key, to run the kernels in Triton's
    interpreter through the same torch.ops calls (tests/helpers/backends.py)."""
    return dict(_triton_impls)


def no_double_backward(op: str):
    """Autograd rule for a backward op: differentiating it again (create_graph=True, e.g. a
    gradient penalty) raises instead of silently treating the gradient as a constant."""
    def backward(ctx, *grads):
        raise NotImplementedError(f"{op}: double backward (gradients of gradients) is not supported; "
                                  "use the reference ops in transformer_engine.pytorch.reference")
    return backward


def direct_call_applies(tensors: Tuple[Optional[Tensor], ...]) -> bool:
    """Whether the op can be called directly (bindings/direct_calls.h), which is the same
    dispatcher call as torch.ops' without its argument boxing: not while torch.compile traces
    (it traces torch.ops), and not where torch.ops would first hand the call to a
    __torch_function__ (a tensor subclass's or a mode's, torch.device(...) included)."""
    return not torch.compiler.is_compiling() and not torch._C._has_torch_function(tensors)
