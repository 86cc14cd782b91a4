// Every kernel family compiled for the avx512 tier (see cpu/*/..._kernels.h).
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

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
// Everything defined below is compiled for avx512; the API files (norm.cpp, fp8_cast.cpp) call it only
// after checking the CPU supports it. Headers above stay baseline, so no shared inline function is ever
// emitted with these instructions.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
// GCC 12 reports its own _mm512_undefined_* placeholders inside the reduce/convert
// intrinsics as maybe-uninitialised; they are by design.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TE_CPU_ISA_NAMESPACE avx512
#include "cpu/simd/vec_portable.h"
#include "cpu/simd/vec_avx512.h"
namespace te_kernels::cpu::avx512 {
using Vec = VecAvx512;
}
#include "cpu/simd/streaming.h"
#include "cpu/norm/norm_kernels.h"
#include "cpu/fp8/fp8_kernels.h"
#include "cpu/fp8/fp8_block_kernels.h"
#else
// Not an x86-64 build: this tier is never selected, so its entry points abort if reached.
#include <cstdlib>
namespace te_kernels::cpu::avx512 {
void norm_fwd(const NormFwdParams&, const ThreadPool&) { std::abort(); }
void norm_bwd(const NormBwdParams&, const ThreadPool&) { std::abort(); }
void fp8_quantize(const Fp8QuantizeParams&, const ThreadPool&) { std::abort(); }
void fp8_dequantize(const Fp8DequantizeParams&, const ThreadPool&) { std::abort(); }
void fp8_block_quantize(const Fp8BlockQuantizeParams&, const ThreadPool&) { std::abort(); }
void fp8_block_dequantize(const Fp8BlockDequantizeParams&, const ThreadPool&) { std::abort(); }
}  // namespace te_kernels::cpu::avx512
#endif
