"""The names of cuDNN's fused-attention backends, which TE code compares a backend selection
against. This package has no cuDNN backend: its attention selection (attention/backends)
never returns one of these but No_Backend."""
import enum


class FusedAttnBackend(enum.IntEnum):
    No_Backend = -1
    F16_max512_seqlen = 0
    F16_arbitrary_seqlen = 1
    FP8 = 2
