// The NVFP4 4over6 cast (nvfp4_four_over_six_entry.h) compiled for the portable tier:
// Nvfp4Lanes lane by lane, on the compiler's baseline vectors.
#include "te_kernels/nvfp4.h"  // first: the public header stays baseline code
#include "cpu/isa/tier_portable.h"
#include "cpu/nvfp4/nvfp4_lanes.h"
#include "cpu/nvfp4/nvfp4_four_over_six_entry.h"
