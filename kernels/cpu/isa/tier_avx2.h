// Opens the avx2 tier for the unit the build generates for each family (<family>_avx2.cpp): the unit
// includes the family's public header, then this, then the family's *_kernels.h, which
// compiles into te_kernels::cpu::avx2. Only those units include it, once each.
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

#define TE_CPU_ISA_NAMESPACE avx2
#include "cpu/simd/vec_portable.h"
#include "cpu/simd/philox_lanes.h"
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
// Everything after this is compiled for avx2; the API files (norm.cpp, fp8_cast.cpp, ...)
// call it only after checking the CPU supports it. The headers above stay baseline, so no
// shared inline function is ever emitted with these instructions.
#pragma GCC target("avx2,fma,f16c")
#include "cpu/simd/vec_avx2.h"
#include "cpu/simd/philox_avx2.h"
namespace te_kernels::cpu::avx2 {
using Vec = VecAvx2;
}
#else
// Not an x86-64 build: this tier is never selected; its kernels are built on the portable
// vectors only so that every entry point exists.
namespace te_kernels::cpu::avx2 {
using Vec = VecPortable<float, 8>;
}
#endif
#include "cpu/simd/streaming.h"
#include "cpu/simd/unfused.h"
