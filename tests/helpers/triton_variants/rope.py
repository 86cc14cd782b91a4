"""Compile variants of triton/rope.py: each format, halves and interleaved pairs, forward and
backward, with and without start_positions and pass-through channels, in bf16, fp32 and fp16."""
from transformer_engine.pytorch.triton import rope as kernels

from . import POINTER


def variants():
    found = []
    for dtype, tensor_format, interleaved, backward, has_start, pass_block in (
            ("bf16", "sbhd", False, False, False, 0), ("bf16", "sbhd", False, True, True, 64),
            ("bf16", "bshd", True, False, True, 0), ("fp32", "thd", False, False, True, 0),
            ("fp16", "thd", True, True, False, 32)):
        data = POINTER[dtype]
        signature = {"X": data, "Y": data, "FREQS": "*fp32", "CU_SEQLENS": "*i64", "START_POSITIONS": "*i64",
                     "seq_len": "i32", "batch": "i32", "heads": "i32", "head_dim": "i32", "pairs": "i32",
                     "FORMAT": "constexpr", "INTERLEAVED": "constexpr", "BACKWARD": "constexpr",
                     "HAS_START": "constexpr", "HEADS_BLOCK": "constexpr", "PAIRS_BLOCK": "constexpr",
                     "PASS_BLOCK": "constexpr", "SEQUENCES_BLOCK": "constexpr"}
        constexprs = {"FORMAT": tensor_format, "INTERLEAVED": interleaved, "BACKWARD": backward,
                      "HAS_START": has_start, "HEADS_BLOCK": 16, "PAIRS_BLOCK": 64, "PASS_BLOCK": pass_block,
                      "SEQUENCES_BLOCK": 256}
        name = (f"rope_{'bwd' if backward else 'fwd'}[{dtype},{tensor_format},"
                f"{'pairs' if interleaved else 'halves'},start={has_start},pass={pass_block > 0}]")
        found.append((name, kernels._rope_kernel, signature, constexprs))
    return found
