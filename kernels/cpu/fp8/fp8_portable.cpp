// The FP8 cast and block-cast kernels compiled for the portable tier.
#include "cpu/isa/tier_portable.h"
#include "cpu/fp8/fp8_kernels.h"
#include "cpu/fp8/fp8_block_kernels.h"
