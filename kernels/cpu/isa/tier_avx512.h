// Opens the avx512 tier for the unit the build generates for each family (<family>_avx512.cpp): the unit
// includes the family's public header, then this, then the family's *_kernels.h, which
// compiles into te_kernels::cpu::avx512. Only those units include it, once each.
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

#define TE_CPU_ISA_NAMESPACE avx512
#include "cpu/simd/vec_portable.h"
#include "cpu/simd/philox_lanes.h"
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#if defined(TE_KERNELS_EMULATE_AVX512)
// A test build of the kernel library (CMake's TE_KERNELS_SIMDE_INCLUDE, docs/testing.md): this
// tier runs on SIMDe's AVX-512 intrinsics, written over AVX2 (the build's baseline), so that
// the C++ tests check its kernels on a CPU without AVX-512. Never in the package.
#include "cpu/isa/simde_avx512.h"
#else
// Everything after this is compiled for avx512; the API files (norm.cpp, fp8_cast.cpp, ...)
// call it only after checking the CPU supports it. The headers above stay baseline, so no
// shared inline function is ever emitted with these instructions.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#endif
// GCC 12 reports its own _mm512_undefined_* placeholders inside the reduce/convert
// intrinsics as maybe-uninitialised (or, inlined into some callers, uninitialised); they
// are by design.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "cpu/simd/vec_avx512.h"
// Kernels with code for AVX-512 extensions beyond the tier's own (attention's bf16 dot products)
// compile it where this is defined, behind their run-time checks.
#define TE_CPU_ISA_AVX512_X86 1
#include "cpu/simd/philox_avx512.h"
namespace te_kernels::cpu::avx512 {
using Vec = VecAvx512;
}
#else
// Not an x86-64 build: this tier is never selected; its kernels are built on the portable
// vectors only so that every entry point exists.
namespace te_kernels::cpu::avx512 {
using Vec = VecPortable<float, 8>;
}
#endif
#include "cpu/simd/streaming.h"
#include "cpu/simd/unfused.h"
