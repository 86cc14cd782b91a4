"""A module's `_extra_state` as one uint8 tensor, as TransformerEngine stores it, so that
checkpoint writers that accept tensors only (safetensors, Hugging Face's save_pretrained,
torch.distributed.checkpoint) take our modules. Unlike TE's pickled bytes, the encoding
holds only tensors and JSON values and is decoded without unpickling anything:

    b"TEXS" | version (1 byte) | header length n (8 bytes, little endian) | header (n bytes
    of UTF-8 JSON) | the tensors' bytes, one after the other

header: {"values": {name: JSON value}, "tensors": {name: {"dtype": "float32", "shape": [..],
"offset": bytes from the data start, "nbytes": ...}}}. No FP8 state is the empty tensor.
"""
import json
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
    ForeignExtraState for TransformerEngine's pickled state or anything else."""
    if encoded.dtype != torch.uint8 or encoded.dim() != 1:
        raise ForeignExtraState(f"expected a 1-D uint8 tensor, got {encoded.dtype} of shape {tuple(encoded.shape)}")
    if encoded.numel() == 0:
        return {}
    raw = encoded.detach().to("cpu").contiguous().numpy().tobytes()
    if raw[0] == _PICKLE_PROTOCOL_2_OR_LATER:
        raise ForeignExtraState("TransformerEngine's pickled FP8 state (not unpickled here)")
    if len(raw) < _PREFIX.size or raw[:4] != MAGIC:
        raise ForeignExtraState(f"unknown bytes ({len(raw)}) that do not start with {MAGIC!r}")
    _, version, header_len = _PREFIX.unpack_from(raw)
    if version != VERSION:
        raise ForeignExtraState(f"encoding version {version}, this build reads {VERSION}")
    start = _PREFIX.size + header_len
    header = json.loads(raw[_PREFIX.size:start].decode())
    state: Dict[str, object] = dict(header["values"])
    for name, spec in header["tensors"].items():
        dtype = getattr(torch, spec["dtype"])
        piece = bytearray(raw[start + spec["offset"]:start + spec["offset"] + spec["nbytes"]])
        flat = torch.frombuffer(piece, dtype=dtype) if piece else torch.empty(0, dtype=dtype)
        state[name] = flat.reshape(spec["shape"])
    return state
