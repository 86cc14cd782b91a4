"""A module's `_extra_state` as one uint8 tensor, as TransformerEngine stores it, so that
checkpoint writers that accept tensors only (safetensors, Hugging Face's save_pretrained,
torch.distributed.checkpoint) take our modules. Unlike TE's pickled bytes, the encoding
holds only tensors and JSON values and is decoded without unpickling anything:

    b"TEXS" | version (1 byte) | header length n (8 bytes, little endian) | header (n bytes
    of UTF-8 JSON) | the tensors' bytes, one after the other

header: {"values": {name: JSON value}, "tensors": {name: {"dtype": "float32", "shape": [..],
"offset": bytes from the data start, "nbytes": ...}}}. No FP8 state is the empty tensor.
decode() checks every declared size against the bytes there are (a truncated or altered
checkpoint raises MalformedExtraState naming what is wrong, never reads past the data).
"""
import json
import math
import struct
from typing import Dict

import torch
from torch import Tensor

MAGIC = b"TEXS"
VERSION = 1
_PREFIX = struct.Struct("<4sBQ")  # magic, version, header length
_PICKLE_PROTOCOL_2_OR_LATER = 0x80  # the first byte of TransformerEngine's pickled state


class ForeignExtraState(ValueError):
    """An `_extra_state` that is not ours: TransformerEngine's pickled one, or unknown bytes."""


class MalformedExtraState(ValueError):
    """Our encoding (it starts with MAGIC), but truncated or inconsistent."""


# The dtypes a state may hold, by the name encode() writes (getattr(torch, name) would take
# any attribute of torch).
_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}
_SPEC_FIELDS = {"dtype": str, "shape": list, "offset": int, "nbytes": int}


def empty() -> Tensor:
    """The encoding of "no FP8 state"."""
    return torch.empty(0, dtype=torch.uint8)


def encode(state: Dict[str, object]) -> Tensor:
    """state: name -> tensor or JSON-serialisable value; {} gives empty()."""
    if not state:
        return empty()
    values, tensors, chunks, offset = {}, {}, [], 0
    for name, value in state.items():
        if not isinstance(value, Tensor):
            values[name] = value
            continue
        data = value.detach().to("cpu").contiguous()
        raw = data.reshape(-1).view(torch.uint8) if data.numel() else torch.empty(0, dtype=torch.uint8)
        tensors[name] = {"dtype": str(data.dtype).removeprefix("torch."), "shape": list(data.shape),
                         "offset": offset, "nbytes": raw.numel()}
        chunks.append(raw)
        offset += raw.numel()
    header = json.dumps({"values": values, "tensors": tensors}, sort_keys=True).encode()
    prefix = torch.frombuffer(bytearray(_PREFIX.pack(MAGIC, VERSION, len(header)) + header), dtype=torch.uint8)
    return torch.cat([prefix, *chunks])


def decode(encoded: Tensor) -> Dict[str, object]:
    """The state encode() was given (tensors on the CPU); {} for the empty tensor.
    ForeignExtraState for TransformerEngine's pickled state or anything else;
    MalformedExtraState for our encoding truncated or altered."""
    if encoded.dtype != torch.uint8 or encoded.dim() != 1:
        raise ForeignExtraState(f"expected a 1-D uint8 tensor, got {encoded.dtype} of shape {tuple(encoded.shape)}")
    if encoded.numel() == 0:
        return {}
    raw = encoded.detach().to("cpu").contiguous().numpy().tobytes()
    if raw[0] == _PICKLE_PROTOCOL_2_OR_LATER:
        raise ForeignExtraState("TransformerEngine's pickled FP8 state (not unpickled here)")
    if raw[:4] != MAGIC:
        raise ForeignExtraState(f"unknown bytes ({len(raw)}) that do not start with {MAGIC!r}")
    if len(raw) < _PREFIX.size:
        raise MalformedExtraState(f"{len(raw)} bytes, fewer than the {_PREFIX.size} of the prefix (truncated)")
    _, version, header_len = _PREFIX.unpack_from(raw)
    if version != VERSION:
        raise ForeignExtraState(f"encoding version {version}, this build reads {VERSION}")
    header = _header(raw[_PREFIX.size:], header_len)
    data = raw[_PREFIX.size + header_len:]
    specs = {name: _checked_spec(name, spec) for name, spec in header["tensors"].items()}
    declared = sum(spec["nbytes"] for spec in specs.values())
    if declared != len(data):
        raise MalformedExtraState(f"the header declares {declared} bytes of tensor data but {len(data)} follow it"
                                  f"{' (truncated)' if declared > len(data) else ''}")
    state: Dict[str, object] = dict(header["values"])
    for name, spec in specs.items():
        state[name] = _tensor(name, spec, data)
    return state


def _header(rest: bytes, header_len: int) -> dict:
    """The JSON header at the start of `rest`, checked to be {"values": {..}, "tensors": {..}}."""
    if header_len > len(rest):
        raise MalformedExtraState(f"the header declares {header_len} bytes but only {len(rest)} follow (truncated)")
    try:
        header = json.loads(rest[:header_len].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as why:
        raise MalformedExtraState(f"the header is not UTF-8 JSON ({why})") from None
    if not (isinstance(header, dict) and isinstance(header.get("values"), dict)
            and isinstance(header.get("tensors"), dict)):
        raise MalformedExtraState(f"the header must be an object with objects 'values' and 'tensors', got "
                                  f"{str(header)[:200]}")
    return header


def _checked_spec(name: str, spec: object) -> dict:
    """A tensor's header entry, with the fields and types encode() writes."""
    if not isinstance(spec, dict) or any(type(spec.get(field)) is not kind for field, kind in _SPEC_FIELDS.items()):
        raise MalformedExtraState(f"tensor {name!r}: its entry must hold dtype (str), shape (list), offset and "
                                  f"nbytes (int), got {str(spec)[:200]}")
    if spec["dtype"] not in _DTYPES:
        raise MalformedExtraState(f"tensor {name!r}: unknown dtype {spec['dtype']!r}")
    if any(type(size) is not int or size < 0 for size in spec["shape"]):
        raise MalformedExtraState(f"tensor {name!r}: shape {spec['shape']} is not a list of non-negative ints")
    return spec


def _tensor(name: str, spec: dict, data: bytes) -> Tensor:
    """The tensor `spec` declares, read from `data` after checking its size and place."""
    dtype, shape, offset, nbytes = _DTYPES[spec["dtype"]], spec["shape"], spec["offset"], spec["nbytes"]
    expected = math.prod(shape) * dtype.itemsize
    if nbytes != expected:
        raise MalformedExtraState(f"tensor {name!r}: nbytes {nbytes} does not match shape {shape} of {spec['dtype']} "
                                  f"({expected} bytes)")
    if offset < 0 or offset + nbytes > len(data):
        raise MalformedExtraState(f"tensor {name!r}: bytes {offset}..{offset + nbytes} lie outside the "
                                  f"{len(data)} bytes of tensor data")
    piece = bytearray(data[offset:offset + nbytes])
    flat = torch.frombuffer(piece, dtype=dtype) if piece else torch.empty(0, dtype=dtype)
    return flat.reshape(shape)
