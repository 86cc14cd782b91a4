"""The `_extra_state` encoding (fp8/extra_state_codec.py): one uint8 tensor holding tensors and
JSON values, decoded without unpickling; modules' checkpoints go through safetensors-style
tensor-only writers and torch.load(weights_only=True); foreign states are refused or warned."""
import io
import pickle

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.fp8 import extra_state_codec as codec


def test_round_trip_of_tensors_and_values():
    state = {"amax_history_fwd": torch.rand(16, 3), "scale_bwd": torch.tensor([2.0, 0.5], dtype=torch.float32),
             "count": torch.arange(5, dtype=torch.int64), "nothing": torch.empty(0, 4),
             "recipe": "DelayedScaling", "fp8_format": "HYBRID", "margin": 2}
    encoded = codec.encode(state)
    assert encoded.dtype == torch.uint8 and encoded.dim() == 1
    decoded = codec.decode(encoded)
    assert set(decoded) == set(state)
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            assert decoded[name].dtype == value.dtype and torch.equal(decoded[name], value), name
        else:
            assert decoded[name] == value, name


def test_empty_state_is_the_empty_tensor():
    assert codec.encode({}).numel() == 0 and codec.decode(codec.empty()) == {}


def test_foreign_states_are_refused():
    te_pickled = torch.frombuffer(bytearray(pickle.dumps({"scale_fwd": [1.0]})), dtype=torch.uint8)
    with pytest.raises(codec.ForeignExtraState, match="pickled"):
        codec.decode(te_pickled)
    with pytest.raises(codec.ForeignExtraState, match="do not start"):
        codec.decode(torch.tensor([1, 2, 3, 4, 5], dtype=torch.uint8))
    with pytest.raises(codec.ForeignExtraState, match="uint8"):
        codec.decode(torch.zeros(3))


def trained_linear():
    torch.manual_seed(0)
    module = te.Linear(32, 32)
    for _ in range(2):
        with te.autocast(recipe=recipe.DelayedScaling(amax_history_len=4)):
            module(torch.randn(16, 32)).sum().backward()
    return module


def test_module_state_dict_is_tensors_only_and_loads_with_weights_only():
    module = trained_linear()
    state = module.state_dict()
    assert all(isinstance(value, torch.Tensor) for value in state.values())
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    fresh = te.Linear(32, 32)
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    for direction in ("scaling_fwd", "scaling_bwd"):
        for name in ("amax_history", "scale", "scale_inv"):
            assert torch.equal(getattr(getattr(fresh.fp8_meta, direction), name),
                               getattr(getattr(module.fp8_meta, direction), name)), (direction, name)


def test_earlier_dict_form_still_loads():
    module = trained_linear()
    fresh = te.Linear(32, 32)
    fresh.set_extra_state(module.fp8_meta.extra_state())
    assert torch.equal(fresh.fp8_meta.scaling_fwd.scale, module.fp8_meta.scaling_fwd.scale)


def test_transformer_engine_pickled_state_warns_and_starts_afresh():
    module = te.Linear(32, 32)
    state = module.state_dict()
    state["_extra_state"] = torch.frombuffer(bytearray(pickle.dumps({"x": 1})), dtype=torch.uint8)
    with pytest.warns(UserWarning, match="not loaded"):
        module.load_state_dict(state)
    assert module.fp8_meta is None
