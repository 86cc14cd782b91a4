"""te.TransformerLayer against a plain-PyTorch block with the layer's parameters mapped by name:
encoder/decoder, LayerNorm/RMSNorm, gelu/swiglu, bias or not, post-layernorm residuals,
output_layernorm, parallel attention+MLP, bshd; TE's getting-started progression (plain GPT block ==
te.Linear/te.LayerNorm/te.DotProductAttention block == te.LayerNormLinear/te.LayerNormMLP block ==
TransformerLayer); a Llama block; dropout and stochastic depth; state_dict, compile, FP8, errors."""
import io

import pytest
import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te
from transformer_engine.pytorch.transformer import DropPath
from numerics import assert_close, assert_value_error_naming, sqnr_db
from test_multi_head_attention import (RECIPES, canonical, compare, compare_all, config_of, exact_dtype, leaves,
                                       norm, randomize, reference_attention)

HIDDEN, FFN, HEADS, S, B = 32, 48, 4, 6, 2

ACTIVATIONS = {"gelu": lambda h: F.gelu(h, approximate="tanh"), "relu": F.relu,
               "swiglu": lambda h: F.silu(h.chunk(2, -1)[0]) * h.chunk(2, -1)[1]}


def layer_canonical(layer, tensors):
    """{our name: tensor} of a TransformerLayer -> flat reference names sa.*, ia.*, mlp.*, out.*."""
    out = {f"sa.{k}": v for k, v in canonical(layer.self_attention, tensors, "self_attention.").items()}
    if layer.layer_type == "decoder":
        out.update({f"ia.{k}": v for k, v in canonical(layer.inter_attention, tensors, "inter_attention.").items()})
    for name in ("layer_norm_weight", "layer_norm_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"):
        if f"layernorm_mlp.{name}" in tensors:
            out[f"mlp.{name}"] = tensors[f"layernorm_mlp.{name}"]
    for name in ("weight", "bias"):
        if f"layernorm.{name}" in tensors:
            out[f"out.{name}"] = tensors[f"layernorm.{name}"]
    return out


def reference_layer(x, p, cfg, encoder_output=None, freqs=None):
    """The block, written out: cfg has the layer options and the attention cfgs `sa` / `ia`."""
    def sub(prefix):
        return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}

    def add_bias(out, bias):
        return out if bias is None else out + bias
    norm_args = (cfg["normalization"], cfg["eps"], cfg["zero_centered"])
    sa_out, sa_bias, sa_ln = reference_attention(x, sub("sa."), cfg["sa"], freqs=freqs, causal=True)
    attention = add_bias(sa_out, sa_bias)
    mlp_p = sub("mlp.")

    def mlp(h):
        ln = norm(h, mlp_p["layer_norm_weight"], mlp_p.get("layer_norm_bias"), *norm_args)
        act = ACTIVATIONS[cfg["activation"]](F.linear(ln, mlp_p["fc1_weight"], mlp_p.get("fc1_bias")))
        return F.linear(act, mlp_p["fc2_weight"], mlp_p.get("fc2_bias")), ln
    if cfg["parallel"]:
        out = x + (attention + mlp(x)[0])
    else:
        h = (sa_ln if cfg["post_ln"] and not cfg["output_ln"] else x) + attention
        if cfg["decoder"]:
            ia_out, ia_bias, ia_ln = reference_attention(h, sub("ia."), cfg["ia"], encoder_output, causal=False)
            h = (ia_ln if cfg["post_ln"] else h) + add_bias(ia_out, ia_bias)
        mlp_out, mlp_ln = mlp(h)
        out = (mlp_ln if cfg["post_ln"] else h) + mlp_out
    if cfg["output_ln"]:
        out = norm(out, p["out.weight"], p.get("out.bias"), *norm_args)
    return out


