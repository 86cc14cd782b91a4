"""The decode family (bench/decode_cases.py) at tiny sizes: every provider decodes the same tokens
as the plain PyTorch decoder, call after call and across a refill of the cache (the TE stacks
within their formats' error), the plain decoder's steps equal its whole-sequence forward, and
each provider's bytes are its weights as stored (FP8 codes and scales) plus the KV cache."""
import pytest
import torch

from numerics import assert_close
from transformer_engine.bench import decode_cases

CPU = torch.device("cpu")
CFG = decode_cases.TINY["CONFIG"]
# Per provider: the tolerance against the plain bf16 decoder: a bf16 unit of the outputs (up to
# about 3) where both compute in bf16 through two layers, more for FP8 and NVFP4 weights and GEMMs.
TOLERANCE = {"ours": dict(rtol=0.02, atol=0.02), "compile": dict(rtol=0.02, atol=0.02),
             "ours_fp8": dict(rtol=0.1, atol=0.1), "ours_current": dict(rtol=0.1, atol=0.1),
             "ours_block": dict(rtol=0.1, atol=0.1), "ours_nvfp4": dict(rtol=0.3, atol=0.4)}


@pytest.fixture(scope="module")
def case():
    torch.manual_seed(0)
    return decode_cases.decode_case(CFG, 3, torch.bfloat16, CPU)


def test_every_provider_decodes_as_the_plain_decoder(case):
    calls = CFG.room + 2  # past a full cache: the context again, then further
    outputs = {name: [provider().float() for _ in range(calls)] for name, provider in case.providers.items()}
    for name, tolerance in TOLERANCE.items():
        for step, (got, want) in enumerate(zip(outputs[name], outputs["eager"])):
            assert got.shape == (3, 1, CFG.block.hidden)
            assert_close(got, want, name=f"{name}, call {step}", **tolerance)


def test_plain_steps_equal_the_whole_sequence():
    torch.manual_seed(1)
    decoder = decode_cases.PlainDecoder(CFG, 2, torch.float32, CPU)
    x = torch.randn(2, CFG.context + 3, CFG.block.hidden)
    with torch.no_grad():
        whole = decoder(x, 0)
        pieces = [decoder(x[:, :CFG.context], 0)] + [decoder(x[:, i:i + 1], i) for i in range(CFG.context, x.shape[1])]
    assert_close(torch.cat(pieces, dim=1), whole, name="steps against the whole sequence")


def test_bytes_are_the_weights_as_stored_and_the_cache(case):
    params = sum(p.numel() for p in decode_cases.PlainDecoder(CFG, 1, torch.bfloat16, CPU).blocks.parameters())
    cache = case.bytes_of["eager"] - 2 * params
    assert cache == 2 * CFG.layers * 3 * (CFG.context + CFG.room // 2) * CFG.block.groups * CFG.block.head_dim * 2
    assert case.bytes_of["ours"] == case.bytes_of["eager"] == case.bytes
    # FP8 weights: a byte per element (norm weights stay bf16) and their scales.
    assert case.bytes_of["ours"] - cache > case.bytes_of["ours_fp8"] - cache > (case.bytes_of["ours"] - cache) / 2
    assert case.bytes_of["ours_nvfp4"] < case.bytes_of["ours_fp8"]
    assert case.tokens == 3
