"""What the FP8 attention op tests share: FP8 code values as inputs, the ops' scales, and the
comparison with the emulation (reference/attention_fp8.py) that allows the few FP8 codes the
kernels' exp and torch.exp, a few ulps apart, can put on the other side of a rounding boundary."""
import torch

from op_cases import BF16
from transformer_engine.pytorch.reference.attention_fp8 import E4M3

FWD_SCALES = torch.tensor([0.5, 0.25, 0.5, 448.0, 1 / 448.0])
# q_si, k_si, v_si, out_si, grad_out_si, probs_scale, probs_si, grad_scores_scale, grad_scores_si
BWD_SCALES = torch.tensor([0.5, 0.25, 0.5, 1.0, 0.5, 448.0, 1 / 448.0, 2.0 ** 12, 2.0 ** -12])


def codes(*shape, dtype=BF16, fp8=E4M3, device="cpu"):
    """Random FP8 code values held in dtype (exact)."""
    return (torch.randn(*shape) * 2).to(fp8).to(dtype).to(device)


def assert_emulated(got, want, code_step, name, outliers=0.01):
    """got == want (both fp32) to fp32 summation error (1e-5 of the largest |want|), but for at
    most `outliers` of the elements (and at least 2), each off by no more than code_step: an
    FP8 code of P or G moved by the exp's ulps."""
    assert got.dtype == want.dtype == torch.float32, (got.dtype, want.dtype)
    scale = want.abs().max().item() if want.numel() else 0.0
    diff = (got - want).abs()
    off = diff > 1e-5 * scale
    assert int(off.sum()) <= max(2, int(outliers * diff.numel())), \
        f"{name}: {int(off.sum())} of {diff.numel()} elements differ, max {diff.max().item():.3g}"
    assert not off.any() or diff[off].max().item() <= code_step, f"{name}: off by {diff.max().item():.3g}"
