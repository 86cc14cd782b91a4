"""InferenceParams: TransformerEngine's key/value cache for incremental decoding, non-paged.

    params = InferenceParams(max_batch_size=4, max_sequence_length=128, num_heads_kv=8, head_dim_k=64)
    params.pre_step(OrderedDict({seq_id: new_tokens, ...}))    # the sequences of this step
    k, v = params.step(layer_number, new_k, new_v)             # cache appended; all cached k, v

The cache keeps, per layer, k and v of [max_batch_size, max_sequence_length, heads, dim]
(bshd); step() writes each sequence's new tokens after its cached ones and returns every
sequence's keys and values so far, padded to the longest. DotProductAttention does not consume
it yet (it refuses inference_params); paged caches (is_paged=True) are not implemented.
"""
from collections import OrderedDict
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from ..utils import default_device


class InferenceParams:
    def __init__(self, max_batch_size: int, max_sequence_length: int, num_heads_kv: Optional[int] = None,
                 head_dim_k: Optional[int] = None, dtype: Optional[torch.dtype] = None,
                 head_dim_v: Optional[int] = None, is_paged: bool = False, total_num_pages: Optional[int] = None,
                 page_size: Optional[int] = None, max_ctx_len: Optional[int] = None, qkv_format: str = "bshd",
                 custom_cache_manager=None) -> None:
        if is_paged or custom_cache_manager is not None:
            raise NotImplementedError("InferenceParams: paged and custom KV caches are not implemented")
        for name, value in (("max_batch_size", max_batch_size), ("max_sequence_length", max_sequence_length)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"InferenceParams: {name} must be a positive int, got {value!r}")
        if qkv_format not in ("bshd", "sbhd", "thd"):
            raise ValueError(f"InferenceParams: qkv_format must be 'bshd', 'sbhd' or 'thd', got {qkv_format!r}")
        self.max_batch_size = max_batch_size
        self.max_sequence_length = max_sequence_length
        self.num_heads_kv = num_heads_kv
        self.head_dim_k = head_dim_k
        self.head_dim_v = head_dim_v if head_dim_v is not None else head_dim_k
        self.dtype = dtype or torch.get_default_dtype()
        self.is_paged = False
        self.input_qkv_format = qkv_format
        self.cache: Dict[int, Tuple[Tensor, Tensor]] = {}
        self.sequences: "OrderedDict[int, int]" = OrderedDict()  # seq_id -> tokens cached
        self.rows: Dict[int, int] = {}  # seq_id -> its row of the cache
        self.step_dict: "OrderedDict[int, int]" = OrderedDict()  # seq_id -> tokens this step

    def reset(self) -> None:
        """Forgets every sequence (the cache memory is kept)."""
        self.sequences.clear()
        self.rows.clear()
        self.step_dict.clear()

    def pre_step(self, step_dict: "OrderedDict[int, int]") -> None:
        """Opens a step: step_dict maps each sequence id of the batch, in batch order, to its
        number of new tokens. Sequences absent from it are dropped from the cache."""
        if len(step_dict) > self.max_batch_size:
            raise ValueError(f"InferenceParams.pre_step: {len(step_dict)} sequences, max_batch_size is "
                             f"{self.max_batch_size}")
        for seq_id, new in step_dict.items():
            total = self.sequences.get(seq_id, 0) + new
            if total > self.max_sequence_length:
                raise ValueError(f"InferenceParams.pre_step: sequence {seq_id} would hold {total} tokens, "
                                 f"max_sequence_length is {self.max_sequence_length}")
        self.step_dict = OrderedDict(step_dict)
        self.rows = {seq_id: row for seq_id, row in self.rows.items() if seq_id in step_dict}
        free = iter(sorted(set(range(self.max_batch_size)) - set(self.rows.values())))
        for seq_id in step_dict:
            if seq_id not in self.rows:
                self.rows[seq_id] = next(free)
        self.sequences = OrderedDict((seq_id, self.sequences.get(seq_id, 0)) for seq_id in step_dict)

    def allocate_memory(self, layer_number: int) -> None:
        shape_k = (self.max_batch_size, self.max_sequence_length, self.num_heads_kv, self.head_dim_k)
        shape_v = (self.max_batch_size, self.max_sequence_length, self.num_heads_kv, self.head_dim_v)
        device = default_device()
        self.cache[layer_number] = (torch.zeros(shape_k, dtype=self.dtype, device=device),
                                    torch.zeros(shape_v, dtype=self.dtype, device=device))

    def step(self, layer_number: int, new_k: Tensor, new_v: Tensor) -> Tuple[Tensor, Tensor]:
        """Appends this step's new_k / new_v ([batch, new tokens, heads, dim], bshd; batch in
        step_dict order) and returns every sequence's cached k and v, [batch, longest, heads, dim].
        The sequence lengths advance once the last layer has stepped (see finish_step)."""
        if layer_number not in self.cache:
            self.allocate_memory(layer_number)
        k_cache, v_cache = self.cache[layer_number]
        order = list(self.step_dict)
        if new_k.shape[0] != len(order):
            raise ValueError(f"InferenceParams.step: new_k holds {new_k.shape[0]} sequences, the step has "
                             f"{len(order)}")
        ends = []
        for position, seq_id in enumerate(order):
            row, start, new = self.rows[seq_id], self.sequences[seq_id], self.step_dict[seq_id]
            k_cache[row, start:start + new] = new_k[position, :new]
            v_cache[row, start:start + new] = new_v[position, :new]
            ends.append(start + new)
        longest = max(ends, default=0)
        rows = torch.tensor([self.rows[seq_id] for seq_id in order], device=k_cache.device)
        return k_cache[rows, :longest], v_cache[rows, :longest]

    def finish_step(self) -> None:
        """Closes the step: each sequence now holds its new tokens too."""
        self.sequences = OrderedDict((seq_id, self.sequences[seq_id] + new) for seq_id, new in self.step_dict.items())
