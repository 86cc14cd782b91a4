// The multi-tensor Adam kernels compiled for the avx512 tier.
#include "cpu/isa/tier_avx512.h"
#include "cpu/adam/adam_kernels.h"
