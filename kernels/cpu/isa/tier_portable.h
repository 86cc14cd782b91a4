// Opens the portable tier for the unit the build generates for each family (<family>_portable.cpp): the unit
// includes the family's public header, then this, then the family's *_kernels.h, which
// compiles into te_kernels::cpu::portable. Only those units include it, once each.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/isa/entries.h"
#include "te_kernels/dtype.h"
#include "te_kernels/fp8.h"
#include "te_kernels/fp8_block.h"

#define TE_CPU_ISA_NAMESPACE portable
#include "cpu/simd/vec_portable.h"
#include "cpu/simd/philox_lanes.h"
namespace te_kernels::cpu::portable {
// Eight lanes: two SSE registers per vector on baseline x86-64, two NEON ones on aarch64.
using Vec = VecPortable<float, 8>;
}
#include "cpu/simd/streaming.h"
#include "cpu/simd/unfused.h"
