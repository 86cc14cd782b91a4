// The activation kernels compiled for the portable tier.
#include "cpu/isa/tier_portable.h"
#include "cpu/activation/activation_kernels.h"
