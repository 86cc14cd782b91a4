"""TransformerEngine's import path for activation recompute and its distributed helpers:
te.checkpoint (checkpointing.py: the recompute that keeps FP8 training exact),
activation_recompute_forward for callers that recompute by themselves (activation_recompute.py;
Megatron-Core), the RNG tracker both take (CudaRNGStatesTracker, rng.py), TE's collective
helpers (gather_along_first_dim, ...: parallel/te_helpers.py), and prepare_te_modules_for_fsdp.
"""
import torch

from .activation_recompute import (activation_recompute_forward, in_fp8_activation_recompute_phase,
                                   is_fp8_activation_recompute_enabled)
from .checkpointing import checkpoint
from .parallel.te_helpers import (allreduce, gather_along_first_dim, get_distributed_rank, get_distributed_world_size,
                                  initialize_affine_weight_gpu, reduce_scatter_along_first_dim,
                                  set_tensor_model_parallel_attributes)
from .rng import CudaRNGStatesTracker, get_all_rng_states, set_all_rng_states


__all__ = ["checkpoint", "activation_recompute_forward", "is_fp8_activation_recompute_enabled",
           "in_fp8_activation_recompute_phase", "CudaRNGStatesTracker", "get_all_rng_states", "set_all_rng_states",
           "gather_along_first_dim", "reduce_scatter_along_first_dim", "allreduce", "get_distributed_world_size",
           "get_distributed_rank", "initialize_affine_weight_gpu", "set_tensor_model_parallel_attributes",
           "prepare_te_modules_for_fsdp"]


def prepare_te_modules_for_fsdp(fsdp_root: torch.nn.Module) -> None:
    """TE's helper for FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel): every te GEMM
    module that FSDP wrapped, the root's included, gets `fsdp_group`, its FSDP unit's process
    group. (TE's modules scatter their cached FP8 copies of the weights over it; these modules
    cast the weight FSDP gathered in each forward and keep no sharded FP8 copy, so the group is
    recorded for code that reads it.) Modules with FP8 weights (te.quantized_model_init) are
    refused, as TE refuses them: FSDP1 flattens parameters into one FlatParameter, which cannot
    stay quantized; FSDP2 (fully_shard) gathers them as FP8 (tensor/fsdp2.py)."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from .module._fp8_module import Fp8ModuleMixin
    if not isinstance(fsdp_root, FullyShardedDataParallel):
        raise TypeError(f"prepare_te_modules_for_fsdp: fsdp_root must be wrapped in FullyShardedDataParallel "
                        f"(FSDP1), got {type(fsdp_root).__name__}")
    for unit in fsdp_root.modules():
        if not isinstance(unit, FullyShardedDataParallel) or not isinstance(unit.module, Fp8ModuleMixin):
            continue
        if getattr(unit.module, "weight_quantization", None) is not None:
            raise RuntimeError(f"prepare_te_modules_for_fsdp: {type(unit.module).__name__} keeps its weights in FP8 "
                               f"(built under te.quantized_model_init), which FSDP1 cannot shard; build it without "
                               f"te.quantized_model_init, or shard it with FSDP2's fully_shard")
        unit.module.fsdp_group = unit.process_group
