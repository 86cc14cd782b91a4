"""The names of cuDNN's fused-attention backends, which TE code compares a backend selection
against, and TE's functions that call cuDNN's fused attention directly. This package has no
cuDNN: its attention selection (attention/backends) never returns one of these backends but
No_Backend, and the functions refuse, naming what runs attention here."""
import enum


class FusedAttnBackend(enum.IntEnum):
    No_Backend = -1
    F16_max512_seqlen = 0
    F16_arbitrary_seqlen = 1
    FP8 = 2


_NO_CUDNN = ("{}: cuDNN's fused attention is not in this package; te.DotProductAttention runs attention "
             "(on the CPU, this package's flash kernel), with the same masks, layouts and cu_seqlens")


def fused_attn_fwd(*args, **kwargs):
    """TE's direct call of cuDNN's fused-attention forward: refused (see the module's docstring)."""
    raise NotImplementedError(_NO_CUDNN.format("fused_attn_fwd"))


def fused_attn_bwd(*args, **kwargs):
    """TE's direct call of cuDNN's fused-attention backward: refused (see the module's docstring)."""
    raise NotImplementedError(_NO_CUDNN.format("fused_attn_bwd"))
