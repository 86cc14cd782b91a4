"""Named RNG streams for model parallelism (TransformerEngine's CudaRNGStatesTracker), on any device.

Tensor-parallel training needs several random streams side by side: dropout inside a
tensor-parallel region must differ between ranks, outside it must agree. The tracker keeps one
generator state per name; fork(name) swaps that state into the device's default generator for
the body of the `with` and keeps what the body advanced it to. Megatron-Core subclasses this
class at import and builds it on every rank.

The device is the one modules default to (utils.default_device()): the accelerator's generator
when there is one, the CPU's otherwise, so the same Megatron code runs on a machine without a GPU.
"""
import contextlib
from typing import Dict, Iterator, Optional, Union

import torch

from .utils import default_device

_all_active_states: Dict[str, torch.Tensor] = {}  # what the last tracker to change holds (TE's global)


def get_all_rng_states() -> Dict[str, torch.Tensor]:
    """The generator states of the tracker that last added or set states, by name."""
    return _all_active_states


def set_all_rng_states(states: Dict[str, torch.Tensor]) -> None:
    global _all_active_states
    _all_active_states = states


def _device_module(device: torch.device):
    """torch.cuda, torch.musa, ...: the module with get_rng_state/set_rng_state for `device`."""
    module = getattr(torch, device.type, None)
    if module is None or not hasattr(module, "get_rng_state"):
        raise RuntimeError(f"CudaRNGStatesTracker: torch has no RNG state functions for device '{device.type}'")
    return module


def _get_state(device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return torch.get_rng_state()
    return _device_module(device).get_rng_state(device)


def _set_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cpu":
        torch.set_rng_state(state)
    else:
        _device_module(device).set_rng_state(state, device)


class CudaRNGStatesTracker:
    """Generator states by name: add(name, seed), fork(name), get_states()/set_states() (for
    activation recompute, which replays a forward with the states it started from).

    device: whose default generator fork() swaps (default: the accelerator if present, else
    the CPU); the name is TransformerEngine's, the class is not tied to CUDA.
    """

    def __init__(self, device: Optional[Union[torch.device, str]] = None):
        self.device = torch.device(device) if device is not None else default_device()
        self.states_: Dict[str, torch.Tensor] = {}
        self.seeds_ = set()  # no seed twice: two names on one seed would draw the same numbers

    def reset(self) -> None:
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self) -> Dict[str, torch.Tensor]:
        """A new dict of the current states (the states themselves are not copied: fork()
        replaces a name's state rather than writing into it)."""
        return dict(self.states_)

    def set_states(self, states: Dict[str, torch.Tensor]) -> None:
        self.states_ = states
        set_all_rng_states(self.states_)

    def add(self, name: str, seed: int) -> None:
        """A new stream `name` starting from `seed` (the device's default generator is left
        as it was)."""
        if seed in self.seeds_:
            raise RuntimeError(f"CudaRNGStatesTracker.add: seed {seed} already exists")
        if name in self.states_:
            raise RuntimeError(f"CudaRNGStatesTracker.add: rng state {name!r} already exists")
        self.seeds_.add(seed)
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)
        self.states_[name] = generator.get_state()
        set_all_rng_states(self.states_)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        """Draws from stream `name` inside the body; the default stream is untouched by it."""
        if name not in self.states_:
            raise KeyError(f"CudaRNGStatesTracker.fork: rng state {name!r} is not added "
                           f"(added: {sorted(self.states_)})")
        outside = _get_state(self.device)
        _set_state(self.device, self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = _get_state(self.device)
            _set_state(self.device, outside)
