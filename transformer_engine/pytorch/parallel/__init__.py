"""Tensor and sequence parallelism on torch.distributed: the collectives the modules issue
(collectives.py), how one GEMM is split over a group (gemm_split.py) and the parameter
attributes Megatron-style trainers read (attributes.py). No transport of our own: every
exchange is a torch.distributed collective (gloo on the CPU, NCCL on CUDA, MCCL on MUSA)."""
