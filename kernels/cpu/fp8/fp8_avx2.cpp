// The FP8 cast and block-cast kernels compiled for the avx2 tier.
#include "cpu/isa/tier_avx2.h"
#include "cpu/fp8/fp8_kernels.h"
#include "cpu/fp8/fp8_block_kernels.h"
