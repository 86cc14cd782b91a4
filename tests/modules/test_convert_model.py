"""te.convert_model on a Llama-style and a GPT-2-style model written here: same outputs and
gradients (fp32, bf16), Parameter identity and ties kept, optimizer steps still match, FP8
training afterwards; the rules for norms (probe, zero-centered, refusals), Linear subclasses,
filter_fn and logging."""
import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from numerics import assert_close, assert_two_reference


class LlamaRMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm: statistics in fp32, cast back, then times weight."""

    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class GemmaRMSNorm(nn.Module):
    """Gemma's norm: weight stored around 0, output x_hat * (1 + weight)."""

    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(hidden))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class OddRMSNorm(LlamaRMSNorm):
    """Named like an RMSNorm but divides by the mean absolute value: must be left alone."""

    def forward(self, x):
        return self.weight * x / (x.abs().mean(-1, keepdim=True) + self.variance_epsilon)


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (p(x).view(b, s, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, heads, s, d]
        return self.o_proj(o.transpose(1, 2).reshape(b, s, h))


class LlamaMlp(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(hidden, ffn, bias=False), nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, hidden, ffn, heads, norm=LlamaRMSNorm):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = norm(hidden), norm(hidden)
        self.self_attn, self.mlp = Attention(hidden, heads), LlamaMlp(hidden, ffn)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLlama(nn.Module):
    def __init__(self, vocab=61, hidden=32, ffn=56, heads=4, layers=2, norm=LlamaRMSNorm):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(LlamaBlock(hidden, ffn, heads, norm) for _ in range(layers))
        self.norm = norm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.embed_tokens.weight  # tied, as Hugging Face does
        with torch.no_grad():  # norms away from their initial values, so a wrong formula shows
            for module in self.modules():
                if isinstance(module, (LlamaRMSNorm, GemmaRMSNorm)):
                    module.weight.uniform_(0.5, 1.5)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


class Gpt2Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden, bias=False)
        self.attn = nn.MultiheadAttention(hidden, 2, batch_first=True)  # out_proj: NonDynamicallyQuantizableLinear
        self.c_fc, self.c_proj = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class TinyGpt2(nn.Module):
    def __init__(self, vocab=53, hidden=24, positions=16):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(positions, hidden)
        self.h = nn.ModuleList(Gpt2Block(hidden) for _ in range(2))
        self.ln_f = nn.LayerNorm(hidden, elementwise_affine=False)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.LayerNorm) and module.weight is not None:
                    module.weight.uniform_(0.5, 1.5)
                    if module.bias is not None:
                        module.bias.uniform_(-0.5, 0.5)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def converted_pair(make, dtype=torch.float32, **kwargs):
    original = make().to(dtype)
    converted = te.convert_model(copy.deepcopy(original), **kwargs)
    return original, converted


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(ids)
    logits.float().square().mean().backward()
    return logits, {name: p.grad for name, p in model.named_parameters()}


