"""Flash-decoding and paged KV caches in Triton (transformer_engine/pytorch/triton/attention_decode.py,
reached through triton/attention.py's flash_attention_fwd) against the float64 reference and, on
CPU tensors in Triton's interpreter, the CPU kernel on the same call: contiguous and paged caches
(shuffled pages, a page size that does not divide the lengths, sequences of different lengths, an
empty one, rows that see no key), one and several query tokens, masks, GQA / MQA, dk != dv, ALiBi,
sinks, the max logit, fp32 and bf16; paged == contiguous bit for bit; any split count against the
reference, and the same bits run to run; split_count(); the routing; and that the kernels compile
for sm_90 and sm_100 with no float64 arithmetic (tests/helpers/triton_harness.py).

The interpreter's calls are small, so the `splits` fixture sets the split count that
split_count() would choose for a long cache on a GPU."""
import pytest
import torch

from backends import TRITON_DEVICE as DEVICE
from flash_attention_check import fwd_args
from numerics import assert_close
from triton_harness import POINTER, assert_compiles
from transformer_engine.pytorch import reference

triton = pytest.importorskip("triton")
from transformer_engine.pytorch.triton import attention as kernels  # noqa: E402
from transformer_engine.pytorch.triton import attention_decode as decode  # noqa: E402

ops = torch.ops.portable_te


@pytest.fixture
def splits(monkeypatch):
    """splits(n): the calls after it cut each program's keys into n parts."""
    def set_count(n):
        monkeypatch.setattr(decode, "split_count", lambda keys, programs, slots: n)
    return set_count


