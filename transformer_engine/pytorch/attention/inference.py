"""InferenceParams: TransformerEngine's key/value cache for incremental decoding, paged or not.

    params = InferenceParams(max_batch_size=4, max_sequence_length=128, num_heads_kv=8, head_dim_k=64,
                             dtype=torch.bfloat16)
    params.pre_step(OrderedDict({seq_id: new_tokens, ...}))  # the batch of this step, in batch order
    out = model(x, attn_mask_type="padding_causal", inference_params=params)

pre_step() opens a step: each sequence of step_dict holds its cached tokens plus step_dict[seq]
new ones; sequences absent from it are dropped. Every attention layer (DotProductAttention,
through MultiheadAttention / TransformerLayer) then calls step(layer_number, new_k, new_v,
qkv_format): the new keys and values go into the layer's cache, [max_batch_size,
max_sequence_length, heads, dim] (bshd, whatever the input format), and the layer attends over
the cache. Row i of every cache holds the i-th sequence of the step: pre_step moves the rows of
sequences that stay when the batch changes (TE's re-indexing). cu_seqlens_q / cu_seqlens_kv
[max_batch_size + 1] (int32; the entries past the batch repeat the total) give this step's new
and total lengths, pre_step_seqlens [max_batch_size] the lengths before the step (RoPE's start
positions).

With is_paged=True the caches are pools of pages instead, [total_num_pages, page_size, heads,
dim]: each sequence takes pages as it grows and gives them back when it leaves the batch; row i
of page_table [max_batch_size, max_sequence_length / page_size] lists the pages of the step's
i-th sequence. Custom cache managers are not implemented (NotImplementedError).
"""
import itertools
import logging
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..utils import default_device
from .paging import gather_pages

FORMATS = ("bshd", "sbhd", "thd")


class KVCacheManager:
    """What both cache layouts share (TE's base class of its cache managers): the sizes, the
    sequences held ({seq_id: tokens after this step}, in batch order) and each layer's k and
    v caches, of shape cache_shape + [heads, head_dim_k or head_dim_v]."""

    def __init__(self, max_batch_size: int, max_seqlen: int, num_heads: int, head_dim_k: int, dtype: torch.dtype,
                 head_dim_v: Optional[int], cache_shape: Tuple[int, int]):
        self.max_batch_size = max_batch_size
        self.max_seqlen = max_seqlen
        self.num_heads = num_heads
        self.head_dim_k = head_dim_k
        self.head_dim_v = head_dim_v if head_dim_v is not None else head_dim_k
        self.dtype = dtype
        self.cache_shape = cache_shape
        self.sequences: "OrderedDict[int, int]" = OrderedDict()
        self.cache: Dict[int, Tuple[Tensor, Tensor]] = {}

    def allocate_memory(self, layer_number: int) -> None:
        device, shape = default_device(), (*self.cache_shape, self.num_heads)
        self.cache[layer_number] = (torch.zeros(*shape, self.head_dim_k, dtype=self.dtype, device=device),
                                    torch.zeros(*shape, self.head_dim_v, dtype=self.dtype, device=device))


