// The norm kernels compiled for the portable tier.
#include "cpu/isa/tier_portable.h"
#include "cpu/norm/norm_kernels.h"