def _run(q, k, v, dtype, **options):
    """The Triton forward of one call (k, v contiguous or pools with a page_table) against the
    float64 reference and, on the CPU, the CPU kernel; returns (out, lse, max_logit)."""
    ours = [t.to(dtype).to(DEVICE) for t in (q, k, v)]
    extra = {name: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for name, t in options.items()}
    out, lse, max_logit = kernels.flash_attention_fwd(*fwd_args(*ours, scale=0.3, last=True, **extra))
    exact = [t.to(dtype).double() for t in (q, k, v)]
    ref_options = {name: (t.double() if name == "softmax_offset" else t) for name, t in options.items()}
    want_out, want_lse, want_logit = reference.flash_attention_fwd(*fwd_args(*exact, scale=0.3, last=True,
                                                                             **ref_options))
    assert out.dtype == dtype and lse.dtype == torch.float64
    assert_close(out.cpu(), want_out, dtype=dtype, name="out")
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), seen)
    torch.testing.assert_close(lse.cpu()[seen], want_lse[seen], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(max_logit.cpu().double(), want_logit.double(), rtol=1e-5, atol=1e-5)
    if DEVICE.type == "cpu":  # the CPU kernel on the same call
        cpu_out = ops.flash_attention_fwd(*fwd_args(*[t.cpu() for t in ours], scale=0.3, last=True, **options))[0]
        assert_close(out, cpu_out, dtype=dtype, name="out against the CPU kernel")
    return out, lse, max_logit


def _paged(x, lengths, page_size, generator):
    """x [b, g, s, d] -> (pool [pages, page_size, g, d] with sequence i's first lengths[i] tokens
    on shuffled pages and noise everywhere else, page_table int32 [b, ceil(s / page_size)])."""
    b, g, s, d = x.shape
    per_sequence = -(-s // page_size)
    pages = b * per_sequence + 2  # two spare pages
    table = torch.randperm(pages, generator=generator)[:b * per_sequence].view(b, per_sequence)
    pool = torch.randn(pages * page_size, g, d, generator=generator)  # rows of all pages
    for i, length in enumerate(lengths):
        j = torch.arange(length)
        pool[table[i, j // page_size] * page_size + j % page_size] = x[i, :, :length].transpose(0, 1)
    return pool.view(pages, page_size, g, d), table.to(torch.int32)


def _packed(x, lengths):
    """x [b, h, s, d] -> [sum of lengths, h, d]: sequence i's first lengths[i] tokens."""
    return torch.cat([x[i, :, :n].transpose(0, 1) for i, n in enumerate(lengths)])


def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


MASKS = {"none": ((-1, -1), False), "causal": ((-1, 0), False), "causal_bottom_right": ((-1, 0), True),
         "window": ((40, 0), True)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("sq", [1, 4])
@pytest.mark.parametrize("mask", MASKS)
def test_contiguous_decode(mask, sq, dtype, splits):
    splits(3)
    window, bottom_right = MASKS[mask]
    q, k, v = torch.randn(2, 4, sq, 32), torch.randn(2, 2, 300, 32), torch.randn(2, 2, 300, 16)
    _run(q, k, v, dtype, window=window, bottom_right=bottom_right)


@pytest.mark.parametrize("heads,groups,sq,dims", [(8, 1, 1, (32, 32)), (6, 2, 4, (32, 16)), (16, 1, 5, (16, 32))],
                         ids=["mqa", "gqa_dk>dv", "two_row_blocks_dk<dv"])
def test_gqa_and_head_dims(heads, groups, sq, dims, splits):
    """A program serves every query head of its key/value head while their rows fit a block (16
    heads of 5 queries take two blocks, 12 heads and 4)."""
    splits(2)
    q, k, v = torch.randn(1, heads, sq, dims[0]), torch.randn(1, groups, 200, dims[0]), torch.randn(1, groups, 200,
                                                                                                    dims[1])
    _run(q, k, v, torch.bfloat16, window=(-1, 0), bottom_right=True)


@pytest.mark.parametrize("per_sequence", [False, True], ids=["slopes[h]", "slopes[b,h]"])
def test_alibi_and_sinks(per_sequence, splits):
    splits(4)
    q, k, v = torch.randn(2, 4, 2, 16), torch.randn(2, 2, 260, 16), torch.randn(2, 2, 260, 16)
    slopes = torch.rand(2, 4) if per_sequence else torch.rand(4)
    _run(q, k, v, torch.float32, window=(50, 0), bottom_right=True, alibi_slopes=slopes,
         softmax_offset=torch.randn(4))


# Sequences of different lengths: 300 keys, 2 keys for 3 queries (the first sees none), a query
# without keys, a sequence without queries.
LENGTHS_Q, LENGTHS_KV = [2, 3, 1, 0], [300, 2, 0, 5]
TERMS = {"causal": dict(window=(-1, 0)),
         "window_alibi_sink": dict(window=(40, 0), alibi_slopes=torch.rand(4), softmax_offset=torch.randn(4))}


@pytest.mark.parametrize("layout,page_size,dtype", [("padded", 16, torch.float32), ("packed", 7, torch.bfloat16)],
                         ids=["padded_page16_fp32", "packed_page7_bf16"])
@pytest.mark.parametrize("terms", TERMS)
def test_paged_cache_is_the_contiguous_one_bit_for_bit(layout, page_size, dtype, terms, splits):
    splits(3)
    generator = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(4, 4, 3, 16), torch.randn(4, 2, 300, 16), torch.randn(4, 2, 300, 8)
    k_pool, table = _paged(k, LENGTHS_KV, page_size, generator)
    v_pool, _ = _paged(v, LENGTHS_KV, page_size, torch.Generator().manual_seed(0))  # the same pages
    options = dict(cu_seqlens_q=_cu(LENGTHS_Q), cu_seqlens_kv=_cu(LENGTHS_KV), bottom_right=True, **TERMS[terms])
    if layout == "packed":
        q, k, v = _packed(q, LENGTHS_Q), _packed(k, LENGTHS_KV), _packed(v, LENGTHS_KV)
    paged = _run(q, k_pool, v_pool, dtype, page_table=table, **options)
    contiguous = _run(q, k, v, dtype, **options)
    assert all(torch.equal(a, b) for a, b in zip(paged, contiguous))


def test_paged_prefill():
    """More queries than a decode step: a paged cache still runs here, unsplit, a head's 70
    queries in two blocks of their own, 33 in one."""
    q, k, v = torch.randn(2, 4, 70, 16), torch.randn(2, 2, 120, 16), torch.randn(2, 2, 120, 16)
    k_pool, table = _paged(k, [120, 70], 16, torch.Generator().manual_seed(1))
    v_pool, _ = _paged(v, [120, 70], 16, torch.Generator().manual_seed(1))
    _run(q, k_pool, v_pool, torch.float32, page_table=table, cu_seqlens_q=_cu([70, 33]),
         cu_seqlens_kv=_cu([120, 70]), window=(-1, 0), bottom_right=True)


def test_any_split_count_and_the_same_bits_run_to_run(splits):
    """Splits of 1 to 16 parts (more than the keys' blocks: empty parts) each against the
    reference; a fixed count gives the same bits again (the merge's fixed order)."""
    q, k, v = torch.randn(2, 4, 2, 16), torch.randn(2, 2, 300, 16), torch.randn(2, 2, 300, 16)
    k_pool, table = _paged(k, [300, 180], 16, torch.Generator().manual_seed(2))
    v_pool, _ = _paged(v, [300, 180], 16, torch.Generator().manual_seed(2))
    options = dict(page_table=table, cu_seqlens_q=_cu([2, 2]), cu_seqlens_kv=_cu([300, 180]), window=(-1, 0),
                   bottom_right=True, softmax_offset=torch.randn(4))
    for count in (1, 2, 5, 16):
        splits(count)
        first = _run(q, k_pool, v_pool, torch.bfloat16, **options)
    second = _run(q, k_pool, v_pool, torch.bfloat16, **options)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_split_count():
    assert decode.split_count(keys=32768, programs=8, slots=264) == 33  # fills the GPU
    assert decode.split_count(keys=1024, programs=8, slots=264) == 4  # parts of 256 keys at least
    assert decode.split_count(keys=300, programs=8, slots=264) == 1  # too few keys
    assert decode.split_count(keys=32768, programs=264, slots=264) == 1  # the programs fill it
    assert decode.split_count(keys=32768, programs=0, slots=264) == 1


def test_rows_of_a_program():
    """A decode step's query rows of all heads of a group in one block (>= 16, <= 64 rows); past
    that, blocks of 64 rows."""
    assert (decode.block_rows(4, 1), decode.block_rows(8, 3), decode.block_rows(16, 5)) == (16, 32, 64)
    assert decode.block_rows(1, 40) == 64
    assert decode.row_blocks(8, 3, 32) == 1 and decode.row_blocks(16, 5, 64) == 2
    assert decode.row_blocks(2, 130, 64) == 6 and decode.row_blocks(4, 0, 16) == 0


def test_routing(monkeypatch):
    """flash_attention_fwd hands attention_decode a paged call, and a decode step over a long
    cache with few (sequence, head) pairs that see many keys; the main kernels keep the rest. supports() takes a page
    table for the forward only."""
    taken = []
    forward = decode.forward
    monkeypatch.setattr(decode, "forward", lambda cut, *args: taken.append(cut) or forward(cut, *args))
    q, k = torch.zeros(1, 4, 1, 16, device=DEVICE), torch.zeros(1, 1, 4096, 16, device=DEVICE)
    kernels.flash_attention_fwd(*fwd_args(q, k, k, last=True))
    assert len(taken) == 1 and taken[0].splits > 1 and taken[0].row_blocks == 1
    kernels.flash_attention_fwd(*fwd_args(q, k[:, :, :200], k[:, :, :200], last=True))  # too few keys to split
    kernels.flash_attention_fwd(*fwd_args(q, k, k, window=(-1, 0), last=True))  # top-left causal: one key seen
    prefill = torch.zeros(1, 4, 64, 16, device=DEVICE)
    kernels.flash_attention_fwd(*fwd_args(prefill, k[:, :, :64], k[:, :, :64], last=True))
    assert len(taken) == 1
    pool, table = torch.zeros(4, 16, 1, 16, device=DEVICE), torch.tensor([[3, 1]], dtype=torch.int32, device=DEVICE)
    cu = dict(cu_seqlens_kv=torch.tensor([0, 20], device=DEVICE), page_table=table, last=True)
    paged = fwd_args(prefill, pool, pool, cu_seqlens_q=torch.tensor([0, 64], device=DEVICE), **cu)
    kernels.flash_attention_fwd(*paged)
    assert len(taken) == 2 and taken[1].splits == 1
    assert kernels.supports("flash_attention_fwd", paged)
    bwd = (q, *paged[:3], q, q[..., 0].double(), *paged[3:])
    assert not kernels.supports("flash_attention_bwd", bwd)
    with_bias = fwd_args(q, pool, pool, bias=torch.zeros(1, 4, 1, 20, device=DEVICE), **cu)
    assert not kernels.supports("flash_attention_fwd", with_bias)


def compile_variants():
    """What tests/helpers/triton_compile.py compiles of triton/attention_decode.py: the part
    kernel in bf16 over a paged pool, split, with ALiBi and a sink (a GQA group of 8 heads' one
    query: 16 rows), and in fp32 over a contiguous cache, finishing its rows itself; the merge
    kernel in bf16; head dim 128."""
    strides = lambda *names: {f"{n}_{s}": "i64" for n in names for s in ("sb", "sh", "st")}  # noqa: E731
    found = []
    for dtype, paged in (("bf16", True), ("fp32", False)):
        data = POINTER[dtype]
        flags = {"BOTTOM_RIGHT": paged, "HAS_ALIBI": paged, "HAS_SINK": paged, "PAGED": paged, "SPLIT": paged,
                 "FP32": dtype == "fp32", "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_DK": 128, "BLOCK_DV": 128}
        found.append((f"attention_decode_part[{dtype}]", decode._part_kernel,
                      {"Q": data, "K": data, "V": data, "PAGES": "*i32", "LENS": "*i32", "STARTS": "*i64",
                       "SLOPES": "*fp32", "SINK": "*fp32", "OUT": data, "LSE": "*fp32", "ROW_MAX": "*fp32",
                       "PART": "*fp32", "STATS": "*fp32", **strides("q", "k", "v", "o", "l"), "pages_sb": "i32",
                       "page_size": "i32", "batch": "i32", "kv_heads": "i32", "ratio": "i32", "row_blocks": "i32",
                       "dk": "i32", "dv": "i32", "scale": "fp32", "window_left": "i32", "window_right": "i32",
                       "slopes_sb": "i32", **{name: "constexpr" for name in flags}}, flags))
    merge = {"HAS_SINK": True, "BLOCK_M": 16, "BLOCK_DV": 128}
    found.append(("attention_decode_merge[bf16]", decode._merge_kernel,
                  {"PART": "*fp32", "STATS": "*fp32", "LENS": "*i32", "STARTS": "*i64", "SINK": "*fp32",
                   "OUT": POINTER["bf16"], "LSE": "*fp32", "ROW_MAX": "*fp32", **strides("o", "l"), "batch": "i32",
                   "kv_heads": "i32", "ratio": "i32", "row_blocks": "i32", "splits": "i32", "dv": "i32",
                   **{name: "constexpr" for name in merge}}, merge))
    return found


def test_kernels_compile_for_hopper_and_blackwell():
    """sm_90 and sm_100 cubins for every kernel variant, with no float64 instruction in the PTX."""
    assert_compiles(compile_variants, count=3)
