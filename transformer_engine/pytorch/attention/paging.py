"""Paged KV caches: pools of pages [pages, page_size, heads, dim] and a page table, int32
[b, pages per sequence], whose row i lists sequence i's pages in order (position j of the
sequence is row j % page_size of page page_table[i, j // page_size])."""
import torch
from torch import Tensor


def gather_pages(pool: Tensor, page_table: Tensor, tokens: int) -> Tensor:
    """The first `tokens` positions of every sequence of page_table from pool, [b, tokens,
    heads, dim] (a copy)."""
    b, page_size = page_table.shape[0], pool.shape[1]
    pages = -(-tokens // page_size)
    index = page_table[:, :pages].to(pool.device, torch.long).flatten()  # [b * pages]
    # [b * pages, page_size, h, d] -> [b, pages * page_size, h, d]
    return pool[index].view(b, pages * page_size, *pool.shape[2:])[:, :tokens]
