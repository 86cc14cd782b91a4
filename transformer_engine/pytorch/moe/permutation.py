"""TransformerEngine's MoE token permutation (its import path transformer_engine.pytorch.permutation), in plain
PyTorch: index_select / index_add over the token rows, so autograd differentiates them (no
kernel of ours; on GPUs these are PyTorch's gather / scatter kernels).

moe_permute groups the copies of the tokens by expert: expert 0's tokens first, in token order,
then expert 1's, and so on; with num_out_tokens, only that many rows are kept (later rows
dropped). row_id_map records where each copy went and is only meant for moe_unpermute:
    'mask'  map: routing_map [tokens, experts] (nonzero = routed), row_id_map [tokens, experts]
    'index' map: routing_map [tokens, top_k] expert indices, row_id_map [tokens, top_k]
holding the output row of each copy, -1 where it was dropped. moe_unpermute sums each token's
copies back into its row, weighted by merging_probs (same shape as routing_map) when given.
moe_permute_and_pad_with_probs also pads each expert's rows with zero rows up to a multiple of
align_size (FP8 GEMMs want aligned row counts): expert e's rows start at the sum of the padded
counts before it, pad_offsets[e] rows after where they would be unpadded; moe_unpermute given
pad_offsets reads them there. moe_sort_chunks_by_index reorders the chunks of split_sizes rows:
output chunk i is input chunk sorted_index[i].
"""
import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ["moe_permute", "moe_permute_with_probs", "moe_permute_and_pad_with_probs", "moe_unpermute",
           "moe_sort_chunks_by_index", "moe_sort_chunks_by_index_with_probs"]
_MAP_TYPES = ("mask", "index")


def _check_map_type(where: str, map_type: str) -> None:
    if map_type not in _MAP_TYPES:
        raise ValueError(f"{where}: map_type should be one of 'mask' or 'index', got {map_type!r}")


def _copies(routing_map: Tensor, map_type: str) -> Tuple[Tensor, Tensor]:
    """(token, slot) of every routed copy, ordered by expert then token: slot is the expert
    ('mask') or the top-k position ('index') the copy comes from."""
    if map_type == "mask":
        expert_major = routing_map.t().nonzero()  # [copies, 2]: (expert, token), expert-major
        return expert_major[:, 1], expert_major[:, 0]
    top_k = routing_map.shape[1]
    experts = routing_map.reshape(-1).long()  # [tokens, top_k] -> [tokens * top_k]
    order = torch.sort(experts, stable=True).indices  # by expert, then by (token, k)
    return order // top_k, order % top_k


def _row_id_map(routing_map: Tensor, token: Tensor, slot: Tensor, rows: int) -> Tensor:
    row_id_map = torch.full(routing_map.shape, -1, dtype=torch.int64, device=routing_map.device)
    kept = torch.arange(rows, device=routing_map.device)
    row_id_map[token[:rows], slot[:rows]] = kept
    return row_id_map


def _permute(inp: Tensor, routing_map: Tensor, num_out_tokens: int, map_type: str,
             probs: Optional[Tensor]) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    where = "moe_permute"
    _check_map_type(where, map_type)
    if inp.dim() != 2 or routing_map.shape[0] != inp.shape[0]:
        raise ValueError(f"{where}: inp must be [tokens, hidden] and routing_map have a row per token, got inp "
                         f"{list(inp.shape)} and routing_map {list(routing_map.shape)}")
    token, slot = _copies(routing_map, map_type)
    rows = token.numel() if num_out_tokens < 0 else min(num_out_tokens, token.numel())
    output = inp.index_select(0, token[:rows])
    permuted_probs = probs[token[:rows], slot[:rows]] if probs is not None else None
    return output, _row_id_map(routing_map, token, slot, rows), permuted_probs


def moe_permute(inp: Tensor, routing_map: Tensor, num_out_tokens: int = -1, max_token_num: int = -1,
                map_type: str = "mask") -> Tuple[Tensor, Tensor]:
    """(permuted [rows, hidden], row_id_map): the copies of inp's tokens grouped by expert.
    max_token_num (a workspace size in TE) changes nothing here."""
    output, row_id_map, _ = _permute(inp, routing_map, num_out_tokens, map_type, None)
    return output, row_id_map


def moe_permute_with_probs(inp: Tensor, probs: Tensor, routing_map: Tensor,
                           num_out_tokens: int = -1) -> Tuple[Tensor, Tensor, Tensor]:
    """(permuted, permuted_probs [rows], row_id_map) for a 'mask' routing_map and probs
    [tokens, experts]: each copy's probability beside it."""
    output, row_id_map, permuted_probs = _permute(inp, routing_map, num_out_tokens, "mask", probs)
    return output, permuted_probs, row_id_map


