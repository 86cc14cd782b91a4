// The vector FP8 encoding both x86 tiers use (vec_avx2.h, vec_avx512.h): |v|, saturated, is
// rounded to the FP8 grid by one fp32 addition. For |v| in binade 2^e, c = 2^(e + 23 - M)
// (M mantissa bits; e at least the smallest normal exponent) has a unit in the last place of
// exactly one FP8 step there, so |v| + c rounds |v| to the FP8 grid, to nearest even, in
// hardware, and the low bits of the sum count the steps above c. steps + (exponent of c << M)
// is then the code plus fp8_first_code(): at a carry (steps == 2^(M+1)) it lands on the next
// binade's first code, and with c at its floor it is the subnormal code. Constants only: no
// instructions, so both tiers' translation units can share them.
#pragma once

#include "te_kernels/fp8.h"

namespace te_kernels::cpu {

// The biased fp32 exponent of c for subnormal and smallest-normal FP8 values.
template <Fp8Format kFormat>
constexpr int fp8_floor_exponent() { return kFormat == Fp8Format::kE4M3 ? 141 : 134; }

// The offset that exponent puts on the codes.
template <Fp8Format kFormat>
constexpr int fp8_first_code() { return fp8_floor_exponent<kFormat>() << (kFormat == Fp8Format::kE4M3 ? 3 : 2); }

}  // namespace te_kernels::cpu
