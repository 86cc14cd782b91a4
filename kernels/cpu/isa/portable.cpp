// Every kernel family compiled for the portable tier (see cpu/*/..._kernels.h).
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
namespace te_kernels::cpu::portable {
// Eight lanes: two SSE registers per vector on baseline x86-64, two NEON ones on aarch64.
using Vec = VecPortable<float, 8>;
}
#include "cpu/simd/streaming.h"
#include "cpu/norm/norm_kernels.h"
#include "cpu/fp8/fp8_kernels.h"
#include "cpu/fp8/fp8_block_kernels.h"
