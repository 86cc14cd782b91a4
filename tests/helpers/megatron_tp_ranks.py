"""What each rank of tests/distributed/test_megatron_tp.py runs: Megatron-Core's GPTModel with the TE layer
spec trained a few steps at tensor_model_parallel_size=1, then, from the same weights split by
their partition attributes, at tensor_model_parallel_size=2 with sequence parallelism.

Megatron's own tensor-parallel layers (its vocab-parallel embedding, output layer and their
collectives) allocate on torch.cuda.current_device(), which a CPU-only torch cannot answer:
each rank answers "cpu" for it, and puts CPU tensors in the global memory buffer those layers
take scratch space from. Nothing in our package is patched."""
import torch
import torch.distributed as dist

VOCAB, SEQ, BATCH, HIDDEN, HEADS, STEPS = 128, 32, 2, 64, 4, 4


def initialize_megatron(tp: int = 1, ep: int = 1) -> None:
    """Megatron's model-parallel state for tp x ep, TE's RNG tracker, and CPU scratch buffers."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as megatron_random
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    megatron_random.model_parallel_cuda_manual_seed(1234, te_rng_tracker=True, force_reset_rng=True)
    for dtype in (torch.float32, torch.bfloat16):
        parallel_state.get_global_memory_buffer().buffer[("mpu", dtype)] = torch.empty(1 << 16, dtype=dtype)


def gpt_batch(seed: int, vocab: int = VOCAB, seq: int = SEQ, batch: int = BATCH):
    """(tokens [batch, seq], position_ids, causal mask [batch, 1, seq, seq], True = masked out)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq), generator=generator)
    position_ids = torch.arange(seq).expand(batch, seq)
    causal_mask = torch.ones(batch, 1, seq, seq, dtype=torch.bool).tril().logical_not()
    return tokens, position_ids, causal_mask


def _gpt(tp: int, fp8: bool):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig
    initialize_megatron(tp=tp)
    options = dict(num_layers=2, hidden_size=HIDDEN, num_attention_heads=HEADS, use_cpu_initialization=True,
                   hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=tp,
                   sequence_parallel=tp > 1)
    if fp8:
        options.update(fp8="hybrid", fp8_recipe="delayed", fp8_amax_history_len=16, fp8_amax_compute_algo="max")
    return GPTModel(config=TransformerConfig(**options),
                    transformer_layer_spec=get_gpt_layer_with_transformer_engine_spec(), vocab_size=VOCAB,
                    max_sequence_length=SEQ)


def _losses(model, tp_group) -> list:
    """STEPS steps of SGD on one batch; the gradients of parameters applied to sequence shards
    (marked sequence_parallel) summed over the tensor-parallel group first, as Megatron's
    finalize_model_grads does."""
    tokens, position_ids, causal_mask = gpt_batch(7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(STEPS):
        loss = model(tokens, position_ids, causal_mask, labels=tokens).float().mean()
        loss.backward()
        for param in model.parameters():
            if getattr(param, "sequence_parallel", False) and param.grad is not None:
                dist.all_reduce(param.grad, group=tp_group)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def losses_at_tp1_and_tp2(rank: int, world: int, fp8: bool) -> dict:
    from megatron.core import parallel_state
    torch.cuda.current_device = lambda: "cpu"
    torch.manual_seed(0)
    full = _gpt(1, fp8)
    full_params = {name: param.detach().clone() for name, param in full.named_parameters()}
    expected = _losses(full, None)
    parallel_state.destroy_model_parallel()
    split = _gpt(world, fp8)
    te_layers = sum(type(m).__name__.startswith("TE") for m in split.modules())
    with torch.no_grad():
        for name, param in split.named_parameters():
            source = full_params[name]
            if getattr(param, "tensor_model_parallel", False) and param.shape != source.shape:
                source = source.chunk(world, dim=param.partition_dim)[rank]
            param.copy_(source)
    got = _losses(split, parallel_state.get_tensor_model_parallel_group())
    parallel_state.destroy_model_parallel()
    return {"tp1": expected, "tp2": got, "te_layers": te_layers}


def fp32(rank: int, world: int) -> dict:
    return losses_at_tp1_and_tp2(rank, world, fp8=False)


def fp8(rank: int, world: int) -> dict:
    return losses_at_tp1_and_tp2(rank, world, fp8=True)
