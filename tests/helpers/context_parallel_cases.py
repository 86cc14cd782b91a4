"""What each rank of tests/distributed/test_context_parallel.py runs: te.DotProductAttention with the world
(2 gloo ranks) as cp_group, on this rank's shard of the sequence, against the same module on
the whole sequence (CP=1), which every rank also runs. Compared on this rank's shard: the
output and the gradients of q, k and v (a rank's dK/dV are those of its own keys, summed over
every rank's queries: the whole sequence's gradient there). The same for te.TransformerLayer
with RoPE (set_context_parallel_group), whose parameter gradients are summed over the ranks.

Shards (TransformerEngine's load-balanced split): the sequence is cut into 2 cp chunks and rank
r holds chunks r and 2 cp - 1 - r; thd cuts each packed sequence's padded slot that way.
"""
import dataclasses
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

import transformer_engine.pytorch as te

BATCH, SEQ, HEADS, DIM = 2, 16, 4, 8
# thd: each sequence's padded slot (a multiple of 2 cp = 4 tokens) and its real tokens: an empty
# sequence, and one whose tokens all lie on rank 0 (rank 1 holds only its padding)
THD_SLOTS, THD_LENGTHS = (8, 4, 0, 12), (7, 4, 0, 2)
HIDDEN = 32


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    comm: str  # cp_comm_type
    fmt: str  # qkv_format
    mask: str  # attn_mask_type
    dtype: torch.dtype = torch.float32
    groups: int = 2  # num_gqa_groups: GQA, 2 key/value heads for the 4 query heads
    seq_kv: int = SEQ  # the global key/value length (sbhd / bshd): longer for cross attention
    dv: int = DIM  # the value head dim
    window: Optional[Tuple[int, int]] = None
    a2a_over: str = "world"  # 'a2a+p2p': which of its two groups is the world (the other is the rank alone)


def cases() -> List[Case]:
    found = []
    for comm in ("p2p", "all_gather", "a2a"):
        for fmt in ("bshd", "sbhd", "thd"):
            for mask in ("no_mask", "causal"):
                found.append(Case(f"{comm}-{fmt}-{mask}", comm, fmt, mask))
        found += [Case(f"{comm}-bshd-causal-bf16", comm, "bshd", "causal", dtype=torch.bfloat16),
                  Case(f"{comm}-sbhd-causal-mha-dv12", comm, "sbhd", "causal", groups=HEADS, dv=12),
                  Case(f"{comm}-bshd-cross-causal_bottom_right", comm, "bshd", "causal_bottom_right", seq_kv=24),
                  Case(f"{comm}-bshd-no_mask-window", comm, "bshd", "no_mask", window=(2, 2)),
                  Case(f"{comm}-thd-causal-window", comm, "thd", "causal", window=(3, 0))]
    for over in ("a2a", "p2p"):  # two ranks: the a2a level or the ring level holds both
        for fmt in ("bshd", "thd"):
            found.append(Case(f"a2a+p2p-{over}-{fmt}-causal", "a2a+p2p", fmt, "causal", a2a_over=over))
    return found


LAYER_COMMS = ("p2p", "all_gather", "a2a")


def _chunks(starts: List[int], chunks: List[int], rank: int, world: int) -> torch.Tensor:
    """The indices of rank's chunks rank and 2 world - 1 - rank of each run [start, start + 2 world chunk)."""
    pieces = []
    for start, chunk in zip(starts, chunks):
        for index in (rank, 2 * world - 1 - rank):
            pieces.append(start + index * chunk + torch.arange(chunk))
    return torch.cat(pieces)


