"""The attributes Megatron-style trainers read off tensor-parallel parameters."""
from torch import Tensor


def set_tensor_model_parallel_attributes(tensor: Tensor, is_parallel: bool, dim: int, stride: int) -> None:
    """Marks a parameter as Megatron-LM marks its own: tensor_model_parallel (split over the
    tensor-parallel group, so that every rank's copy counts when norms and gradients are
    reduced), partition_dim (the dimension split) and partition_stride."""
    tensor.tensor_model_parallel = is_parallel
    tensor.partition_dim = dim
    tensor.partition_stride = stride


def mark_sequence_parallel(tensor: Tensor, sequence_parallel: bool) -> None:
    """A parameter applied to token shards (a norm's weights, a row-parallel bias): under
    sequence parallelism each rank's gradient covers its shard only, and the trainer all-reduces
    the gradients of the parameters carrying sequence_parallel=True over the group (as
    Megatron-LM does for TransformerEngine's)."""
    tensor.sequence_parallel = sequence_parallel
