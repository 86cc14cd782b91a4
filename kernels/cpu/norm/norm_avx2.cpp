// The norm kernels compiled for the avx2 tier.
#include "cpu/isa/tier_avx2.h"
#include "cpu/norm/norm_kernels.h"
