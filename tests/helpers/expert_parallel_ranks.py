"""What each rank of tests/distributed/test_expert_parallel.py runs.

alltoall_dispatch: the token dispatch of Megatron-LM's all-to-all MoE dispatcher, written out
with this package's pieces: te.moe_permute groups a rank's token copies by expert, an
all-to-all (torch's functional one, differentiable) sends each expert's copies to the rank
holding it, te.moe_sort_chunks_by_index orders what arrived by local expert, te.GroupedLinear
runs the local experts, and the way back undoes each step, te.moe_unpermute merging the copies
with their router probabilities. Against the same experts all on one rank.

megatron_moe: Megatron-Core's GPT with the TE layer spec and a grouped-GEMM MoE layer at
expert_model_parallel_size=2 (its allgather dispatcher: the all-to-all one needs CUDA streams)
against size 1 from the same weights; the CPU-only shims of megatron_tp_ranks.py.
"""
import re

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import transformer_engine.pytorch as te

EXPERTS, HIDDEN, FFN, TOKENS, TOP_K = 4, 16, 24, 12, 2


def _routing(tokens: torch.Tensor, router: torch.Tensor):
    """(routing_map [tokens, experts] bool, probs [tokens, experts]): top-k of a softmax router."""
    scores = torch.softmax(tokens @ router, dim=-1)
    top = scores.topk(TOP_K, dim=-1).indices
    routing_map = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, top, True)
    return routing_map, scores * routing_map


def _experts(x: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor, experts: te.GroupedLinear):
    """The MoE output of x [tokens, hidden] with every expert on this rank."""
    permuted, row_id_map = te.moe_permute(x, routing_map)  # [copies, hidden], grouped by expert
    counts = routing_map.sum(dim=0).tolist()  # copies per expert
    return te.moe_unpermute(experts(permuted, counts), row_id_map, merging_probs=probs)


def _expert_parallel(x, routing_map, probs, local: te.GroupedLinear, world: int):
    """The same over the ranks: this rank holds experts [rank * n, (rank + 1) * n)."""
    n = EXPERTS // world
    permuted, row_id_map = te.moe_permute(x, routing_map)  # [copies, hidden], experts 0..E-1
    counts = routing_map.sum(dim=0).to(torch.int64)  # [E] copies this rank sends to each expert
    counts_all = [torch.empty_like(counts) for _ in range(world)]
    dist.all_gather(counts_all, counts)
    received = torch.stack(counts_all)[:, dist.get_rank() * n:(dist.get_rank() + 1) * n]  # [source rank, local e]
    send_splits = counts.view(world, n).sum(dim=1).tolist()  # copies to each rank
    recv_splits = received.sum(dim=1).tolist()
    arrived = funcol.all_to_all_single_autograd(permuted, recv_splits, send_splits, dist.group.WORLD)
    # arrived: [source rank][local expert] chunks -> [local expert][source rank]
    chunk_sizes = received.flatten()  # [world * n]
    by_expert = torch.arange(world * n).view(world, n).t().flatten()
    grouped = te.moe_sort_chunks_by_index(arrived, chunk_sizes, by_expert)
    out = local(grouped, received.sum(dim=0).tolist())
    back_order = torch.arange(world * n).view(n, world).t().flatten()
    back = te.moe_sort_chunks_by_index(out, received.t().flatten(), back_order)
    returned = funcol.all_to_all_single_autograd(back, send_splits, recv_splits, dist.group.WORLD)
    return te.moe_unpermute(returned, row_id_map, merging_probs=probs)


def alltoall_dispatch(rank: int, world: int) -> dict:
    torch.manual_seed(0)  # the experts and router alike on both ranks
    full = te.GroupedLinear(EXPERTS, HIDDEN, HIDDEN, bias=False)
    n = EXPERTS // world
    local = te.GroupedLinear(n, HIDDEN, HIDDEN, bias=False)
    with torch.no_grad():
        for i in range(n):
            getattr(local, f"weight{i}").copy_(getattr(full, f"weight{rank * n + i}"))
    router = torch.randn(HIDDEN, EXPERTS)
    torch.manual_seed(100 + rank)  # each rank's own tokens
    x = torch.randn(TOKENS, HIDDEN)
    routing_map, probs = _routing(x, router)
    x_full, x_ep = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_full = _experts(x_full, routing_map, probs, full)
    y_ep = _expert_parallel(x_ep, routing_map, probs, local, world)
    upstream = torch.randn_like(y_full)
    (y_full * upstream).sum().backward()
    (y_ep * upstream).sum().backward()
    found = {"output": (y_ep - y_full).abs().max().item(), "input grad": (x_ep.grad - x_full.grad).abs().max().item()}
    # An expert's gradient comes from every rank's tokens: the one-rank experts' summed over ranks.
    summed = torch.stack([getattr(full, f"weight{e}").grad for e in range(EXPERTS)])
    dist.all_reduce(summed)
    for i in range(n):
        found[f"weight{i} grad"] = (getattr(local, f"weight{i}").grad - summed[rank * n + i]).abs().max().item()
    found["scale"] = y_full.abs().max().item()
    return found


def megatron_moe(rank: int, world: int) -> dict:
    from megatron.core import parallel_state
    torch.cuda.current_device = lambda: "cpu"
    torch.manual_seed(0)
    full = _moe_gpt(1)
    params = {name: p.detach().clone() for name, p in full.named_parameters()}
    loss1, grads1 = _moe_step(full)
    parallel_state.destroy_model_parallel()
    split = _moe_gpt(world)
    local = EXPERTS // world

    def source(name: str) -> str:
        """The one-rank parameter of this rank's expert parameter (weight{i} / bias{i})."""
        match = re.match(r"(.*\.experts\..*(?:weight|bias))(\d+)$", name)
        return f"{match.group(1)}{rank * local + int(match.group(2))}" if match else name
    with torch.no_grad():
        for name, param in split.named_parameters():
            param.copy_(params[source(name)])
    loss2, grads2 = _moe_step(split)
    parallel_state.destroy_model_parallel()
    worst = 0.0
    for name, grad in grads2.items():
        # Both ranks feed the same batch: an expert's gradient gets it twice.
        got = grad / world if ".experts." in name else grad
        expected = grads1[source(name)]
        worst = max(worst, (got - expected).abs().max().item() / max(expected.abs().max().item(), 1e-6))
    experts = sum(".experts." in name for name in grads2)
    return {"loss1": loss1, "loss2": loss2, "worst_grad": worst, "expert_params": experts}


def _moe_gpt(ep: int):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron_tp_ranks import HEADS, SEQ, VOCAB, initialize_megatron
    initialize_megatron(ep=ep)
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=HEADS, use_cpu_initialization=True,
                               hidden_dropout=0.0, attention_dropout=0.0, num_moe_experts=EXPERTS,
                               moe_router_topk=TOP_K, moe_token_dispatcher_type="allgather",
                               expert_model_parallel_size=ep, moe_grouped_gemm=True, moe_aux_loss_coeff=0.0,
                               moe_router_load_balancing_type="none", ffn_hidden_size=128)
    spec = get_gpt_layer_with_transformer_engine_spec(num_experts=EXPERTS, moe_grouped_gemm=True)
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ)


def _moe_step(model):
    from megatron_tp_ranks import gpt_batch
    tokens, position_ids, causal_mask = gpt_batch(7)
    loss = model(tokens, position_ids, causal_mask, labels=tokens).float().mean()
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
