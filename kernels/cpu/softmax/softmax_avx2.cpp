// The attention-softmax kernels compiled for the avx2 tier.
#include "cpu/isa/tier_avx2.h"
#include "cpu/softmax/softmax_kernels.h"