def assert_same_model_math(original, converted, ids, dtype):
    """Outputs and every parameter gradient: fp32 within fp32 tolerance; bf16 by the
    two-reference rule (against the fp32 model, the converted model's error at most 2x
    (forward) / 3x (gradients) the original bf16 model's), as rounding compounds over layers."""
    y1, g1 = loss_and_grads(original, ids)
    y2, g2 = loss_and_grads(converted, ids)
    assert g1.keys() == g2.keys()
    if dtype == torch.float32:
        assert_close(y2, y1, name="logits")
        for name in g1:
            assert_close(g2[name], g1[name], name=f"grad {name}")
        return
    y0, g0 = loss_and_grads(copy.deepcopy(original).float(), ids)
    assert_two_reference(y2, y1, y0, 2, name="logits")
    for name in g1:
        assert_two_reference(g2[name], g1[name], g0[name], 3, name=f"grad {name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_llama_converts_and_matches(dtype):
    original, model = converted_pair(TinyLlama, dtype)
    kinds = {type(m) for m in model.modules()}
    assert nn.Linear not in kinds and LlamaRMSNorm not in kinds and {te.Linear, te.RMSNorm} <= kinds
    assert model.lm_head.weight is model.embed_tokens.weight  # the tie survived
    assert model.layers[0].input_layernorm.eps == 1e-6 and not model.layers[0].input_layernorm.zero_centered_gamma
    assert all(p.dtype == dtype for p in model.parameters())
    assert_same_model_math(original, model, torch.randint(0, 61, (2, 9)), dtype)


def test_parameter_objects_move_and_optimizer_keeps_training_them():
    original = TinyLlama()
    model = copy.deepcopy(original)
    before = dict(model.named_parameters())
    opt_converted = torch.optim.AdamW(model.parameters(), lr=1e-2)  # created BEFORE the conversion
    opt_original = torch.optim.AdamW(original.parameters(), lr=1e-2)
    model.layers[1].mlp.up_proj.weight.requires_grad_(False)
    original.layers[1].mlp.up_proj.weight.requires_grad_(False)
    model.eval()
    assert te.convert_model(model) is model
    after = dict(model.named_parameters())
    assert before.keys() == after.keys() and all(before[n] is after[n] for n in before)
    assert not model.layers[1].mlp.up_proj.weight.requires_grad
    assert not any(m.training for m in model.modules())
    model.train(), original.train()
    ids = torch.randint(0, 61, (2, 7))
    for _ in range(3):
        for m, opt in ((original, opt_original), (model, opt_converted)):
            opt.zero_grad()
            m(ids).square().mean().backward()
            opt.step()
    for (name, p1), p2 in zip(original.named_parameters(), model.parameters()):
        assert_close(p2, p1, name=name, atol=1e-4)
    assert torch.equal(model.layers[1].mlp.up_proj.weight, original.layers[1].mlp.up_proj.weight)


def test_llama_trains_in_fp8_after_conversion():
    """Next-token training under te.autocast(DelayedScaling): finite, decreasing, close to the
    same steps in high precision."""
    model = te.convert_model(TinyLlama(vocab=64, hidden=32, ffn=64))
    high = copy.deepcopy(model)
    ids = torch.randint(0, 64, (4, 12))
    losses = {True: [], False: []}
    for fp8, m in ((True, model), (False, high)):
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        for _ in range(5):
            opt.zero_grad()
            with te.autocast(enabled=fp8, recipe=recipe.DelayedScaling(amax_history_len=16)):
                logits = m(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, 64), ids[:, 1:].reshape(-1))
            loss.backward()
            assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
            opt.step()
            losses[fp8].append(loss.item())
    fp8_losses, high_losses = torch.tensor(losses[True]), torch.tensor(losses[False])
    assert torch.isfinite(fp8_losses).all() and fp8_losses[-1] < fp8_losses[0]
    assert torch.allclose(fp8_losses, high_losses, rtol=0.05), (fp8_losses, high_losses)
    assert model.layers[0].mlp.gate_proj.fp8_meta is not None  # the FP8 path really ran


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpt2_layernorms_and_linears(dtype, caplog):
    with caplog.at_level(logging.INFO, logger="transformer_engine"):
        original, model = converted_pair(TinyGpt2, dtype)
    block = model.h[0]
    assert isinstance(block.ln_1, te.LayerNorm) and isinstance(block.c_fc, te.Linear)
    assert isinstance(block.attn.out_proj, te.Linear)  # NonDynamicallyQuantizableLinear adds nothing
    # bias=False and elementwise_affine=False: constants, no new parameters or state_dict keys
    assert isinstance(block.ln_2, te.LayerNorm) and "bias" not in dict(block.ln_2.named_parameters())
    assert isinstance(model.ln_f, te.LayerNorm) and not list(model.ln_f.parameters())
    assert {k for k in model.state_dict() if not k.endswith("_extra_state")} == set(original.state_dict())
    assert "constant bias" in caplog.text and "constant weight" in caplog.text
    assert_same_model_math(original, model, torch.randint(0, 53, (2, 11)), dtype)