class NonPagedKVCacheManager(KVCacheManager):
    """The caches of every layer, [max_batch_size, max_seqlen, heads, dim] each for k and v."""

    def __init__(self, max_batch_size: int, max_seqlen: int, num_heads: int, head_dim_k: int, dtype: torch.dtype,
                 head_dim_v: Optional[int] = None):
        super().__init__(max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v,
                         (max_batch_size, max_seqlen))

    def reset(self) -> None:
        """Forgets every sequence (the cache memory is kept)."""
        self.sequences = OrderedDict()

    def pre_step(self, step_dict: "OrderedDict[int, int]") -> "OrderedDict[int, int]":
        """The sequences after this step, in step_dict's order; the cached tokens of those that
        stay are moved to their new rows in every allocated layer."""
        before = self.sequences
        rows = {seq_id: row for row, seq_id in enumerate(before)}
        staying = [seq_id for seq_id in step_dict if seq_id in rows]
        # Row i takes the tokens of step_dict's i-th sequence; new sequences take any row (their
        # cached part is empty).
        sources = [rows[seq_id] if seq_id in rows else i for i, seq_id in enumerate(step_dict)]
        if sources != list(range(len(sources))) and staying:
            longest = max(before[seq_id] for seq_id in staying)
            for k_cache, v_cache in self.cache.values():
                index = torch.tensor(sources, device=k_cache.device)
                k_cache[:len(sources), :longest] = k_cache[index, :longest]  # the gather copies first
                v_cache[:len(sources), :longest] = v_cache[index, :longest]
        self.sequences = OrderedDict((seq_id, before.get(seq_id, 0) + new) for seq_id, new in step_dict.items())
        return self.sequences

    def step(self, layer_number: int, new_k: Tensor, new_v: Tensor, new_lengths: List[int], cached_lengths: List[int],
             qkv_format: str) -> Tuple[Tensor, Tensor]:
        """Writes each sequence's new tokens after its cached ones; returns the caches of the
        batch's rows, [b, max_seqlen, heads, dim]. new_k / new_v: [b, s, h, d] (bshd), [s, b, h, d]
        (sbhd; the first new_lengths[i] tokens of sequence i are new, the rest padding) or
        [t, h, d] (thd, the sequences one after another)."""
        k_cache, v_cache = self.cache[layer_number]
        for i, k, v, total in _new_tokens(new_k, new_v, new_lengths, cached_lengths, qkv_format):
            k_cache[i, total - len(k):total] = k
            v_cache[i, total - len(k):total] = v
        batch = len(new_lengths)
        return k_cache[:batch], v_cache[:batch]

    def gather(self, layer_number: int, batch: int, tokens: int) -> Tuple[Tensor, Tensor]:
        """The first `tokens` positions of the batch's sequences, [batch, tokens, heads, dim]: views."""
        k_cache, v_cache = self.cache[layer_number]
        return k_cache[:batch, :tokens], v_cache[:batch, :tokens]


