// The activation kernels compiled for the avx512 tier.
#include "cpu/isa/tier_avx512.h"
#include "cpu/activation/activation_kernels.h"
