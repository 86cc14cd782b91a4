// The FP8 cast and block-cast kernels compiled for the avx512 tier.
#include "cpu/isa/tier_avx512.h"
#include "cpu/fp8/fp8_kernels.h"
#include "cpu/fp8/fp8_block_kernels.h"