def layer_config(layer, activation):
    cfg = {"sa": config_of(layer.self_attention), "normalization": layer.self_attention.normalization,
           "eps": layer.self_attention.layernorm_epsilon, "zero_centered": layer.self_attention.zero_centered_gamma,
           "activation": activation, "parallel": layer.parallel_attention_mlp,
           "post_ln": layer.apply_residual_connection_post_layernorm, "output_ln": layer.output_layernorm,
           "decoder": layer.layer_type == "decoder"}
    if cfg["decoder"]:
        cfg["ia"] = config_of(layer.inter_attention)
    return cfg


CASES = {
    "encoder": {},
    "decoder": {"layer_type": "decoder"},
    "rmsnorm_swiglu_no_bias_gqa_rope": {"normalization": "RMSNorm", "activation": "swiglu", "bias": False,
                                        "num_gqa_groups": 2, "rope": True},
    "post_layernorm_residual_decoder": {"apply_residual_connection_post_layernorm": True, "layer_type": "decoder"},
    "output_layernorm": {"output_layernorm": True, "activation": "relu"},
    "output_layernorm_post_ln_rms": {"output_layernorm": True, "apply_residual_connection_post_layernorm": True,
                                     "normalization": "RMSNorm"},
    "parallel_attention_mlp_fused_qkv": {"parallel_attention_mlp": True, "fuse_qkv_params": True},
    "zero_centered_qk_norm": {"zero_centered_gamma": True, "qk_norm_type": "RMSNorm", "rope": True},
}


def run_layer_case(kwargs, dtype, fmt="sbhd", device="cpu"):
    kwargs = dict(kwargs)
    use_rope = kwargs.pop("rope", False)
    activation = kwargs.get("activation", "gelu")
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=dtype,
                                attn_input_format=fmt, device=device, **kwargs)
    randomize(layer)
    cfg = layer_config(layer, activation)
    x, dy = torch.randn(S, B, HIDDEN, device=device), torch.randn(S, B, HIDDEN, device=device)
    enc = torch.randn(S + 3, B, HIDDEN, device=device) if cfg["decoder"] else None
    freqs = te.RotaryPositionEmbedding(HIDDEN // HEADS)(S).to(device) if use_rope else None

    def layout(t):
        return t.transpose(0, 1).contiguous() if fmt == "bshd" and t is not None else t
    xo = layout(x).to(dtype).requires_grad_()
    enco = None if enc is None else layout(enc).to(dtype).requires_grad_()
    y = layer(xo, encoder_output=enco, rotary_pos_emb=freqs)
    y.backward(layout(dy).to(dtype))
    ours = {"out": layout(y), "dx": layout(xo.grad)}
    if enc is not None:
        ours["denc"] = layout(enco.grad)
    ours.update({f"d_{k}": v for k, v in layer_canonical(layer, {n: q.grad for n, q in layer.named_parameters()}).items()})

    def reference(ref_dtype):
        p = leaves(layer_canonical(layer, dict(layer.named_parameters())), ref_dtype)
        xr = x.detach().to(ref_dtype).requires_grad_()
        encr = None if enc is None else enc.detach().to(ref_dtype).requires_grad_()
        out = reference_layer(xr, p, cfg, encr, freqs)
        out.backward(dy.to(ref_dtype))
        result = {"out": out, "dx": xr.grad, **{f"d_{k}": v.grad for k, v in p.items()}}
        if enc is not None:
            result["denc"] = encr.grad
        return result
    ref = reference(dtype)
    exact = reference(exact_dtype(dtype))
    compare_all(ours, ref, exact)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES)
def test_matches_reference(device, case, dtype):
    run_layer_case(CASES[case], dtype, device=device)


def test_bshd_matches_reference(device):
    run_layer_case({"layer_type": "decoder", "num_gqa_groups": 2}, torch.float32, fmt="bshd", device=device)


# --- TE's getting-started progression -----------------------------------------------------------

