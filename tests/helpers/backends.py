"""The backends every op test runs on, through the same torch.ops calls:

- "cpu": the compiled CPU kernels;
- "triton-interpreter": the Triton kernels on CPU tensors in Triton's interpreter (without a
  GPU, with triton installed): for the test's duration the ops' CPU key serves what an
  accelerator would run (custom_ops/_registry.py's triton_impls()), so autograd rules, opcheck and
  torch.compile go through the registration as they do on a GPU;
- "cuda" / "musa": the device's registration (Triton kernels, or the reference), when present.

Op tests take the `backend` fixture (conftest.py) and put their tensors on backend.device.
"""
import contextlib
import importlib.util
import warnings
from dataclasses import dataclass

import torch

from numerics import assert_value_error_naming
from transformer_engine.pytorch._extension import NAMESPACE
from transformer_engine.pytorch.custom_ops import _registry


@dataclass(frozen=True)
class Backend:
    name: str
    device: torch.device

    def __str__(self) -> str:
        return self.name


def available() -> list:
    backends = [Backend("cpu", torch.device("cpu"))]
    if torch.cuda.is_available():
        backends.append(Backend("cuda", torch.device("cuda")))
    elif importlib.util.find_spec("triton") is not None:
        backends.append(Backend("triton-interpreter", torch.device("cpu")))
    if hasattr(torch, "musa") and torch.musa.is_available():
        backends.append(Backend("musa", torch.device("musa")))
    return backends


# Where the tests that call Triton kernels directly (test_triton_*.py) put their tensors: the
# GPU Triton compiles for, else the CPU, under Triton's interpreter (conftest.py).
TRITON_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@contextlib.contextmanager
def serving(backend: Backend):
    """Within it, torch.ops calls on backend.device run that backend's kernels."""
    if backend.name != "triton-interpreter":
        yield backend
        return
    library = torch.library.Library(NAMESPACE, "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        for op_name, impl in _registry.triton_impls().items():
            library.impl(op_name, impl, "CPU")
    try:
        yield backend
    finally:
        library._destroy()


def assert_refused(backend: Backend, call, words, on_meta: bool = True) -> None:
    """call() raises the op's ValueError naming `words`, with its tensors made on the backend's
    device ("cpu" among the words read as that device's type), and again with every tensor on
    the meta device, where the fake kernel checks what torch.compile traces; skipped where a
    word is "meta" (a meta tensor among real ones) or on_meta is False (checks that read values)."""
    with backend.device:
        assert_value_error_naming(call, [w.replace("cpu", backend.device.type) for w in words])
    if on_meta and "meta" not in words:
        with torch.device("meta"):
            assert_value_error_naming(call, [w for w in words if w != "cpu"])
