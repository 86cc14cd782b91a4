// The multi-tensor Adam kernels compiled for the avx2 tier.
#include "cpu/isa/tier_avx2.h"
#include "cpu/adam/adam_kernels.h"
