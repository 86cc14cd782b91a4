// The vector-level FP8 quantisation of one contiguous range (scale, saturate, round, store
// codes, amax), and the chunking helpers around it; shared by the per-tensor cast
// (fp8_kernels.h) and the kernels that fuse a cast into their output (activation_kernels.h,
// norm_kernels.h), so that a fused cast produces the same codes as the stand-alone one, bit
// for bit.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including fp8_chunk.h"
#endif
#pragma once

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

constexpr int64_t kBlock = 64;

// [begin, end) of part `index` of `parts` over numel elements, cut at multiples of kBlock.
inline std::pair<int64_t, int64_t> block_aligned_part(int64_t numel, int64_t index, int64_t parts) {
  const int64_t blocks = (numel + kBlock - 1) / kBlock;
  return {std::min(numel, blocks * index / parts * kBlock), std::min(numel, blocks * (index + 1) / parts * kBlock)};
}

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
