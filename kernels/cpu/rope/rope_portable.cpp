// The RoPE kernels compiled for the portable tier.
#include "cpu/isa/tier_portable.h"
#include "cpu/rope/rope_kernels.h"
