// The norm kernels compiled for the portable tier (see norm_kernels.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cpu/norm/norm_isa.h"
#include "te_kernels/dtype.h"

#define TE_CPU_ISA_NAMESPACE portable
#include "cpu/simd/vec_portable.h"
namespace te_kernels::cpu::portable {
// Eight lanes: two SSE registers per vector on baseline x86-64, two NEON ones on aarch64.
using NormVec = VecPortable<float, 8>;
}
#include "cpu/norm/norm_kernels.h"
