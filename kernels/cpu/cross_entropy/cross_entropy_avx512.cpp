// The cross-entropy kernels compiled for the avx512 tier.
#include "cpu/isa/tier_avx512.h"
#include "cpu/cross_entropy/cross_entropy_kernels.h"