class PlainGPTBlock(torch.nn.Module):
    """The tutorial's block in plain PyTorch: pre-LN attention and GELU MLP with residuals.
    per_head_qkv: the fused QKV output read as [s, b, heads, 3 * head_dim] (per head q, k, v)
    instead of [q; k; v]."""

    def __init__(self, hidden, ffn, heads, per_head_qkv=False, eps=1e-5):
        super().__init__()
        self.heads, self.per_head_qkv = heads, per_head_qkv
        self.ln1, self.ln2 = torch.nn.LayerNorm(hidden, eps=eps), torch.nn.LayerNorm(hidden, eps=eps)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = torch.nn.Linear(hidden, ffn), torch.nn.Linear(ffn, hidden)

    def forward(self, x):  # x [s, b, hidden]
        s, b, h = x.shape
        d = h // self.heads
        qkv = self.qkv(self.ln1(x))
        if self.per_head_qkv:
            q, k, v = qkv.view(s, b, self.heads, 3 * d).split(d, dim=-1)
        else:
            q, k, v = (t.view(s, b, self.heads, d) for t in qkv.chunk(3, dim=-1))
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, heads, s, d]
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(2, 0, 1, 3).reshape(s, b, h)
        x = x + self.proj(ctx)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class TEBasicBlock(torch.nn.Module):
    """The same block from te.LayerNorm, te.Linear and te.DotProductAttention."""

    def __init__(self, hidden, ffn, heads):
        super().__init__()
        self.ln1, self.ln2 = te.LayerNorm(hidden), te.LayerNorm(hidden)
        self.qkv = te.Linear(hidden, 3 * hidden)
        self.attention = te.DotProductAttention(heads, hidden // heads, attention_dropout=0.0, attn_mask_type="causal")
        self.proj = te.Linear(hidden, hidden)
        self.fc1, self.fc2 = te.Linear(hidden, ffn), te.Linear(ffn, hidden)
        self.heads = heads

    def forward(self, x):
        s, b, h = x.shape
        q, k, v = (t.view(s, b, self.heads, h // self.heads) for t in self.qkv(self.ln1(x)).chunk(3, dim=-1))
        x = x + self.proj(self.attention(q, k, v))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class TEFusedBlock(torch.nn.Module):
    """The same block from te.LayerNormLinear, te.DotProductAttention and te.LayerNormMLP."""

    def __init__(self, hidden, ffn, heads):
        super().__init__()
        self.ln_qkv = te.LayerNormLinear(hidden, 3 * hidden)
        self.attention = te.DotProductAttention(heads, hidden // heads, attention_dropout=0.0, attn_mask_type="causal")
        self.proj = te.Linear(hidden, hidden)
        self.ln_mlp = te.LayerNormMLP(hidden, ffn)
        self.heads = heads

    def forward(self, x):
        s, b, h = x.shape
        q, k, v = (t.view(s, b, self.heads, h // self.heads) for t in self.ln_qkv(x).chunk(3, dim=-1))
        x = x + self.proj(self.attention(q, k, v))
        return x + self.ln_mlp(x)


PLAIN_TO_BASIC = {"ln1.weight": "ln1.weight", "ln1.bias": "ln1.bias", "ln2.weight": "ln2.weight",
                  "ln2.bias": "ln2.bias", "qkv.weight": "qkv.weight", "qkv.bias": "qkv.bias",
                  "proj.weight": "proj.weight", "proj.bias": "proj.bias", "fc1.weight": "fc1.weight",
                  "fc1.bias": "fc1.bias", "fc2.weight": "fc2.weight", "fc2.bias": "fc2.bias"}
PLAIN_TO_FUSED = {"ln1.weight": "ln_qkv.layer_norm_weight", "ln1.bias": "ln_qkv.layer_norm_bias",
                  "qkv.weight": "ln_qkv.weight", "qkv.bias": "ln_qkv.bias", "proj.weight": "proj.weight",
                  "proj.bias": "proj.bias", "ln2.weight": "ln_mlp.layer_norm_weight",
                  "ln2.bias": "ln_mlp.layer_norm_bias", "fc1.weight": "ln_mlp.fc1_weight", "fc1.bias": "ln_mlp.fc1_bias",
                  "fc2.weight": "ln_mlp.fc2_weight", "fc2.bias": "ln_mlp.fc2_bias"}
PLAIN_TO_LAYER = {"ln1.weight": "self_attention.layernorm_qkv.layer_norm_weight",
                  "ln1.bias": "self_attention.layernorm_qkv.layer_norm_bias",
                  "qkv.weight": "self_attention.layernorm_qkv.weight", "qkv.bias": "self_attention.layernorm_qkv.bias",
                  "proj.weight": "self_attention.proj.weight", "proj.bias": "self_attention.proj.bias",
                  **{k: "layernorm_mlp." + v[len("ln_mlp."):] for k, v in PLAIN_TO_FUSED.items()
                     if v.startswith("ln_mlp.")}}


def load_mapped(module, plain_state, name_map):
    missing, unexpected = module.load_state_dict({name_map[k]: v for k, v in plain_state.items()}, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
    return module


def test_getting_started_progression(device):
    hidden, ffn, heads, s, b = 64, 176, 4, 16, 2
    torch.manual_seed(0)
    plain = PlainGPTBlock(hidden, ffn, heads).to(device)
    randomize(plain)
    state = plain.state_dict()
    x = torch.randn(s, b, hidden, device=device)
    want = plain(x)
    blocks = {
        "te_basic": load_mapped(TEBasicBlock(hidden, ffn, heads).to(device), state, PLAIN_TO_BASIC),
        "te_fused": load_mapped(TEFusedBlock(hidden, ffn, heads).to(device), state, PLAIN_TO_FUSED),
        "transformer_layer": load_mapped(te.TransformerLayer(hidden, ffn, heads, hidden_dropout=0.0,
                                                             attention_dropout=0.0, fuse_qkv_params=True,
                                                             qkv_weight_interleaved=False, device=device),
                                         state, PLAIN_TO_LAYER),
    }
    for name, block in blocks.items():
        assert_close(block(x), want, name=name, atol=1e-4, rtol=1e-4)
    # the interleaved fused layout is the tutorial's per-head [s, b, heads, 3 * d] reading
    per_head = PlainGPTBlock(hidden, ffn, heads, per_head_qkv=True).to(device)
    per_head.load_state_dict(state)
    interleaved = load_mapped(te.TransformerLayer(hidden, ffn, heads, hidden_dropout=0.0, attention_dropout=0.0,
                                                  fuse_qkv_params=True, device=device), state, PLAIN_TO_LAYER)
    assert_close(interleaved(x), per_head(x), name="interleaved", atol=1e-4, rtol=1e-4)


# --- a Llama block --------------------------------------------------------------------------------

class PlainLlamaBlock(torch.nn.Module):
    """Llama's decoder layer in plain PyTorch: RMSNorm, GQA attention with rotate-half RoPE, causal,
    no biases, SwiGLU MLP."""

    def __init__(self, hidden, ffn, heads, kv_heads, eps=1e-6):
        super().__init__()
        self.heads, self.kv_heads, self.d, self.eps = heads, kv_heads, hidden // heads, eps
        self.input_layernorm = torch.nn.RMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = torch.nn.RMSNorm(hidden, eps=eps)
        self.q_proj = torch.nn.Linear(hidden, heads * self.d, bias=False)
        self.k_proj = torch.nn.Linear(hidden, kv_heads * self.d, bias=False)
        self.v_proj = torch.nn.Linear(hidden, kv_heads * self.d, bias=False)
        self.o_proj = torch.nn.Linear(heads * self.d, hidden, bias=False)
        self.gate_proj = torch.nn.Linear(hidden, ffn, bias=False)
        self.up_proj = torch.nn.Linear(hidden, ffn, bias=False)
        self.down_proj = torch.nn.Linear(ffn, hidden, bias=False)

    def forward(self, x, cos, sin):  # x [b, s, hidden]; cos, sin [s, d]
        b, s, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, s, self.heads, self.d).transpose(1, 2)  # [b, heads, s, d]
        k = self.k_proj(h).view(b, s, self.kv_heads, self.d).transpose(1, 2)
        v = self.v_proj(h).view(b, s, self.kv_heads, self.d).transpose(1, 2)

        def rope(t):
            t1, t2 = t.chunk(2, dim=-1)
            return t * cos + torch.cat((-t2, t1), dim=-1) * sin
        q, k = rope(q), rope(k)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        x = x + self.o_proj(ctx)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def test_llama_block(device):
    hidden, ffn, heads, kv_heads, s, b = 64, 96, 8, 2, 9, 2
    plain = PlainLlamaBlock(hidden, ffn, heads, kv_heads).to(device)
    randomize(plain)
    layer = te.TransformerLayer(hidden, ffn, heads, num_gqa_groups=kv_heads, layernorm_epsilon=1e-6,
                                hidden_dropout=0.0, attention_dropout=0.0, normalization="RMSNorm",
                                activation="swiglu", bias=False, attn_input_format="bshd", device=device)
    p = dict(plain.named_parameters())
    attn, mlp = "self_attention.layernorm_qkv.", "layernorm_mlp."
    mapped = {attn + "layer_norm_weight": p["input_layernorm.weight"], attn + "query_weight": p["q_proj.weight"],
              attn + "key_weight": p["k_proj.weight"], attn + "value_weight": p["v_proj.weight"],
              "self_attention.proj.weight": p["o_proj.weight"],
              mlp + "layer_norm_weight": p["post_attention_layernorm.weight"],
              mlp + "fc1_weight": torch.cat([p["gate_proj.weight"], p["up_proj.weight"]]),
              mlp + "fc2_weight": p["down_proj.weight"]}
    missing, unexpected = layer.load_state_dict({k: v.detach() for k, v in mapped.items()}, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)
    freqs = te.RotaryPositionEmbedding(hidden // heads)(s).to(device)  # [s, 1, 1, d]
    cos, sin = freqs[:, 0, 0].cos(), freqs[:, 0, 0].sin()
    x = torch.randn(b, s, hidden, device=device)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = layer(x1, rotary_pos_emb=freqs), plain(x2, cos, sin)
    dy = torch.randn_like(y1)
    y1.backward(dy), y2.backward(dy)
    compare(y1, y2, name="output")
    compare(x1.grad, x2.grad, name="grad_input", backward=True)
    grads = {n: q.grad for n, q in layer.named_parameters()}
    compare(grads[mlp + "fc1_weight"], torch.cat([p["gate_proj.weight"].grad, p["up_proj.weight"].grad]),
            name="fc1 grad", backward=True)
    for ours, theirs in (("key_weight", "k_proj"), ("query_weight", "q_proj"), ("layer_norm_weight", "input_layernorm")):
        compare(grads[attn + ours], p[theirs + ".weight"].grad, name=ours, backward=True)


# --- dropout, stochastic depth ------------------------------------------------------------------

def test_hidden_dropout_and_drop_path_only_in_training(device):
    torch.manual_seed(2)
    plain = te.TransformerLayer(HIDDEN, FFN, HEADS, hidden_dropout=0.0, attention_dropout=0.0, device=device)
    noisy = te.TransformerLayer(HIDDEN, FFN, HEADS, hidden_dropout=0.3, attention_dropout=0.3, drop_path_rate=0.4,
                                device=device)
    noisy.load_state_dict(plain.state_dict())
    x = torch.randn(S, B, HIDDEN, device=device)
    noisy.eval()
    assert torch.equal(noisy(x), plain(x))
    noisy.train()
    assert not torch.equal(noisy(x), noisy(x))


def test_drop_path_drops_whole_dim0_slices(device):
    torch.manual_seed(3)
    drop = DropPath(0.5)
    x = torch.randn(200, 3, 4, device=device) + 5
    y = drop(x)
    kept = (y != 0).all(dim=(1, 2))
    dropped = (y == 0).all(dim=(1, 2))
    assert torch.equal(kept | dropped, torch.ones(200, dtype=torch.bool, device=device)), "whole slices along dim 0"
    assert_close(y[kept], x[kept] / 0.5, name="kept slices scaled by 1 / keep")
    assert 60 < int(kept.sum()) < 140
    drop.eval()
    assert drop(x) is x


def test_drop_path_rate_one_drops_both_branches_in_training_only(device):
    """TE accepts drop_path_rate=1: in training the self-attention and MLP branches are dropped
    whole (the output is the input, every gradient finite); in eval the layer is unchanged."""
    plain = te.TransformerLayer(HIDDEN, FFN, HEADS, hidden_dropout=0.0, attention_dropout=0.0, device=device)
    dropped = te.TransformerLayer(HIDDEN, FFN, HEADS, hidden_dropout=0.0, attention_dropout=0.0, drop_path_rate=1.0,
                                  device=device)
    dropped.load_state_dict(plain.state_dict())
    x = torch.randn(S, B, HIDDEN, requires_grad=True, device=device)
    y = dropped(x)
    assert torch.equal(y, x)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, torch.ones_like(x))
    assert all(torch.isfinite(p.grad).all() for p in dropped.parameters() if p.grad is not None)
    dropped.eval(), plain.eval()
    assert torch.equal(dropped(x), plain(x))
    with pytest.raises(ValueError, match=r"drop_path_rate=1.5 must be in \[0, 1\]"):
        te.TransformerLayer(HIDDEN, FFN, HEADS, drop_path_rate=1.5, device=device)


# --- names, checkpoints, compile, FP8, errors -----------------------------------------------------

def test_parameter_names():
    names = set(te.TransformerLayer(HIDDEN, FFN, HEADS, layer_type="decoder", output_layernorm=True).state_dict())
    for expected in ("self_attention.qkv.query_weight", "self_attention.proj.weight",
                     "inter_attention.layernorm_query.layer_norm_weight", "inter_attention.layernorm_query.query_weight",
                     "inter_attention.key_value.key_weight", "inter_attention.key_value.value_bias",
                     "layernorm_mlp.layer_norm_weight", "layernorm_mlp.fc1_weight", "layernorm_mlp.fc2_bias",
                     "layernorm.weight", "layernorm.bias"):
        assert expected in names, expected
    names = {n for n in te.TransformerLayer(HIDDEN, FFN, HEADS).state_dict() if not n.endswith("_extra_state")}
    assert names == {"self_attention.layernorm_qkv.layer_norm_weight", "self_attention.layernorm_qkv.layer_norm_bias",
                     "self_attention.layernorm_qkv.query_weight", "self_attention.layernorm_qkv.key_weight",
                     "self_attention.layernorm_qkv.value_weight", "self_attention.layernorm_qkv.query_bias",
                     "self_attention.layernorm_qkv.key_bias", "self_attention.layernorm_qkv.value_bias",
                     "self_attention.proj.weight", "self_attention.proj.bias", "layernorm_mlp.layer_norm_weight",
                     "layernorm_mlp.layer_norm_bias", "layernorm_mlp.fc1_weight", "layernorm_mlp.fc1_bias",
                     "layernorm_mlp.fc2_weight", "layernorm_mlp.fc2_bias"}


def test_state_dict_round_trip(device):
    kwargs = {"hidden_dropout": 0.0, "attention_dropout": 0.0, "layer_type": "decoder"}
    a = te.TransformerLayer(HIDDEN, FFN, HEADS, **kwargs, device=device)
    randomize(a, seed=5)
    x, enc = torch.randn(S, B, HIDDEN, device=device), torch.randn(S, B, HIDDEN, device=device)
    with te.autocast(recipe=RECIPES["delayed"]):
        a(x, encoder_output=enc)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    b = te.TransformerLayer(HIDDEN, FFN, HEADS, **kwargs, device=device)
    b.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(a(x, encoder_output=enc), b(x, encoder_output=enc))
    with te.autocast(recipe=RECIPES["delayed"]):
        assert torch.equal(a(x, encoder_output=enc), b(x, encoder_output=enc))


def test_compile_fullgraph_matches_eager(device):
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS, hidden_dropout=0.0, attention_dropout=0.0, num_gqa_groups=2,
                                normalization="RMSNorm", activation="swiglu", device=device)
    randomize(layer)
    x = torch.randn(S, B, HIDDEN, requires_grad=True, device=device)
    freqs = te.RotaryPositionEmbedding(HIDDEN // HEADS)(S).to(device)
    torch._dynamo.reset()
    y1 = torch.compile(layer, fullgraph=True)(x, rotary_pos_emb=freqs)
    y1.sum().backward()
    g1, x.grad = x.grad.clone(), None
    y2 = layer(x, rotary_pos_emb=freqs)
    y2.sum().backward()
    assert_close(y1, y2, name="output")
    assert_close(g1, x.grad, name="grad_input", atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rec", RECIPES)
def test_fp8_recipes_close_to_high_precision(device, rec):
    layer = te.TransformerLayer(64, 128, HEADS, hidden_dropout=0.0, attention_dropout=0.0, layer_type="decoder",
                                params_dtype=torch.bfloat16, device=device)
    x = torch.randn(16, 2, 64, dtype=torch.bfloat16, requires_grad=True, device=device)
    enc = torch.randn(16, 2, 64, dtype=torch.bfloat16, device=device)
    dy = torch.randn(16, 2, 64, dtype=torch.bfloat16, device=device)
    exact = layer(x, encoder_output=enc)
    exact.backward(dy)
    exact_dx = x.grad.clone()
    for _ in range(2):
        x.grad = None
        with te.autocast(recipe=RECIPES[rec]):
            y = layer(x, encoder_output=enc)
        y.backward(dy)
    assert torch.isfinite(y).all() and all(torch.isfinite(p.grad).all() for p in layer.parameters())
    # what the branches add to the residual stream (the residual alone would hide FP8 errors)
    assert sqnr_db(exact - x, y - x) >= 18
    assert sqnr_db(exact_dx - dy, x.grad - dy) >= 12


def test_bad_arguments(device):
    assert_value_error_naming(lambda: te.TransformerLayer(HIDDEN, FFN, HEADS, layer_type="encdec", device=device),
                              ["layer_type", "'encdec'"])
    assert_value_error_naming(lambda: te.TransformerLayer(HIDDEN, FFN, 6, kv_channels=4, num_gqa_groups=4,
                                                          device=device),
                              ["num_attention_heads=6", "num_gqa_groups=4"])
    assert_value_error_naming(lambda: te.TransformerLayer(HIDDEN, FFN, HEADS, parallel_attention_mlp=True,
                                                          layer_type="decoder", device=device),
                              ["parallel_attention_mlp"])
    assert_value_error_naming(lambda: te.TransformerLayer(HIDDEN, FFN, HEADS, fuse_wgrad_accumulation=True,
                                                          device=device),
                              ["fuse_qkv_params"])
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS, device=device)
    assert_value_error_naming(lambda: layer(torch.randn(S, B, HIDDEN - 1, device=device)), [f"({S}, {B}, {HIDDEN - 1})",
                                                                             f"hidden_size={HIDDEN}"])
