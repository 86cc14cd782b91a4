// The NVFP4 4over6 cast (nvfp4_four_over_six_entry.h) compiled for the avx512 tier: Nvfp4Lanes
// on ZMM registers (nvfp4_lanes_avx512.h).
#include "te_kernels/nvfp4.h"  // first: the public header stays baseline code
#include "cpu/isa/tier_avx512.h"
#include "cpu/nvfp4/nvfp4_lanes.h"
#if defined(TE_CPU_ISA_AVX512_X86)  // elsewhere the tier's Vec is the portable one
#include "cpu/nvfp4/nvfp4_lanes_avx512.h"
#endif
#include "cpu/nvfp4/nvfp4_four_over_six_entry.h"
