"""TE v2.18's test_mha_accuracy setup in bf16 (hidden 128, 8 heads, 128 tokens, batch 1 and 2, causal
and no mask): the largest error of each output and gradient against PyTorch's MultiheadAttention in
float64 with the same weights and inputs, for te.MultiheadAttention (ours) and for PyTorch's own
bf16 MultiheadAttention, the test's reference. `python mha_accuracy_vs_float64.py`."""
import torch
import transformer_engine.pytorch as te
torch.manual_seed(0)
S, H, NH = 128, 128, 8
def torch_mha(dtype, te_mha):
    m = torch.nn.MultiheadAttention(H, NH, dropout=0.1, bias=True, batch_first=False).to(dtype).eval()
    with torch.no_grad():
        m.in_proj_weight.copy_(te_mha.qkv.weight.to(dtype)); m.in_proj_bias.copy_(te_mha.qkv.bias.to(dtype))
        m.out_proj.weight.copy_(te_mha.proj.weight.to(dtype)); m.out_proj.bias.copy_(te_mha.proj.bias.to(dtype))
    return m
def run(block, x, mask, te_call):
    x = x.clone().requires_grad_(True)
    out = block(x, attn_mask_type=mask) if te_call else block(x, x, x, attn_mask=(torch.triu(torch.ones(S, S, dtype=torch.bool), 1) if mask == "causal" else None), need_weights=False)[0]
    out.sum().backward()
    return [out, x.grad] + [p.grad for p in block.parameters()]
for mask in ["causal", "no_mask"]:
    for bs in [1, 2]:
        te_mha = te.MultiheadAttention(H, NH, fuse_qkv_params=True, params_dtype=torch.bfloat16, qkv_weight_interleaved=False, input_layernorm=False).eval()
        x = torch.randn(S, bs, H, dtype=torch.bfloat16)
        ours = run(te_mha, x, mask, True)
        tb = run(torch_mha(torch.bfloat16, te_mha), x, mask, False)
        ref = run(torch_mha(torch.float64, te_mha), x.double(), mask, False)
        names = ["out", "dx", "dWqkv", "dbqkv", "dWo", "dbo"]
        errs = [(n, (o.double() - r).abs().max().item(), (t.double() - r).abs().max().item()) for n, o, t, r in zip(names, ours, tb, ref)]
        print(mask, bs, "  ".join(f"{n}: ours {a:.3g} torch {b:.3g}" for n, a, b in errs))
