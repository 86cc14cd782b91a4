// The cross-entropy kernels compiled for the avx2 tier.
#include "cpu/isa/tier_avx2.h"
#include "cpu/cross_entropy/cross_entropy_kernels.h"
