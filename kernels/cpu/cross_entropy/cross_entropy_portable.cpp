// The cross-entropy kernels compiled for the portable tier.
#include "cpu/isa/tier_portable.h"
#include "cpu/cross_entropy/cross_entropy_kernels.h"
