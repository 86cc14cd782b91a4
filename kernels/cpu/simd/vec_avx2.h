// Eight fp32 lanes in one YMM register; bf16/fp16 are widened on load and rounded (to
// nearest even, NaN quieted) on store, matching the scalar conversions in dtype.h.
// Only included by the translation unit compiled for avx2,fma,f16c.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including vec_avx2.h"
#endif

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

struct VecAvx2 {
  using Acc = float;
  static constexpr int kWidth = 8;
  __m256 v;

  static VecAvx2 broadcast(float value) { return {_mm256_set1_ps(value)}; }
  static VecAvx2 zero() { return {_mm256_setzero_ps()}; }

  static VecAvx2 load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static VecAvx2 load(const bf16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))};
  }
  static VecAvx2 load(const fp16_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
  }

  void store(float* p) const { _mm256_storeu_ps(p, v); }
  void store(bf16_t* p) const { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16_bits()); }

  // Non-temporal stores (p aligned to the vector's byte size): large outputs skip the
  // read-for-ownership of the destination line and do not evict the inputs from cache.
  void store_stream(float* p) const { _mm256_stream_ps(p, v); }
  void store_stream(bf16_t* p) const { _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_bf16_bits()); }
  void store_stream(fp16_t* p) const {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }

  // Orders this thread's streaming stores before whatever the caller does next.
  static void stream_fence() { _mm_sfence(); }

  // Round to nearest even on the bit pattern: add 0x7fff plus the lowest kept bit, keep the
  // top half. NaN lanes become the canonical quiet NaN first (as c10::BFloat16 does), so the
  // rounding add cannot carry a NaN into infinity.
  __m128i to_bf16_bits() const {
    const __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    const __m256i bits = _mm256_castps_si256(_mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), is_nan));
    const __m256i tie_bit = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(tie_bit, _mm256_set1_epi32(0x7fff)));
    // Gather bytes 2-3 of each 32-bit lane into the low 8 bytes of each 128-bit half, then
    // bring the two halves' low quadwords together.
    const __m256i take_high_halves = _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1,
                                                      2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i gathered = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(rounded, take_high_halves), 0x08);
    return _mm256_castsi256_si128(gathered);
  }
  void store(fp16_t* p) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }

  float reduce_add() const {
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    sum = _mm_add_ss(sum, _mm_shuffle_ps(sum, sum, 1));
    return _mm_cvtss_f32(sum);
  }
};

// Free operators (GCC does not apply a target pragma to in-class friend definitions).
inline VecAvx2 operator+(VecAvx2 a, VecAvx2 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline VecAvx2 operator-(VecAvx2 a, VecAvx2 b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline VecAvx2 operator*(VecAvx2 a, VecAvx2 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline VecAvx2 fmadd(VecAvx2 a, VecAvx2 b, VecAvx2 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
