"""Hugging Face models through te.convert_model, as client code uses them: the converted model
gives the original's logits and loss, trains under every FP8 recipe and under torch.autocast,
and survives save_pretrained-style state_dict round trips. Tiny configs built from scratch (no
download)."""
import copy
import math

import pytest
import torch

import transformer_engine.pytorch as te
from numerics import assert_close
from transformer_engine.common import recipe

transformers = pytest.importorskip("transformers")
VOCAB = 96


def build(name):
    small = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4)
    if name == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**small, num_key_value_heads=2))
    if name == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small, num_key_value_heads=2))
    if name == "gemma":  # RMSNorm as (1 + weight): converted with zero_centered_gamma
        return transformers.GemmaForCausalLM(transformers.GemmaConfig(**small, num_key_value_heads=2, head_dim=16))
    if name == "bert":  # LayerNorm with bias, GELU MLP, post-norm
        return transformers.BertForMaskedLM(transformers.BertConfig(**small))
    if name == "t5":  # T5LayerNorm (RMS without mean), encoder-decoder
        return transformers.T5ForConditionalGeneration(
            transformers.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4))
    if name == "opt":  # ReLU MLP, LayerNorm with bias, learned positions
        return transformers.OPTForCausalLM(transformers.OPTConfig(
            vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
            word_embed_proj_dim=64))
    if name == "gpt_neox":  # parallel attention + MLP residual, fused QKV, partial rotary
        return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**small))
    if name == "phi":  # one LayerNorm feeding attention and MLP in parallel, gelu_new
        return transformers.PhiForCausalLM(transformers.PhiConfig(**small))
    if name == "bart":  # encoder-decoder, post-norm LayerNorms, cross-attention
        return transformers.BartForConditionalGeneration(transformers.BartConfig(
            vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128))
    raise ValueError(name)


NAMES = ("llama", "qwen2", "gemma", "bert", "t5", "opt", "gpt_neox", "phi", "bart")


def batch(name, seed=0):
    ids = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(seed))
    kwargs = {"labels": ids}
    if name in ("t5", "bart"):
        kwargs["decoder_input_ids"] = ids
    return ids, kwargs


def converted(name):
    torch.manual_seed(0)
    original = build(name).eval()
    return original, te.convert_model(copy.deepcopy(original))


@pytest.mark.parametrize("name", NAMES)
def test_converted_model_matches_original(name):
    original, model = converted(name)
    assert any(isinstance(m, te.Linear) for m in model.modules())
    assert any(isinstance(m, (te.LayerNorm, te.RMSNorm)) for m in model.modules())
    ids, kwargs = batch(name)
    expected, actual = original(ids, **kwargs), model(ids, **kwargs)
    assert_close(actual.logits, expected.logits, name=f"{name} logits")
    assert_close(actual.loss, expected.loss, name=f"{name} loss")
    expected.loss.backward()
    actual.loss.backward()
    originals = dict(original.named_parameters())
    for param_name, param in model.named_parameters():
        assert_close(param.grad, originals[param_name].grad, name=f"{name} grad {param_name}", atol=1e-5)


RECIPES = {"delayed": recipe.DelayedScaling(), "current": recipe.Float8CurrentScaling(),
           "block": recipe.Float8BlockScaling(), "mxfp8": recipe.MXFP8BlockScaling()}


@pytest.mark.parametrize("name, recipe_name", [("llama", r) for r in RECIPES] + [("bert", "delayed"), ("bert", "mxfp8"),
                                                                              ("t5", "current")])
