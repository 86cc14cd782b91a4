// The RoPE kernels compiled for the avx512 tier.
#include "cpu/isa/tier_avx512.h"
#include "cpu/rope/rope_kernels.h"
