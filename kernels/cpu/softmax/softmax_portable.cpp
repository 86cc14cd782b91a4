// The attention-softmax kernels compiled for the portable tier.
#include "cpu/isa/tier_portable.h"
#include "cpu/softmax/softmax_kernels.h"
