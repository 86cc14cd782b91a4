// How a tier widens codes of b to fp32 lanes for the few-rows FMA path (gemm_few_rows_fma.h):
// 2 * V::kWidth FP8 codes, and V::kWidth E2M1 codes (packed two a byte, the value at even k in
// the low half) times their block's scale; every value exact in fp32. This one goes through the
// tier's FP8 loads, and lane by lane for E2M1; a tier with a faster way specializes it
// (few_rows_widen_avx2.h). A tier may also check a run of kE4M3Run steps of E4M3 codes at once
// and widen the run a faster way where the check allows (e4m3_run_kind, e4m3_run).
#pragma once

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::gemm_detail {

// What a run of E4M3 codes holds, as far as a tier's check tells: only normal numbers; no NaN;
// anything.
enum class Fp8Run { kNormal, kFinite, kAny };

template <typename V>
struct FewRowsWiden {
  template <Fp8Format kFormat>
  static void fp8(const uint8_t* codes, V& low, V& high) {
    low = V::template load_fp8<kFormat>(codes);
    high = V::template load_fp8<kFormat>(codes + V::kWidth);
  }
  // E4M3 codes widen to their values times kE4M3Unit (a power of two; gemm_few_rows_fma.h scales
  // a by its inverse so that each product is the code's value times a's, exactly).
  static constexpr float kE4M3Unit = 1.0f;
  static constexpr int kE4M3Run = 1;
  static V e2m1(const uint8_t* pairs, float scale) {
    float values[V::kWidth];
    for (int i = 0; i < V::kWidth; i += 2) {
      values[i] = e2m1_value(uint8_t(pairs[i / 2] & 0xf)) * scale;
      values[i + 1] = e2m1_value(uint8_t(pairs[i / 2] >> 4)) * scale;
    }
    return V::load(values);
  }
};

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::gemm_detail