class PagedKVCacheManager(KVCacheManager):
    """The caches of every layer as pools of pages, [total_num_pages, page_size, heads, dim]
    each for k and v; the pages each sequence holds, in order; page_table [max_batch_size,
    max_seqlen / page_size] int32, row i the pages of the step's i-th sequence (0 past them)."""

    def __init__(self, total_num_pages: int, page_size: int, num_heads: int, head_dim_k: int, dtype: torch.dtype,
                 max_batch_size: int, max_seqlen: int, head_dim_v: Optional[int] = None):
        super().__init__(max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v,
                         (total_num_pages, page_size))
        self.total_num_pages = total_num_pages
        self.page_size = page_size
        self.max_pages_per_seq = max_seqlen // page_size
        self.page_table = torch.zeros(max_batch_size, self.max_pages_per_seq, dtype=torch.int32,
                                      device=default_device())
        self.reset()

    def reset(self) -> None:
        """Forgets every sequence and frees every page."""
        self.sequences = OrderedDict()
        self.free_pages: List[int] = list(range(self.total_num_pages))
        self.pages: Dict[int, List[int]] = {}
        self.page_table.zero_()

    def pre_step(self, step_dict: "OrderedDict[int, int]") -> "OrderedDict[int, int]":
        """The sequences after this step, in step_dict's order: those that left give their pages
        back, then each takes the pages its new tokens need."""
        before = self.sequences
        leaving = [seq_id for seq_id in before if seq_id not in step_dict]
        sequences = OrderedDict((seq_id, before.get(seq_id, 0) + new) for seq_id, new in step_dict.items())
        needed = sum(-(-total // self.page_size) - len(self.pages.get(seq_id, []))
                     for seq_id, total in sequences.items())
        free = len(self.free_pages) + sum(len(self.pages[seq_id]) for seq_id in leaving)
        if needed > free:  # checked before anything changes
            raise RuntimeError(f"InferenceParams: the paged KV cache is full: this step needs {needed} more pages, "
                               f"{free} of {self.total_num_pages} are free")
        for seq_id in leaving:
            self.free_pages.extend(self.pages.pop(seq_id))
        self.sequences = sequences
        rows = []
        for seq_id, total in self.sequences.items():
            pages = self.pages.setdefault(seq_id, [])
            while len(pages) * self.page_size < total:
                pages.append(self.free_pages.pop(0))
            rows.append(pages + [0] * (self.max_pages_per_seq - len(pages)))
        if rows:
            self.page_table[:len(rows)].copy_(torch.tensor(rows, dtype=torch.int32))
        return self.sequences

    def print_cache(self) -> None:
        """TE's report of the pages (at debug level on the "PagedKVCacheManager" logger): the
        pages used and free, then each sequence's tokens and pages."""
        logger = logging.getLogger("PagedKVCacheManager")
        used = sum(len(self.pages.get(seq_id, [])) for seq_id in self.sequences)
        logger.debug("Cache status: %s pages (used %s, free %s), %s sequences", self.total_num_pages, used,
                     len(self.free_pages), len(self.sequences))
        for index, (seq_id, tokens) in enumerate(self.sequences.items()):
            pages = self.pages.get(seq_id, [])
            logger.debug("  batch index %s: seq_id %s, %s tokens, %s pages %s", index, seq_id, tokens, len(pages), pages)

    def step(self, layer_number: int, new_k: Tensor, new_v: Tensor, new_lengths: List[int], cached_lengths: List[int],
             qkv_format: str) -> Tuple[Tensor, Tensor]:
        """Writes each sequence's new tokens into its pages; returns the page pools."""
        k_cache, v_cache = self.cache[layer_number]
        for i, k, v, total in _new_tokens(new_k, new_v, new_lengths, cached_lengths, qkv_format):
            positions = torch.arange(total - len(k), total, device=k_cache.device)
            pages = self.page_table[i].to(k_cache.device, torch.long)[positions // self.page_size]
            k_cache[pages, positions % self.page_size] = k
            v_cache[pages, positions % self.page_size] = v
        return k_cache, v_cache

    def gather(self, layer_number: int, batch: int, tokens: int) -> Tuple[Tensor, Tensor]:
        """The first `tokens` positions of the batch's sequences, [batch, tokens, heads, dim]:
        their pages gathered (a copy)."""
        return tuple(gather_pages(cache, self.page_table[:batch], tokens) for cache in self.cache[layer_number])


def _new_tokens(new_k: Tensor, new_v: Tensor, new_lengths: List[int], cached_lengths: List[int], qkv_format: str):
    """(batch index, new keys, new values, the sequence's total length) per sequence of the
    step, from bshd [b, s, ...] / sbhd [s, b, ...] inputs (the first new_lengths[i] tokens of
    sequence i are new, the rest padding) or thd [t, ...] (the sequences one after another)."""
    offset = 0
    for i, (new, total) in enumerate(zip(new_lengths, cached_lengths)):
        if qkv_format == "bshd":
            yield i, new_k[i, :new], new_v[i, :new], total
        elif qkv_format == "sbhd":
            yield i, new_k[:new, i], new_v[:new, i], total
        else:
            yield i, new_k[offset:offset + new], new_v[offset:offset + new], total
            offset += new


def _cumulative(lengths: List[int], size: int) -> List[int]:
    """[0, l0, l0 + l1, ...] padded to `size` entries with the total."""
    sums = list(itertools.accumulate(lengths, initial=0))
    return sums + [sums[-1]] * (size - len(sums))


class InferenceParams:
    """TransformerEngine's KV cache: see the module docstring. Arguments as TE's:
    max_batch_size, max_sequence_length, num_heads_kv, head_dim_k, dtype (these three required,
    as since TE 2.2), head_dim_v (default head_dim_k), is_paged with page_size (dividing
    max_sequence_length) and total_num_pages (= max_batch_size * max_sequence_length /
    page_size, as TE requires), max_ctx_len (required for qkv_format='thd'), qkv_format (the
    format of the attention inputs), custom_cache_manager (not implemented)."""

    def __init__(self, max_batch_size: int, max_sequence_length: int, num_heads_kv: Optional[int] = None,
                 head_dim_k: Optional[int] = None, dtype: Optional[torch.dtype] = None,
                 head_dim_v: Optional[int] = None, is_paged: bool = False, total_num_pages: Optional[int] = None,
                 page_size: Optional[int] = None, max_ctx_len: Optional[int] = None, qkv_format: str = "bshd",
                 custom_cache_manager=None) -> None:
        if custom_cache_manager is not None:
            raise NotImplementedError("InferenceParams: custom KV cache managers are not implemented")
        for name, value in (("max_batch_size", max_batch_size), ("max_sequence_length", max_sequence_length)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"InferenceParams: {name} must be a positive int, got {value!r}")
        missing = [name for name, value in (("num_heads_kv", num_heads_kv), ("head_dim_k", head_dim_k),
                                            ("dtype", dtype)) if value is None]
        if missing:
            raise ValueError(f"InferenceParams: {', '.join(missing)} must be given (required since TE 2.2)")
        if qkv_format not in FORMATS:
            raise ValueError(f"InferenceParams: qkv_format must be one of {FORMATS}, got {qkv_format!r}")
        if qkv_format == "thd" and max_ctx_len is None:
            raise ValueError("InferenceParams: qkv_format='thd' needs max_ctx_len")
        self.max_batch_size = max_batch_size
        self.max_sequence_length = max_sequence_length
        self.num_heads_kv = num_heads_kv
        self.head_dim_k = head_dim_k
        self.head_dim_v = head_dim_v if head_dim_v is not None else head_dim_k
        self.dtype = dtype
        self.is_paged = bool(is_paged)
        self.max_ctx_len = max_ctx_len
        if self.is_paged:
            _check_pages(max_batch_size, max_sequence_length, page_size, total_num_pages)
            self.page_size, self.total_num_pages = page_size, total_num_pages
            self.cache_manager = PagedKVCacheManager(total_num_pages, page_size, num_heads_kv, head_dim_k, dtype,
                                                     max_batch_size, max_sequence_length, self.head_dim_v)
        else:
            self.cache_manager = NonPagedKVCacheManager(max_batch_size, max_sequence_length, num_heads_kv,
                                                        head_dim_k, dtype, self.head_dim_v)
        self.cache_qkv_format = "bshd"
        self.input_qkv_format = qkv_format
        self.output_qkv_format = self._output_format(qkv_format)
        self.sequences: "OrderedDict[int, int]" = OrderedDict()  # seq_id -> tokens after this step
        self.sequences_pre_step: "OrderedDict[int, int]" = OrderedDict()  # seq_id -> tokens before it
        self.step_lengths: List[int] = []
        self.batch_size = 0
        device = default_device()
        self.cu_seqlens_q = torch.zeros(max_batch_size + 1, dtype=torch.int32, device=device)
        self.cu_seqlens_kv = torch.zeros(max_batch_size + 1, dtype=torch.int32, device=device)
        self.pre_step_seqlens = torch.zeros(max_batch_size, dtype=torch.int32, device=device)

    def _output_format(self, qkv_format: str) -> str:
        """TE's name for the layout after step(): the cache is bshd, e.g. 'sbhd_2bshd'."""
        return qkv_format if qkv_format == self.cache_qkv_format else f"{qkv_format}_2{self.cache_qkv_format}"

    def __repr__(self) -> str:
        size = (f"total_pages={self.total_num_pages}, page_size={self.page_size}" if self.is_paged
                else f"max_batch_size={self.max_batch_size}, max_seqlen={self.max_sequence_length}")
        return (f"dtype={self.dtype}, is_paged={self.is_paged}, {size}, num_heads={self.num_heads_kv}, "
                f"head_dim_k={self.head_dim_k}, head_dim_v={self.head_dim_v}")

    def reset(self) -> None:
        """Forgets every sequence (the cache memory is kept)."""
        self.sequences = OrderedDict()
        self.sequences_pre_step = OrderedDict()
        self.step_lengths = []
        self.batch_size = 0
        self.cache_manager.reset()

    def allocate_memory(self, layer_number: int) -> None:
        """The k and v caches of one layer, [max_batch_size, max_sequence_length, heads, dim]."""
        self.cache_manager.allocate_memory(layer_number)

    def pre_step(self, step_dict: "OrderedDict[int, int]") -> None:
        """Opens a step: step_dict maps each sequence of the batch, in batch order, to its number
        of new tokens."""
        if len(step_dict) > self.max_batch_size:
            raise ValueError(f"InferenceParams.pre_step: {len(step_dict)} sequences, max_batch_size is "
                             f"{self.max_batch_size}")
        for seq_id, new in step_dict.items():
            if not isinstance(new, int) or new < 0:
                raise ValueError(f"InferenceParams.pre_step: sequence {seq_id} has {new!r} new tokens; expected an "
                                 "int >= 0")
            total = self.cache_manager.sequences.get(seq_id, 0) + new
            if total > self.max_sequence_length:
                raise ValueError(f"InferenceParams.pre_step: sequence {seq_id} would hold {total} tokens, "
                                 f"max_sequence_length is {self.max_sequence_length}")
        self.batch_size = len(step_dict)
        self.sequences = self.cache_manager.pre_step(OrderedDict(step_dict))
        self.step_lengths = list(step_dict.values())
        self.sequences_pre_step = OrderedDict((seq_id, total - step_dict[seq_id])
                                              for seq_id, total in self.sequences.items())
        size = self.max_batch_size
        pre = list(self.sequences_pre_step.values())
        # One host-to-device copy each, into the same buffers (their addresses stay).
        self.pre_step_seqlens.copy_(torch.tensor(pre + [0] * (size - len(pre)), dtype=torch.int32))
        self.cu_seqlens_q.copy_(torch.tensor(_cumulative(self.step_lengths, size + 1), dtype=torch.int32))
        self.cu_seqlens_kv.copy_(torch.tensor(_cumulative(list(self.sequences.values()), size + 1),
                                              dtype=torch.int32))

    def get_seqlens_pre_step(self) -> Tensor:
        """The cached lengths before this step, [max_batch_size] int32 (the step's RoPE offsets)."""
        return self.pre_step_seqlens

    def convert_paged_to_nonpaged(self, layer_number: int) -> Tuple[Tensor, Tensor]:
        """A paged layer's k and v as the batch's sequences, [b, max_sequence_length, heads, dim]."""
        return self.cache_manager.gather(layer_number, self.batch_size, self.max_sequence_length)

    def cached(self, layer_number: int, tokens: int) -> Tuple[Tensor, Tensor]:
        """The first `tokens` positions of the batch's cached k and v, [b, tokens, heads, dim]
        (a view of a non-paged cache, a gather of a paged one)."""
        return self.cache_manager.gather(layer_number, self.batch_size, tokens)

    def step(self, layer_number: int, new_k: Tensor, new_v: Tensor, qkv_format: str):
        """Copies the new keys and values into layer_number's cache. Returns (k_cache, v_cache,
        cu_seqlens_q, cu_seqlens_kv, max_sequence_length, the layout name: 'bshd', 'sbhd_2bshd'
        or 'thd_2bshd'), as TE's: the caches are [b, max_sequence_length, heads, dim], or the
        page pools [total_num_pages, page_size, heads, dim] when paged. A bshd / sbhd input may
        hold up to max_batch_size rows (TE's CUDA-graph steps keep the batch at that size): the
        rows past the step's sequences are padding."""
        if qkv_format not in FORMATS:
            raise ValueError(f"InferenceParams.step: qkv_format must be one of {FORMATS}, got {qkv_format!r}")
        batch_dim = {"bshd": 0, "sbhd": 1}.get(qkv_format)
        # A batch padded up to max_batch_size (TE's CUDA-graph steps, whose shapes stay fixed):
        # the rows past the step's sequences are padding, as their zero lengths in cu_seqlens say.
        if batch_dim is not None and not self.batch_size <= new_k.shape[batch_dim] <= self.max_batch_size:
            raise ValueError(f"InferenceParams.step: new_k {tuple(new_k.shape)} ({qkv_format}) holds "
                             f"{new_k.shape[batch_dim]} sequences, the step (pre_step) has {self.batch_size} and "
                             f"max_batch_size is {self.max_batch_size}")
        if qkv_format == "thd" and new_k.shape[0] < sum(self.step_lengths):
            raise ValueError(f"InferenceParams.step: new_k {tuple(new_k.shape)} (thd) holds {new_k.shape[0]} tokens, "
                             f"the step's sequences have {sum(self.step_lengths)} new ones")
        if layer_number not in self.cache_manager.cache:
            self.allocate_memory(layer_number)
        self.input_qkv_format = qkv_format
        self.output_qkv_format = self._output_format(qkv_format)
        k_cache, v_cache = self.cache_manager.step(layer_number, new_k, new_v, self.step_lengths,
                                                   list(self.sequences.values()), qkv_format)
        return (k_cache, v_cache, self.cu_seqlens_q, self.cu_seqlens_kv, self.max_sequence_length,
                self.output_qkv_format)


def _check_pages(max_batch_size: int, max_sequence_length: int, page_size: Optional[int],
                 total_num_pages: Optional[int]) -> None:
    """TE's requirements on a paged cache's sizes."""
    if not isinstance(page_size, int) or page_size <= 0 or max_sequence_length % page_size:
        raise ValueError(f"InferenceParams: a paged cache needs page_size, a positive int dividing "
                         f"max_sequence_length={max_sequence_length}, got {page_size!r}")
    want = max_batch_size * (max_sequence_length // page_size)
    if total_num_pages != want:
        raise ValueError(f"InferenceParams: a paged cache needs total_num_pages = max_batch_size * "
                         f"max_sequence_length / page_size = {want}, got {total_num_pages!r}")