def test_torch_rmsnorm_with_default_eps_bf16():
    norm = nn.RMSNorm(40, eps=None, dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    converted = te.convert_model(copy.deepcopy(norm))
    assert isinstance(converted, te.RMSNorm) and converted.weight is not norm.weight
    x = torch.randn(3, 40, dtype=torch.bfloat16) * 1e-3  # tiny rows: eps matters
    assert_close(converted(x), norm(x), name="output")
    assert converted.eps == torch.finfo(torch.float32).eps


def test_gemma_norm_becomes_zero_centered_and_odd_norm_is_left(caplog):
    model = TinyLlama(norm=GemmaRMSNorm, layers=1)
    model.layers[0].post_attention_layernorm = OddRMSNorm(32)
    original = copy.deepcopy(model)
    with caplog.at_level(logging.INFO, logger="transformer_engine"):
        te.convert_model(model)
    assert isinstance(model.norm, te.RMSNorm) and model.norm.zero_centered_gamma
    assert isinstance(model.layers[0].post_attention_layernorm, OddRMSNorm)
    skipped = [r for r in caplog.records if "post_attention_layernorm" in r.getMessage()]
    assert len(skipped) == 1 and skipped[0].levelno == logging.WARNING and "differs" in skipped[0].getMessage()
    assert_same_model_math(original, model, torch.randint(0, 61, (2, 5)), torch.float32)


class T5LayerNorm(LlamaRMSNorm):
    """Hugging Face's T5LayerNorm: an RMSNorm (no mean, no bias) by another name."""


class BiaslessLayerNorm(nn.Module):
    """A LayerNorm (mean subtracted) without bias, under a LayerNorm name."""

    def __init__(self, hidden, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, None, self.eps)


class MeanOnlyLayerNorm(BiaslessLayerNorm):
    """Named like a norm, computes something else (centring only): must be left."""

    def forward(self, x):
        return (x - x.mean(-1, keepdim=True)) * self.weight


def test_norms_named_layernorm_are_probed_for_their_formula(caplog):
    torch.manual_seed(0)
    model = nn.Sequential(T5LayerNorm(32), BiaslessLayerNorm(32), MeanOnlyLayerNorm(32))
    for norm in model:
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(5, 32)
    expected = model(x)
    original = copy.deepcopy(model)
    with caplog.at_level(logging.INFO, logger="transformer_engine"):
        te.convert_model(model)
    assert isinstance(model[0], te.RMSNorm) and isinstance(model[1], te.LayerNorm)
    assert type(model[2]) is MeanOnlyLayerNorm and "left 2 (MeanOnlyLayerNorm)" in caplog.text
    assert_close(model(x), expected, name="converted norms")
    assert set(model.state_dict()) == set(original.state_dict())


class LoraLinear(nn.Linear):
    def __init__(self, n):
        super().__init__(n, n)
        self.lora_a = nn.Parameter(torch.zeros(2, n))

    def forward(self, x):
        return super().forward(x) + x @ self.lora_a.t() @ self.lora_a


class ScaledLinear(nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


def test_linear_subclasses_hooks_filter_and_our_modules_left(caplog):
    model = nn.Sequential(LoraLinear(6), ScaledLinear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6), te.Linear(6, 6),
                          nn.Linear(6, 6))
    model[3].register_forward_hook(lambda module, inputs, output: output * 3)
    shared = nn.Linear(6, 6)
    container = nn.ModuleDict({"a": shared, "b": shared})
    model.append(container)
    ours = model[4]
    names = []
    with caplog.at_level(logging.INFO, logger="transformer_engine"):
        te.convert_model(model, filter_fn=lambda module, name: names.append(name) or name != "5")
    kinds = [type(m) for m in model[:6]]
    assert kinds == [LoraLinear, ScaledLinear, te.Linear, nn.Linear, te.Linear, nn.Linear]
    assert model[4] is ours and "4" not in names  # ours: never offered to filter_fn
    assert isinstance(container["a"], te.Linear) and container["a"] is container["b"]
    messages = caplog.text
    for words in ("own forward", "hooks", "filter_fn", "more than weight and bias"):
        assert words in messages


def test_root_module_and_bad_arguments():
    linear = nn.Linear(4, 3)
    converted = te.convert_model(linear)
    assert isinstance(converted, te.Linear) and converted.weight is linear.weight
    with pytest.raises(ValueError, match="model must be a torch.nn.Module"):
        te.convert_model("model")
    with pytest.raises(ValueError, match="filter_fn must be callable"):
        te.convert_model(nn.Linear(2, 2), filter_fn=3)


def test_state_dict_of_original_loads_into_converted():
    original = TinyGpt2()
    model = te.convert_model(copy.deepcopy(TinyGpt2()))
    model.load_state_dict(original.state_dict())
    ids = torch.randint(0, 53, (1, 6))
    assert_close(model(ids), original(ids), name="logits")


def test_hugging_face_llama_from_config():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    original = transformers.LlamaForCausalLM(config).eval()
    model = te.convert_model(copy.deepcopy(original))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert isinstance(model.model.norm, te.RMSNorm) and isinstance(model.model.layers[0].mlp.up_proj, te.Linear)
    ids = torch.randint(0, 64, (2, 7))
    assert_close(model(ids).logits, original(ids).logits, name="logits")