def _seq_index(length: int, rank: int, world: int) -> torch.Tensor:
    return _chunks([0], [length // (2 * world)], rank, world)


def _thd_index(rank: int, world: int) -> torch.Tensor:
    starts = [sum(THD_SLOTS[:i]) for i in range(len(THD_SLOTS))]
    return _chunks(starts, [slot // (2 * world) for slot in THD_SLOTS], rank, world)


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _input_shape(fmt: str, seq: int, heads: int, dim: int) -> Tuple[int, ...]:
    return {"sbhd": (seq, BATCH, heads, dim), "bshd": (BATCH, seq, heads, dim), "thd": (seq, heads, dim)}[fmt]


def _diff(got: torch.Tensor, want: torch.Tensor, what: str):
    return what, (got.float() - want.float()).abs().max().item(), want.float().abs().max().item()


def _cp_group(case: Case, rank: int, alone: List[object]):
    if case.comm != "a2a+p2p":
        return dist.group.WORLD
    return [dist.group.WORLD, alone[rank]] if case.a2a_over == "a2a" else [alone[rank], dist.group.WORLD]


def _run(case: Case, rank: int, world: int, alone: List[object]) -> dict:
    torch.manual_seed(0)
    fmt = case.fmt
    seq_q, seq_kv = (sum(THD_SLOTS), sum(THD_SLOTS)) if fmt == "thd" else (SEQ, case.seq_kv)
    q = torch.randn(_input_shape(fmt, seq_q, HEADS, DIM)).to(case.dtype)
    k = torch.randn(_input_shape(fmt, seq_kv, case.groups, DIM)).to(case.dtype)
    v = torch.randn(_input_shape(fmt, seq_kv, case.groups, case.dv)).to(case.dtype)
    dout = torch.randn(*q.shape[:-2], HEADS * case.dv).to(case.dtype)
    kwargs = {}
    if fmt == "thd":
        cu, cu_padded = _cu(THD_LENGTHS), _cu(THD_SLOTS)
        kwargs = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded, cu_seqlens_kv_padded=cu_padded)
        index_q = index_kv = _thd_index(rank, world)
    else:
        index_q, index_kv = _seq_index(seq_q, rank, world), _seq_index(seq_kv, rank, world)
    seq_dim = 1 if fmt == "bshd" else 0
    build = dict(num_gqa_groups=case.groups, qkv_format=fmt, attn_mask_type=case.mask, window_size=case.window,
                 attention_dropout=0.0)
    full = te.DotProductAttention(HEADS, (DIM, case.dv), **build)
    parallel = te.DotProductAttention(HEADS, (DIM, case.dv), cp_group=_cp_group(case, rank, alone),
                                      cp_comm_type=case.comm, **build)

    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = full(*whole, **kwargs)
    expected.backward(dout)
    indices = (index_q, index_kv, index_kv)
    shards = [t.index_select(seq_dim, index).requires_grad_() for t, index in zip((q, k, v), indices)]
    out = parallel(*shards, **kwargs)
    out.backward(dout.index_select(seq_dim, index_q))
    checks = [_diff(out, expected.detach().index_select(seq_dim, index_q), "out")]
    for name, shard, grown, index in zip("qkv", shards, whole, indices):
        checks.append(_diff(shard.grad, grown.grad.index_select(seq_dim, index), f"d{name}"))
    return {"checks": checks, "backend": parallel.last_backend}


def _layer(comm: str, rank: int, world: int) -> list:
    """te.TransformerLayer (bshd, causal, GQA, RoPE) at CP=2 against CP=1 with the same weights."""
    torch.manual_seed(0)
    build = dict(num_gqa_groups=2, hidden_dropout=0.0, attention_dropout=0.0, attn_input_format="bshd")
    full = te.TransformerLayer(HIDDEN, 64, HEADS, **build)
    parallel = te.TransformerLayer(HIDDEN, 64, HEADS, **build)
    parallel.load_state_dict(full.state_dict())
    parallel.set_context_parallel_group(dist.group.WORLD, list(range(world)), None, comm)
    freqs = te.RotaryPositionEmbedding(HIDDEN // HEADS)(SEQ)
    x = torch.randn(BATCH, SEQ, HIDDEN)
    dy = torch.randn(BATCH, SEQ, HIDDEN)
    index = _seq_index(SEQ, rank, world)
    whole = x.clone().requires_grad_()
    expected = full(whole, rotary_pos_emb=freqs)
    expected.backward(dy)
    shard = x.index_select(1, index).requires_grad_()
    out = parallel(shard, rotary_pos_emb=freqs)
    out.backward(dy.index_select(1, index))
    checks = [_diff(out, expected.detach().index_select(1, index), "out"),
              _diff(shard.grad, whole.grad.index_select(1, index), "dx")]
    for (name, p_full), p_cp in zip(full.named_parameters(), parallel.parameters()):
        grad = p_cp.grad.clone()
        dist.all_reduce(grad)  # each rank's share of the parameter gradient: its tokens'
        checks.append(_diff(grad, p_full.grad, f"d{name}"))
    return checks


def _error(call) -> str:
    try:
        call()
    except (ValueError, NotImplementedError) as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def _refusals(rank: int, world: int) -> Dict[str, str]:
    """The error each unsupported call raises at CP=2."""
    group = dist.group.WORLD

    def dpa(**kwargs):
        return te.DotProductAttention(HEADS, DIM, num_gqa_groups=2, cp_group=group, **{"qkv_format": "bshd", **kwargs})

    q, kv = torch.randn(BATCH, 8, HEADS, DIM), torch.randn(BATCH, 8, 2, DIM)
    thd_q, thd_kv = torch.randn(6, HEADS, DIM), torch.randn(6, 2, DIM)
    cu = torch.tensor([0, 6, 12], dtype=torch.int32)  # slots of 6 tokens: not multiples of 2 cp
    one_group = te.DotProductAttention(HEADS, DIM, num_gqa_groups=1, qkv_format="bshd", cp_group=group,
                                       cp_comm_type="a2a")
    return {
        "dropout": _error(lambda: dpa(attention_dropout=0.1)(q, kv, kv)),
        "padding": _error(lambda: dpa(attn_mask_type="padding")(q, kv, kv)),
        "bias": _error(lambda: dpa()(q, kv, kv, core_attention_bias_type="post_scale_bias",
                                     core_attention_bias=torch.zeros(1, 1, 8, 8))),
        "odd_shard": _error(lambda: dpa()(q[:, :7], kv[:, :7], kv[:, :7])),
        "heads": _error(lambda: one_group(q, kv[:, :, :1], kv[:, :, :1])),
        "thd_slots": _error(lambda: dpa(qkv_format="thd")(thd_q, thd_kv, thd_kv, cu_seqlens_q=cu, cu_seqlens_kv=cu)),
        "kv_cache": _error(lambda: dpa(layer_number=1)(q, kv, kv, inference_params=object())),
    }


def run_all(rank: int, world: int) -> dict:
    alone = [dist.new_group([r]) for r in range(world)]  # every rank creates every group, in order
    results = {case.name: _run(case, rank, world, alone) for case in cases()}
    results["layers"] = {comm: _layer(comm, rank, world) for comm in LAYER_COMMS}
    results["refusals"] = _refusals(rank, world)
    return results
