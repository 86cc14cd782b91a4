// The attention-softmax kernels compiled for the avx512 tier.
#include "cpu/isa/tier_avx512.h"
#include "cpu/softmax/softmax_kernels.h"