def moe_permute_and_pad_with_probs(inp: Tensor, probs: Tensor, routing_map: Tensor, tokens_per_expert: Tensor,
                                   align_size: int) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor], Tensor]:
    """(padded [sum(padded counts), hidden], padded_probs, row_id_map, pad_offsets, padded counts)
    for a 'mask' routing_map: moe_permute_with_probs with each expert's rows followed by zero
    rows (probability 0) up to a multiple of align_size. tokens_per_expert [experts] are the
    routed counts (routing_map's column sums); pad_offsets [experts] (int64) is None when no
    expert needed padding."""
    where = "moe_permute_and_pad_with_probs"
    if tokens_per_expert is None:
        raise ValueError(f"{where}: tokens_per_expert (the routed tokens of each expert) is required")
    if align_size <= 0:
        raise ValueError(f"{where}: align_size must be positive, got {align_size}")
    counts = tokens_per_expert.to(device=inp.device, dtype=torch.int64)
    routed = (routing_map != 0).sum(dim=0)
    if counts.shape != routed.shape or not torch.equal(counts, routed):
        raise ValueError(f"{where}: tokens_per_expert {counts.tolist()} must be routing_map's column sums "
                         f"{routed.tolist()}")
    padded_counts = (counts + align_size - 1) // align_size * align_size
    output, row_id_map, permuted_probs = _permute(inp, routing_map, -1, "mask", probs)
    if torch.equal(counts, padded_counts):
        return output, permuted_probs, row_id_map, None, padded_counts
    padding = padded_counts - counts  # [experts]
    pad_offsets = torch.cumsum(padding, 0) - padding  # exclusive: the padding before each expert
    rows = torch.arange(output.shape[0], device=inp.device)
    destination = rows + pad_offsets.repeat_interleave(counts)  # [rows]: each row moved past the padding before it
    total = int(padded_counts.sum())
    padded = output.new_zeros((total, output.shape[1])).index_copy(0, destination, output)
    padded_probs = permuted_probs.new_zeros(total).index_copy(0, destination, permuted_probs)
    return padded, padded_probs, row_id_map, pad_offsets, padded_counts


def moe_unpermute(inp: Tensor, row_id_map: Tensor, merging_probs: Optional[Tensor] = None,
                  restore_shape: Optional[torch.Size] = None, map_type: str = "mask",
                  probs: Optional[Tensor] = None, pad_offsets: Optional[Tensor] = None) -> Tensor:
    """[tokens, hidden]: each token's copies (rows of inp) summed back, weighted by
    merging_probs where given. probs is its former name. pad_offsets: inp is the padded output
    of moe_permute_and_pad_with_probs (a 'mask' map), whose fourth result it is."""
    where = "moe_unpermute"
    _check_map_type(where, map_type)
    if probs is not None:
        if merging_probs is not None:
            raise ValueError(f"{where}: both merging_probs and probs are given; probs is its deprecated name")
        warnings.warn("moe_unpermute: probs is deprecated, use merging_probs", DeprecationWarning)
        merging_probs = probs
    if pad_offsets is not None and map_type != "mask":
        raise ValueError(f"{where}: pad_offsets come with a 'mask' routing map (moe_permute_and_pad_with_probs)")
    token, slot = (row_id_map >= 0).nonzero(as_tuple=True)
    rows = row_id_map[token, slot]
    if pad_offsets is not None:  # slot is the expert: its rows start pad_offsets[expert] further on
        rows = rows + pad_offsets.to(rows.device, torch.int64)[slot]
    copies = inp.index_select(0, rows)
    if merging_probs is not None:
        copies = copies * merging_probs[token, slot].to(copies.dtype).unsqueeze(-1)
    tokens = row_id_map.shape[0] if restore_shape is None else restore_shape[0]
    out = copies.new_zeros((tokens, inp.shape[-1]))
    return out.index_add(0, token, copies)


def _chunk_order(split_sizes: Tensor, sorted_index: Tensor) -> Tensor:
    """The input row of each output row when chunk sorted_index[i] becomes output chunk i."""
    sizes = split_sizes.long()
    starts = torch.cumsum(sizes, 0) - sizes
    pieces = [torch.arange(int(starts[i]), int(starts[i] + sizes[i]), device=split_sizes.device)
              for i in sorted_index.tolist()]
    return torch.cat(pieces) if pieces else sizes.new_zeros(0)


def moe_sort_chunks_by_index(inp: Tensor, split_sizes: Tensor, sorted_index: Tensor) -> Tensor:
    """inp's row chunks (split_sizes rows each) reordered: output chunk i is chunk sorted_index[i]."""
    return inp.index_select(0, _chunk_order(split_sizes, sorted_index))


def moe_sort_chunks_by_index_with_probs(inp: Tensor, probs: Tensor, split_sizes: Tensor,
                                        sorted_index: Tensor) -> Tuple[Tensor, Tensor]:
    """moe_sort_chunks_by_index of inp and of probs [rows] alike."""
    order = _chunk_order(split_sizes, sorted_index)
    return inp.index_select(0, order), probs.index_select(0, order)
