// The activation kernels compiled for the avx2 tier.
#include "cpu/isa/tier_avx2.h"
#include "cpu/activation/activation_kernels.h"
