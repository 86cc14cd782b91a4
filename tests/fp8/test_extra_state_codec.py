"""The `_extra_state` encoding (fp8/extra_state_codec.py): one uint8 tensor holding tensors and
JSON values, decoded without unpickling; modules' checkpoints go through safetensors-style
tensor-only writers and torch.load(weights_only=True); foreign states are refused or warned."""
import io
import json
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


def split(encoded):
    """(version, header dict, tensor data bytes) of an encoded state."""
    raw = encoded.numpy().tobytes()
    _, version, header_len = codec._PREFIX.unpack_from(raw)
    start = codec._PREFIX.size + header_len
    return version, json.loads(raw[codec._PREFIX.size:start]), raw[start:]


def joined(version, header, data):
    text = json.dumps(header).encode()
    return as_tensor(codec._PREFIX.pack(codec.MAGIC, version, len(text)) + text + data)


def as_tensor(raw):
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def with_spec(header, field, value):
    """header with scale_fwd's entry `field` set to value."""
    header = json.loads(json.dumps(header))
    header["tensors"]["scale_fwd"][field] = value
    return header


def malformed_states(encoded):
    """[(what is wrong, the bad _extra_state, words the error must contain)]."""
    raw = encoded.numpy().tobytes()
    version, header, data = split(encoded)
    nbytes = header["tensors"]["scale_fwd"]["nbytes"]
    prefix = raw[:codec._PREFIX.size]
    return [
        ("truncated data", as_tensor(raw[:-5]), ["truncated", "bytes of tensor data"]),
        ("truncated header", as_tensor(raw[:codec._PREFIX.size + 10]), ["header", "truncated"]),
        ("truncated prefix", as_tensor(raw[:6]), ["prefix", "truncated"]),
        ("garbage header", as_tensor(prefix + b"\xff" * (len(raw) - len(prefix))), ["not UTF-8 JSON"]),
        ("header a list", joined(version, [header], data), ["'values' and 'tensors'"]),
        ("tensors a list", joined(version, {**header, "tensors": []}, data), ["'values' and 'tensors'"]),
        ("nbytes a string", joined(version, with_spec(header, "nbytes", "12"), data), ["scale_fwd", "nbytes"]),
        ("unknown dtype", joined(version, with_spec(header, "dtype", "Tensor"), data), ["scale_fwd", "'Tensor'"]),
        ("negative shape", joined(version, with_spec(header, "shape", [-3]), data), ["scale_fwd", "[-3]"]),
        ("nbytes that lie", joined(version, with_spec(header, "nbytes", nbytes + 4), data),
         ["declares", "bytes of tensor data"]),
        ("offset past the data", joined(version, with_spec(header, "offset", len(data)), data),
         ["scale_fwd", "outside"]),
        ("extra bytes", joined(version, header, data + b"xx"), ["declares", "follow"]),
    ]


@pytest.mark.parametrize("case", range(12))
def test_malformed_extra_state_names_the_module_and_the_fault(case):
    """Truncated or altered bytes raise a ValueError naming the module and what is wrong (they
    gave a bare JSONDecodeError, KeyError or AttributeError, or read past the data)."""
    source = trained_linear()
    state = source.state_dict()
    what, bad, words = malformed_states(state["_extra_state"])[case]
    target = te.Linear(32, 32)
    with pytest.raises(ValueError) as info:
        target.load_state_dict({**state, "_extra_state": bad})
    for word in ["Linear", "_extra_state", "malformed"] + words:
        assert word in str(info.value), f"{what}: {word!r} not in: {info.value}"
    assert target.fp8_meta is None


def test_missing_fields_and_wrong_shapes_are_named():
    fp8_state = trained_linear().fp8_meta.extra_state()
    target = te.Linear(32, 32)
    missing = {k: v for k, v in fp8_state.items() if k != "scale_bwd"}
    with pytest.raises(ValueError, match=r"Linear: .* lacks \['scale_bwd'\]"):
        target.load_state_dict({**target.state_dict(), "_extra_state": codec.encode(missing)})
    not_a_tensor = {**fp8_state, "scale_fwd": "1.0"}
    with pytest.raises(ValueError, match="Linear: .*scale_fwd must be a floating-point tensor, got str"):
        target.load_state_dict({**target.state_dict(), "_extra_state": codec.encode(not_a_tensor)})
    mlp = te.LayerNormMLP(32, 32)
    with te.autocast(recipe=recipe.DelayedScaling()):
        mlp(torch.randn(4, 32)).sum().backward()
    with pytest.raises(ValueError, match=r"Linear: .* 6 forward slots .* this module 3"):
        target.load_state_dict({**target.state_dict(), "_extra_state": mlp.state_dict()["_extra_state"]})
    with pytest.raises(ValueError, match="Linear: _extra_state must be a uint8 tensor or a dict, got list"):
        target.set_extra_state([1, 2])
    assert target.fp8_meta is None
