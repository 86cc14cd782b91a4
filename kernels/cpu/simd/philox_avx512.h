// philox_lanes (philox_lanes.h) for the avx512 tier: sixteen counters per register, the
// products as in philox_avx2.h (_mm512_mul_epu32 on the even lanes, the odd ones shifted down,
// masked blends back into their lanes).
#pragma once

#include <immintrin.h>

#include "cpu/simd/philox_lanes.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace philox_avx512 {

// (high words, low words) of the 32 x 32 -> 64-bit products a[i] * m, lane by lane.
inline void wide_product(__m512i a, __m512i m, __m512i& high, __m512i& low) {
  constexpr __mmask16 kOdd = 0xAAAA;
  const __m512i even = _mm512_mul_epu32(a, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  low = _mm512_mask_blend_epi32(kOdd, even, _mm512_slli_epi64(odd, 32));
  high = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(even, 32), odd);
}

}  // namespace philox_avx512

template <>
inline void philox_lanes<VecAvx512>(uint32_t* c0, uint32_t* c1, uint32_t* c2, uint32_t* c3, uint64_t key) {
  __m512i x0 = _mm512_loadu_si512(c0), x1 = _mm512_loadu_si512(c1);
  __m512i x2 = _mm512_loadu_si512(c2), x3 = _mm512_loadu_si512(c3);
  const __m512i m0 = _mm512_set1_epi32(int(kPhiloxM0)), m1 = _mm512_set1_epi32(int(kPhiloxM1));
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int round = 0; round < kPhiloxRounds; ++round) {
    __m512i high0, low0, high1, low1;
    philox_avx512::wide_product(x0, m0, high0, low0);
    philox_avx512::wide_product(x2, m1, high1, low1);
    x0 = _mm512_xor_si512(_mm512_xor_si512(high1, x1), _mm512_set1_epi32(int(k0)));
    x1 = low1;
    x2 = _mm512_xor_si512(_mm512_xor_si512(high0, x3), _mm512_set1_epi32(int(k1)));
    x3 = low0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  _mm512_storeu_si512(c0, x0);
  _mm512_storeu_si512(c1, x1);
  _mm512_storeu_si512(c2, x2);
  _mm512_storeu_si512(c3, x3);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
