// The multi-tensor Adam kernels compiled for the portable tier.
#include "cpu/isa/tier_portable.h"
#include "cpu/adam/adam_kernels.h"