def test_training_steps_under_fp8(name, recipe_name):
    rec = RECIPES[recipe_name]
    _, model = converted(name)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(5):
        ids, kwargs = batch(name, seed=0)  # one batch, memorised: the loss must fall
        with te.autocast(recipe=rec):
            loss = model(ids, **kwargs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("name", ("llama", "bert"))
def test_torch_autocast_bf16_training_step(name):
    """Hugging Face Trainer(bf16=True) on CPU: fp32 parameters under torch.autocast(bf16)."""
    original, model = converted(name)
    ids, kwargs = batch(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, actual = original(ids, **kwargs), model(ids, **kwargs)
    assert_close(actual.loss, expected.loss, dtype=torch.bfloat16, name=f"{name} loss under autocast")
    actual.loss.backward()
    assert all(p.grad is None or (p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all())
               for p in model.parameters())


def test_save_pretrained_and_reload(tmp_path):
    """A converted model trained in FP8 saves with save_pretrained (safetensors: tensors only,
    FP8 state included) and loads back into the plain architecture and, converted again, into
    ours with the same logits and FP8 scales."""
    original, model = converted("llama")
    with te.autocast(recipe=recipe.DelayedScaling()):
        model(batch("llama")[0]).logits.sum().backward()
    model.save_pretrained(tmp_path)
    ids, _ = batch("llama", seed=3)
    plain = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert_close(plain(ids).logits, model(ids).logits, name="plain reload logits")
    again = te.convert_model(transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval())
    again.load_state_dict(model.state_dict())
    assert_close(again(ids).logits, model(ids).logits, name="converted reload logits")
    saved, loaded = model.model.layers[0].mlp.up_proj.fp8_meta, again.model.layers[0].mlp.up_proj.fp8_meta
    assert torch.equal(saved.scaling_fwd.amax_history, loaded.scaling_fwd.amax_history)


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_gradient_checkpointing_under_fp8(use_reentrant):
    """model.gradient_checkpointing_enable() recomputes each layer with torch.utils.checkpoint in
    backward, outside te.autocast: gradients equal those of the same steps without it."""
    _, plain = converted("llama")
    checkpointed = copy.deepcopy(plain)
    checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    for model in (plain, checkpointed):
        model.train()
        for step in range(2):
            model.zero_grad()
            ids, kwargs = batch("llama", seed=step)
            with te.autocast(recipe=recipe.DelayedScaling()):
                model(ids, **kwargs).loss.backward()
    grads = dict(plain.named_parameters())
    for name, param in checkpointed.named_parameters():
        assert torch.equal(param.grad, grads[name].grad), name


def test_whole_model_pickles_and_casts_after_fp8_steps(tmp_path):
    """torch.save(model) of a converted model, and model.to(torch.bfloat16): the FP8 scaling
    state moves with the model but stays fp32."""
    _, model = converted("llama")
    ids, kwargs = batch("llama")
    with te.autocast(recipe=recipe.DelayedScaling()):
        model(ids, **kwargs).loss.backward()
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    model.to(torch.bfloat16)
    meta = model.model.layers[0].mlp.down_proj.fp8_meta
    assert meta.scaling_fwd.scale.dtype == torch.float32 and meta.scaling_bwd.amax_history.dtype == torch.float32
    with te.autocast(recipe=recipe.DelayedScaling()):
        loss = model(ids, **kwargs).loss
    loss.backward()
    assert torch.isfinite(loss)


def test_trainer_bf16_gradient_checkpointing_and_fp8(tmp_path):
    """Hugging Face's Trainer as client code runs it on a CPU: bf16=True (torch.autocast),
    gradient checkpointing, and FP8 through a compute_loss wrapped in te.autocast; the loss
    falls and the model saves."""
    pytest.importorskip("accelerate")

    class Fp8Trainer(transformers.Trainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            with te.autocast(recipe=recipe.DelayedScaling()):
                return super().compute_loss(model, inputs, *args, **kwargs)

    ids = torch.randint(1, VOCAB, (8, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    _, model = converted("llama")
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=10,
                                          learning_rate=3e-3, bf16=True, use_cpu=True, gradient_checkpointing=True,
                                          report_to=[], save_strategy="no", logging_steps=1)
    trainer = Fp8Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 10 and all(map(math.isfinite, losses)) and losses[-1] < losses[0], losses
    model.save_pretrained(tmp_path / "saved")
