// The NVFP4 casts (nvfp4_entries.h) compiled for the avx2 tier: Nvfp4Lanes on YMM registers
// (nvfp4_lanes_avx2.h).
#include "te_kernels/nvfp4.h"  // first: the public header stays baseline code
#include "cpu/isa/tier_avx2.h"
#include "cpu/nvfp4/nvfp4_lanes.h"
#if defined(__x86_64__) || defined(_M_X64)  // elsewhere the tier's Vec is the portable one
#include "cpu/nvfp4/nvfp4_lanes_avx2.h"
#endif
#include "cpu/nvfp4/nvfp4_entries.h"
