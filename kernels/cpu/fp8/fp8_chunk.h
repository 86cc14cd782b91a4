// The per-tensor FP8 quantisation of one contiguous range (scale, saturate, round, store the
// codes, max |x|), shared by the cast kernels (fp8_kernels.h) and the fused norm -> FP8
// forward (norm_kernels.h), so that both produce the same codes bit for bit.
// Included inside a tier's translation unit, after its vector headers.
#pragma once
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including fp8_chunk.h"
#endif

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

// The chunks' amaxes combined in chunk order, a NaN in any of them kept.
inline float combine_amaxes(const float* partial, int64_t chunks) {
  using Scalar = VecPortable<float, 1>;
  Scalar amax = Scalar::zero();
  for (int64_t c = 0; c < chunks; ++c) amax = Scalar::magnitude_max(amax, Scalar::broadcast(partial[c]));
  return amax.lane[0];
}

template <bool kStream, Fp8Format kFormat, typename W>
inline void put_fp8(const W& value, uint8_t* p) {
  if constexpr (kStream) value.template store_fp8_stream<kFormat>(p);
  else value.template store_fp8<kFormat>(p);
}

// The codes of V::kFp8Group consecutive vectors.
template <typename V, Fp8Format kFormat, bool kStream>
inline void put_fp8_group(const V* values, uint8_t* p) {
  if constexpr (V::kFp8Group > 1) V::template store_fp8_group<kFormat, kStream>(values, p);
  else put_fp8<kStream, kFormat>(values[0], p);
}

// Codes of in[begin, end) * scale into out; returns max |in| over the range when kAmax
// (else 0: the caller knew the amax before choosing the scale).
template <typename V, Fp8Format kFormat, bool kStream, typename T, bool kAmax = true>
float quantize_chunk(const T* in, uint8_t* out, int64_t begin, int64_t end, float scale) {
  using Scalar = VecPortable<float, 1>;
  constexpr int64_t kGroup = V::kFp8Group * V::kWidth;
  V running = V::zero();
  Scalar tail = Scalar::zero();
  int64_t j = begin;
  for (; j + kGroup <= end; j += kGroup) {
    V scaled[V::kFp8Group];
    for (int g = 0; g < V::kFp8Group; ++g) {
      const V x = V::load(in + j + g * V::kWidth);
      if constexpr (kAmax) running = V::magnitude_max(running, x);
      scaled[g] = x * V::broadcast(scale);
    }
    put_fp8_group<V, kFormat, kStream>(scaled, out + j);
  }
  for (; j + V::kWidth <= end; j += V::kWidth) {
    const V x = V::load(in + j);
    if constexpr (kAmax) running = V::magnitude_max(running, x);
    put_fp8<kStream, kFormat>(x * V::broadcast(scale), out + j);
  }
  for (; j < end; ++j) {
    const Scalar x = Scalar::load(in + j);
    if constexpr (kAmax) tail = Scalar::magnitude_max(tail, x);
    (x * Scalar::broadcast(scale)).template store_fp8<kFormat>(out + j);
  }
  return Scalar::magnitude_max(Scalar::broadcast(running.reduce_magnitude_max()), tail).lane[0];
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
