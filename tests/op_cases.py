"""One small, valid call of every op of the portable_te namespace, built on a given device:
what tests/test_every_op.py runs through the same checks on every backend."""
import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
ops = torch.ops.portable_te


def _norm_statistics(x, w, b):
    _, mean, rstd = ops.layernorm_fwd(x, w, b, 1e-5, False)
    return mean, rstd


def cases(device: torch.device) -> dict:
    """op name -> (args of the op; which outputs hold FP8 codes, compared bit for bit)."""
    def randn(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape) * scale).to(dtype).to(device)

    x, w, b, dy = randn(6, 96), randn(96, dtype=torch.float32) + 1, randn(96, dtype=torch.float32), randn(6, 96)
    w_bf16 = w.bfloat16()
    mean, rstd = _norm_statistics(x, w, b)
    _, rms_rstd = ops.rmsnorm_fwd(x, w, 1e-5, False)
    scale = torch.tensor([3.0], device=device)
    codes, _ = ops.fp8_quantize(x, scale, E4M3)
    block_codes, block_scales = ops.fp8_block_quantize(x.float(), 1, 32, E4M3, "e8m0", 0.0)
    weight_codes, weight_scales = ops.fp8_block_quantize(randn(64, 96, dtype=torch.float32), 1, 32, E4M3, "e8m0",
                                                         0.0)
    scores = randn(2, 3, 8, 8)
    softmax_out = ops.scaled_softmax_fwd(scores, None, 0.5, "causal")
    logits, target = randn(5, 70, scale=3.0), torch.tensor([0, 69, 3, -100, 12], device=device)
    _, grad = ops.cross_entropy_fwd(logits, target, 0.1, -100, True, None)
    sbhd, freqs = randn(4, 2, 2, 16), (torch.rand(8, 1, 1, 12) * 6).to(device)
    params = [randn(5, 7, dtype=torch.float32), randn(33, dtype=torch.float32)]
    grads = [torch.randn_like(p) for p in params]
    moments = [torch.zeros_like(p) for p in params]
    return {
        "layernorm_fwd": ((x, w, b, 1e-5, False), ()),
        "layernorm_bwd": ((dy, x, mean, rstd, w, False), ()),
        "rmsnorm_fwd": ((x, w_bf16, 1e-5, True), ()),
        "rmsnorm_bwd": ((dy, x, rms_rstd, w, False), ()),
        "add_layernorm_fwd": ((x, dy, w, b, 1e-5, False), ()),
        "add_layernorm_bwd": ((dy, x, x, mean, rstd, w, False), ()),
        "add_rmsnorm_fwd": ((x, dy, w, 1e-5, False), ()),
        "add_rmsnorm_bwd": ((dy, x, x, rms_rstd, w, False), ()),
        "layernorm_fp8_fwd": ((x, w, b, scale, E4M3, 1e-5, False, True), (0,)),
        "rmsnorm_fp8_fwd": ((x, w, scale, E5M2, 1e-5, False, False), (0,)),
        "fp8_quantize": ((x, scale, E4M3), (0,)),
        "fp8_quantize_transpose": ((x, scale, E5M2), (0, 1)),
        "fp8_dequantize": ((codes, 1 / scale, torch.bfloat16), ()),
        "fp8_block_quantize": ((x, 1, 32, E4M3, "e8m0", 0.0), (0,)),
        "fp8_block_dequantize": ((block_codes, block_scales, 1, 32, torch.float32), ()),
        "fp8_block_gemm": ((block_codes, block_scales, [1, 32], False, weight_codes, weight_scales, [1, 32], False,
                            None, torch.float32), ()),
        "scaled_gemm": ((codes.float(), codes.float()[:4], scale, scale, None, torch.bfloat16), ()),
        "activation_fwd": ((x, b.bfloat16(), "swiglu", 7.0, 1.702), ()),
        "activation_bwd": ((x[:, :48].contiguous(), x, b.bfloat16(), "geglu", 7.0, 1.702), ()),
        "activation_bwd_dbias": ((dy, x, b.bfloat16(), "gelu", 7.0, 1.702), ()),
        "activation_fp8": ((x, None, "silu", 7.0, 1.702, scale, E4M3), (0,)),
        "scaled_softmax_fwd": ((scores, None, 0.5, "causal"), ()),
        "scaled_softmax_bwd": ((randn(2, 3, 8, 8), softmax_out, None, 0.5, "causal"), ()),
        "cross_entropy_fwd": ((logits, target, 0.1, -100, True, None), ()),
        "cross_entropy_bwd": ((grad, torch.rand(5, device=device)), ()),
        "cross_entropy_partials": ((logits[:, 35:].contiguous(), target, 35, -100), ()),
        "cross_entropy_sharded_grad": ((logits[:, 35:].contiguous(), target, 35, torch.zeros(5, device=device),
                                        torch.full((5,), 70.0, device=device), 0.1, 70, -100,
                                        torch.ones(5, device=device)), ()),
        "rope_fwd": ((sbhd, freqs, "sbhd", False, None, None), ()),
        "rope_bwd": ((sbhd, freqs, "sbhd", True, None, torch.tensor([1, 3], device=device)), ()),
        "multi_tensor_adam": ((params, grads, moments, [m.clone() for m in moments], [], 1e-3, 0.9, 0.999, 1e-8, 1,
                               True, 0.01, True, 1.0), ()),
    }
