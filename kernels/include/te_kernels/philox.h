// Philox4x32-10, the counter-based generator of Salmon et al. ("Parallel random numbers: as
// easy as 1, 2, 3", SC'11): four 32-bit output words, a function of a 128-bit counter and a
// 64-bit key alone, so that any draw can be made again anywhere (attention's dropout draws its
// mask in the forward and again in the backward). Checked against Random123's known answers in
// kernels/tests/test_attention.cpp.
#pragma once

#include <cstdint>

namespace te_kernels {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;

struct Philox4 {
  uint32_t word[4];
};

inline Philox4 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint64_t key) {
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const uint64_t p0 = uint64_t(kPhiloxM0) * c0, p1 = uint64_t(kPhiloxM1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return {{c0, c1, c2, c3}};
}

}  // namespace te_kernels
