"""Every op of the portable_te namespace is checked through its family's cases
(tests/helpers/op_cases.py): each family declares them in one test file, which runs them through
the reference, opcheck and torch.compile on every backend and checks that they name each of the
family's ops. Here: that every family has such a file, and the one check that spans families."""
import pathlib
import re

import torch

from transformer_engine.pytorch.custom_ops import _registry

ops = torch.ops.portable_te
E4M3 = torch.float8_e4m3fn
TESTS = pathlib.Path(__file__).resolve().parents[1]


def test_every_family_declares_its_cases_in_one_test_file():
    declared = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        for family in re.findall(r'^CASES = OpCases\("(\w+)"', path.read_text(), re.M):
            declared.setdefault(family, []).append(str(path.relative_to(TESTS)))
    families = {_registry.op_family(op) for op in _registry.op_names()}
    assert {family: paths for family, paths in declared.items() if len(paths) > 1} == {}
    assert sorted(declared) == sorted(families)


def test_compiled_fp8_codes_flow_between_ops(backend):
    """FP8 codes made and used inside one compiled graph: per-tensor and block quantise ->
    dequantise round trips, and block quantise -> block GEMM with an elementwise op on its
    result, equal eager."""
    device = backend.device
    x = torch.randn(70, 160).bfloat16().to(device)
    scale = torch.tensor([7.0], device=device)
    w = torch.randn(32, 160).to(device)

    def round_trips(x, scale, w):
        data, amax = ops.fp8_quantize(x, scale, E4M3)
        codes, scale_inv = ops.fp8_block_quantize(x, 1, 32, E4M3, "e8m0", 0.0)
        w_codes, w_scale_inv = ops.fp8_block_quantize(w, 1, 32, E4M3, "e8m0", 0.0)
        product = ops.fp8_block_gemm(codes, scale_inv, [1, 32], False, w_codes, w_scale_inv, [1, 32], False, None,
                                     torch.float32)
        return (ops.fp8_dequantize(data, 1 / scale, x.dtype), amax,
                ops.fp8_block_dequantize(codes, scale_inv, 1, 32, torch.float32), product * 2)

    torch._dynamo.reset()
    got, want = torch.compile(round_trips, fullgraph=True)(x, scale, w), round_trips(x, scale, w)
    for index, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), index
