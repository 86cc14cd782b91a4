"""te.get_cpu_offload_context: activation offload to host memory, TransformerEngine's API.

    context, sync = te.get_cpu_offload_context(enabled=True, num_layers=2, model_layers=4)
    for layer in layers:
        with context:
            x = layer(x)
        x = sync(x)

While a layer runs inside the context, the tensors autograd saves for its backward are moved to
host memory, and moved back to their device when the backward reads them (autograd's
saved-tensor hooks), for the first num_layers of every model_layers layers entered (TE's
choice: the last layers' activations are needed first in backward and stay). A saved tensor
already in host memory (every tensor of a CPU model) is kept as it is: the API works and
nothing moves. Copies are synchronous here (TE overlaps them on a side stream);
manual_synchronization returns the controller TE returns, whose calls order those copies and
are no-ops here (the same layers are offloaded as without it, where TE offloads only the
layers the controller is told to).
"""
from typing import Optional

import torch


class _OffloadContext:
    """The context manager get_cpu_offload_context returns (see the module docstring)."""

    def __init__(self, enabled: bool, num_layers: int, model_layers: int):
        self.enabled, self.num_layers, self.model_layers = enabled, num_layers, model_layers
        self.entered = 0  # layers entered so far, counted modulo model_layers
        self._hooks = None

    def __enter__(self):
        layer = self.entered % self.model_layers
        self.entered += 1
        if self.enabled and layer < self.num_layers:
            self._hooks = torch.autograd.graph.saved_tensors_hooks(_to_host, _to_device)
            self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        if self._hooks is not None:
            hooks, self._hooks = self._hooks, None
            hooks.__exit__(*exc)
        return False


def _to_host(tensor: torch.Tensor):
    """What is kept for backward: the tensor itself when already in host memory, else a host
    copy and the device to return it to."""
    if tensor.device.type == "cpu":
        return tensor, None
    return tensor.to("cpu", non_blocking=False), tensor.device


def _to_device(saved) -> torch.Tensor:
    tensor, device = saved
    return tensor if device is None else tensor.to(device)


class _ManualController:
    """TE's manual_controller: start_offload_layer / release_activation_forward_gpu_memory /
    start_reload_layer order the asynchronous copies of a side stream; the copies here are
    synchronous, so there is nothing to order."""

    def start_offload_layer(self, layer_id: int) -> None:
        del layer_id

    def release_activation_forward_gpu_memory(self, layer_id: int) -> None:
        del layer_id

    def start_reload_layer(self, layer_id: int) -> None:
        del layer_id


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    """TE's sync_function: marks a layer boundary for its stream synchronisation; here the
    tensor is returned unchanged."""
    return tensor


def get_cpu_offload_context(enabled: bool = False, num_layers: Optional[int] = 1, model_layers: int = 1,
                            offload_activations: bool = True, offload_weights: bool = False,
                            double_buffering: bool = False, manual_synchronization: bool = False,
                            retain_pinned_cpu_buffers: bool = False, offload_stream=None):
    """(context, sync_function), plus manual_controller with manual_synchronization=True.
    enabled: offload at all; num_layers of every model_layers layers entered are offloaded
    (num_layers <= model_layers). offload_activations, offload_weights and double_buffering
    are TE's deprecated options (activations are what is offloaded); retain_pinned_cpu_buffers
    and offload_stream tune TE's side-stream copies and change nothing here."""
    num_layers = 1 if num_layers is None else num_layers
    if model_layers < 1 or not 0 <= num_layers <= model_layers:
        raise ValueError(f"get_cpu_offload_context: num_layers={num_layers} must be in [0, model_layers] with "
                         f"model_layers={model_layers} >= 1")
    if offload_stream is not None and not manual_synchronization:
        raise ValueError("get_cpu_offload_context: offload_stream is only taken with manual_synchronization=True")
    context = _OffloadContext(bool(enabled), num_layers, model_layers)
    if manual_synchronization:
        return context, _identity, _ManualController()
    return context, _identity
