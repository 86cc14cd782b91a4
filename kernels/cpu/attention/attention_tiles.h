// The building blocks of both passes of flash attention (attention_kernels.h), written over
// the tier's vector type: fp32 tile products and dot products of packed rows, rows widened to
// fp32 and rounded back, transposes, and the loop that hands tasks to the threads.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including attention_tiles.h"
#endif
#pragma once

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "cpu/attention/attention_layout.h"
#include "cpu/softmax/softmax_row.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::attention_detail {

using softmax_row::VecOf;
using softmax_row::sweep;

// C[m x n] += A[m x k] B[k x n]: A read as scalars (rows lda apart), B and C as rows of
// vectors (ldb, ldc apart); n a multiple of V::kWidth. Register tiles of R rows by NV vectors:
// each step of k loads NV vectors of B and broadcasts R scalars of A into R * NV FMAs.
template <typename V, int R, int NV>
inline void tile(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t k) {
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NV; ++n) acc[r][n] = V::load(c + r * ldc + n * V::kWidth);
  for (int64_t kk = 0; kk < k; ++kk) {
    V bv[NV];
    for (int n = 0; n < NV; ++n) bv[n] = V::load(b + kk * ldb + n * V::kWidth);
    for (int r = 0; r < R; ++r) {
      const V av = V::broadcast(a[r * lda + kk]);
      for (int n = 0; n < NV; ++n) acc[r][n] = fmadd(av, bv[n], acc[r][n]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NV; ++n) acc[r][n].store(c + r * ldc + n * V::kWidth);
}

template <typename V, int R>
inline void tile_columns(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t n,
                         int64_t k) {
  int64_t j = 0;
  for (; j + 2 * V::kWidth <= n; j += 2 * V::kWidth) tile<V, R, 2>(a, lda, b + j, ldb, c + j, ldc, k);
  for (; j < n; j += V::kWidth) tile<V, R, 1>(a, lda, b + j, ldb, c + j, ldc, k);
}

// Tiles of 6 rows by 2 vectors: 12 FMA chains, enough to keep two FMA units busy through their
// 4-cycle latency, with 15 of AVX2's 16 registers (4 rows left each unit's chains waiting). Each
// element's sum runs over k in order whatever its tile, so the tiling never changes a result.
template <typename V>
void gemm_acc(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m, int64_t n,
              int64_t k) {
  int64_t i = 0;
  for (; i + 6 <= m; i += 6) tile_columns<V, 6>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k);
  switch (m - i) {
    case 5: return tile_columns<V, 5>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k);
    case 4: return tile_columns<V, 4>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k);
    case 3: return tile_columns<V, 3>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k);
    case 2: return tile_columns<V, 2>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k);
    case 1: return tile_columns<V, 1>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k);
    default: return;
  }
}

// tile(rows_in_tile, r) for the tiles of four of `rows` rows (the last one 1 to 4), r the tile's
// first row and rows_in_tile a std::integral_constant, for the tile functions' template.
template <typename Tile>
inline void for_row_tiles(int64_t rows, Tile&& tile) {
  for (int64_t r = 0; r < rows; r += 4) {
    switch (std::min<int64_t>(rows - r, 4)) {
      case 4: tile(std::integral_constant<int, 4>{}, r); break;
      case 3: tile(std::integral_constant<int, 3>{}, r); break;
      case 2: tile(std::integral_constant<int, 2>{}, r); break;
      default: tile(std::integral_constant<int, 1>{}, r); break;
    }
  }
}

// One step of dot_tile: the values [c, c + V::kWidth) of the query rows (q, packed dkp floats
// apart) against those of the keys k[j], widened in registers.
template <typename V, int R, int NK, typename K>
inline void dot_step(const float* q, int64_t dkp, int64_t c, const K* const (&k)[NK], V (&acc)[R][NK]) {
  V kv[NK];
  for (int j = 0; j < NK; ++j) kv[j] = V::load(k[j]);
  for (int r = 0; r < R; ++r) {
    const V qv = V::load(q + r * dkp + c);
    for (int j = 0; j < NK; ++j) acc[r][j] = fmadd(qv, kv[j], acc[r][j]);
  }
}

// scores[r * ld + j] = q_r . k_j for r < R, j < NK (R * NK <= V::kWidth): rows of q packed dkp
// floats apart, zero past the head dim dk; each key row read where it lies (keys[j], of the
// input type or packed floats) and widened in registers, with no copy: the way for a task of
// few query rows, where a transposed copy of the keys would cost more than the products. Lane
// c % kWidth of a score's sum takes the values c in order, and the lanes leave through one
// transposing tree (V::sum_lanes), so a score rounds alike in every tile, whether its keys lie
// in the input or were packed (the forward and the backward). Each 64 bytes of a key row read
// ask for the same bytes of ahead[j] (j < ahead_count) into L2, spread over the products (a
// burst of them would fill the miss buffers). The head dim's last values, if fewer than a
// vector, are read after the loop (GCC keeps the sums of a loop with a partial load in memory).
template <typename V, int R, int NK, typename K>
inline void dot_tile(const float* q, int64_t dkp, const K* const* keys, int64_t dk, float* scores, int64_t ld,
                     const K* const* ahead, int64_t ahead_count) {
  constexpr int W = V::kWidth;
  static_assert(R * NK <= W, "dot_tile: one lane of the sums per score");
  constexpr int64_t kPerLine = 64 / int64_t(sizeof(K));
  V acc[R][NK];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NK; ++j) acc[r][j] = V::zero();
  const int asked = int(std::clamp<int64_t>(ahead_count, 0, NK));
  int64_t c = 0;
  for (; c + W <= dk; c += W) {
    if (c % kPerLine == 0)
      for (int j = 0; j < asked; ++j) __builtin_prefetch(ahead[j] + c, 0, 2);
    const K* k[NK];
    for (int j = 0; j < NK; ++j) k[j] = keys[j] + c;
    dot_step<V, R, NK>(q, dkp, c, k, acc);
  }
  if (c < dk) {  // the rest of the head dim, read as zeros past dk
    K tail[NK][W] = {};
    const K* k[NK];
    for (int j = 0; j < NK; ++j) {
      std::copy(keys[j] + c, keys[j] + dk, tail[j]);
      k[j] = tail[j];
    }
    dot_step<V, R, NK>(q, dkp, c, k, acc);
  }
  for (int j = 0; j < asked; ++j) __builtin_prefetch(ahead[j] + dk - 1, 0, 2);  // an unaligned row's last line
  V lanes[W];
  for (int i = 0; i < W; ++i) lanes[i] = i < R * NK ? acc[i / NK][i % NK] : V::zero();
  alignas(64) float sums[W];
  V::sum_lanes(lanes).store(sums);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NK; ++j) scores[r * ld + j] = sums[r * NK + j];
}

// dot_tile over the keys [0, nk), a quarter of the vector width of keys at a time (R * NK
// scores in one vector of sums), then one key at a time.
template <typename V, int R, typename K>
inline void dot_keys(const float* q, int64_t dkp, const K* const* keys, int64_t dk, int64_t nk, float* scores,
                     int64_t ld, const K* const* ahead, int64_t ahead_count) {
  constexpr int NK = V::kWidth >= 4 ? V::kWidth / 4 : 1;
  int64_t j = 0;
  for (; j + NK <= nk; j += NK)
    dot_tile<V, R, NK>(q, dkp, keys + j, dk, scores + j, ld, ahead + j, ahead_count - j);
  for (; j < nk; ++j) dot_tile<V, R, 1>(q, dkp, keys + j, dk, scores + j, ld, ahead + j, ahead_count - j);
}

// Asks for the bytes [from, from + bytes) into L2, one prefetch per 64 bytes and one for the
// last byte (an unaligned range's last line).
inline void ask_for(const void* from, int64_t bytes) {
  const char* first = static_cast<const char*>(from);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(first + b, 0, 2);
  __builtin_prefetch(first + bytes - 1, 0, 2);
}

// Asks for the cache lines that start within [from, from + bytes), and for the line of `from`
// itself when it starts a row: the pieces of a row, each asking for its own lines, ask for each
// of the row's lines once (a prefetch of a line already on its way still takes a slot of the
// miss buffers, and stalls when they are full).
inline void ask_for_lines(const void* from, int64_t bytes, bool row_start) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(from), end = begin + uintptr_t(bytes);
  if (row_start && begin % 64 != 0) __builtin_prefetch(from, 0, 2);
  for (uintptr_t line = (begin + 63) / 64 * 64; line < end; line += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 2);
}

// scores[r * ld + j] = q_r . k_j for r < rows, j < nk (dot_tile), four query rows at a time;
// the first four ask for the key rows ahead (`ahead`, ahead_count of them: the step after this
// one's), those past nk at the end.
template <typename V, typename K>
void dot_rows(const float* q, int64_t dkp, const K* const* keys, int64_t dk, int64_t rows, int64_t nk, float* scores,
              int64_t ld, const K* const* ahead = nullptr, int64_t ahead_count = 0) {
  for_row_tiles(rows, [&](auto tile_rows, int64_t r) {
    const int64_t asked = r == 0 ? std::min(ahead_count, nk) : 0;
    dot_keys<V, decltype(tile_rows)::value>(q + r * dkp, dkp, keys, dk, nk, scores + r * ld, ld, ahead, asked);
  });
  for (int64_t j = nk; j < ahead_count; ++j) ask_for(ahead[j], dk * int64_t(sizeof(K)));
}

// acc[r * ld + c] += sum over j < nk of p[r * ldp + j] * values[j][c0 + c] for r < R,
// c < NV * W::kWidth: each value row read where it lies (values[j], elements of T) and widened
// to fp32 in registers, with no packed copy; one FMA chain per output element, keys in order.
// Reading row j asks for the lines of the same columns of ahead[j] (j < ahead_count) into L2,
// so that memory streams the next step's rows during this one's products.
template <typename W, int R, int NV, typename T>
inline void value_tile(const float* p, int64_t ldp, const T* const* values, int64_t nk, int64_t c0, float* acc,
                       int64_t ld, const T* const* ahead, int64_t ahead_count) {
  W sum[R][NV];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NV; ++n) sum[r][n] = W::load(acc + r * ld + c0 + n * W::kWidth);
  for (int64_t j = 0; j < nk; ++j) {
    if (j < ahead_count) ask_for_lines(ahead[j] + c0, NV * W::kWidth * int64_t(sizeof(T)), c0 == 0);
    W v[NV];
    for (int n = 0; n < NV; ++n) v[n] = W::load(values[j] + c0 + n * W::kWidth);
    for (int r = 0; r < R; ++r) {
      const W weight = W::broadcast(p[r * ldp + j]);
      for (int n = 0; n < NV; ++n) sum[r][n] = fmadd(weight, v[n], sum[r][n]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NV; ++n) sum[r][n].store(acc + r * ld + c0 + n * W::kWidth);
}

// value_tile over the columns [0, dv): groups of NV vectors, then single vectors, then single
// lanes for a head dim that is not a multiple of the width.
template <typename V, int R, typename T>
inline void value_columns(const float* p, int64_t ldp, const T* const* values, int64_t nk, int64_t dv, float* acc,
                          int64_t ld, const T* const* ahead, int64_t ahead_count) {
  // Four vectors of 16 lanes (16 sums, 4 values, 1 weight of 32 registers); two of narrower ones.
  constexpr int NV = V::kWidth >= 16 ? 4 : 2;
  using Lane = VecPortable<float, 1>;
  int64_t c = 0;
  for (; c + NV * V::kWidth <= dv; c += NV * V::kWidth)
    value_tile<V, R, NV>(p, ldp, values, nk, c, acc, ld, ahead, ahead_count);
  for (; c + V::kWidth <= dv; c += V::kWidth) value_tile<V, R, 1>(p, ldp, values, nk, c, acc, ld, ahead, ahead_count);
  for (; c < dv; ++c) value_tile<Lane, R, 1>(p, ldp, values, nk, c, acc, ld, ahead, 0);  // the vectors asked for the rows
}

// O += P V for a task of few query rows (attention_layout::scores_by_rows): acc [rows][ld] +=
// p [rows][ldp] times the value rows values[j], j < nk, read where they lie (value_tile), four
// rows at a time; the first four ask for the rows ahead (the step after this one's values).
template <typename V, typename T>
void value_rows(const float* p, int64_t ldp, const T* const* values, int64_t nk, int64_t dv, float* acc, int64_t ld,
                int64_t rows, const T* const* ahead, int64_t ahead_count) {
  for_row_tiles(rows, [&](auto tile_rows, int64_t r) {
    const int64_t asked = r == 0 ? ahead_count : 0;
    value_columns<V, decltype(tile_rows)::value>(p + r * ldp, ldp, values, nk, dv, acc + r * ld, ld, ahead, asked);
  });
}

// K^T of a key block: dst[c * ld + j] = keys[j][c] widened to fp32 for c < dk, j < nk, and zero
// for j in [nk, n): tiles of kWidth keys by kWidth values transposed in registers
// (V::transpose), the ragged edges value by value. A forward's query block packs each key block
// it reaches, so this runs once per (query block, key block).
template <typename V, typename T>
void pack_transposed(const T* const* keys, int64_t nk, int64_t n, int64_t dk, float* dst, int64_t ld) {
  constexpr int W = V::kWidth;
  const int64_t whole_keys = nk / W * W, whole_dims = dk / W * W;
  for (int64_t j0 = 0; j0 < whole_keys; j0 += W) {
    for (int64_t c0 = 0; c0 < whole_dims; c0 += W) {
      V tile[W];
      for (int i = 0; i < W; ++i) tile[i] = V::load(keys[j0 + i] + c0);
      V::transpose(tile);
      for (int i = 0; i < W; ++i) tile[i].store(dst + (c0 + i) * ld + j0);
    }
    for (int64_t c = whole_dims; c < dk; ++c)
      for (int64_t j = j0; j < j0 + W; ++j) dst[c * ld + j] = float(to_float(keys[j][c]));
  }
  for (int64_t c = 0; c < dk; ++c) {
    float* col = dst + c * ld;
    for (int64_t j = whole_keys; j < nk; ++j) col[j] = float(to_float(keys[j][c]));
    std::fill(col + nk, col + n, 0.0f);
  }
}

// dst[0, n) = src widened to fp32; dst[n, padded) = 0.
template <typename V, typename T>
inline void widen_row(const T* src, float* dst, int64_t n, int64_t padded) {
  sweep<V>(0, n, [&](auto* tag, int64_t c) { VecOf<decltype(tag)>::load(src + c).store(dst + c); });
  std::fill(dst + n, dst + padded, 0.0f);
}

template <typename V, typename T>
inline void narrow_row(const float* src, float factor, T* dst, int64_t n) {
  sweep<V>(0, n, [&](auto* tag, int64_t c) {
    using W = VecOf<decltype(tag)>;
    (W::load(src + c) * W::broadcast(factor)).store(dst + c);
  });
}

// FP8 attention: x[j] for j in [begin, end) becomes the value of its code, format(x[j] * scale)
// (the cast's rounding: saturating, to nearest even; exact in fp32); returns the largest |x[j]|
// before the scaling (NaN skipped), the entries' share of the tensor's amax.
// Values put on the FP8 grid one vector at a time: round(W) returns the values of value *
// scale's codes (the cast's rounding: saturating, to nearest even; exact in fp32), and keeps
// the largest |value| before the scaling (NaN skipped) for amax().
template <typename V, Fp8Format kFormat>
struct Fp8Rounding {
  using Scalar = VecPortable<float, 1>;
  float scale;
  V running = V::zero();
  Scalar tail = Scalar::zero();

  template <typename W>
  W round(const W& value) {
    if constexpr (W::kWidth > 1) running = V::magnitude_max(running, value);
    else tail = Scalar::magnitude_max(tail, value);
    alignas(64) uint8_t codes[W::kWidth];
    (value * W::broadcast(scale)).template store_fp8<kFormat>(codes);
    return W::template load_fp8<kFormat>(codes);
  }
  float amax() const { return Scalar::magnitude_max(Scalar::broadcast(running.reduce_magnitude_max()), tail).lane[0]; }
};

// x[j] for j in [begin, end) replaced by the values of their FP8 codes at `scale`
// (Fp8Rounding); returns the largest |x[j]| before the scaling, the entries' share of the
// tensor's amax.
template <typename V, Fp8Format kFormat>
float fp8_values_in_place(float* x, int64_t begin, int64_t end, float scale) {
  Fp8Rounding<V, kFormat> rounding{scale};
  sweep<V>(begin, end, [&](auto* tag, int64_t j) {
    using W = VecOf<decltype(tag)>;
    rounding.round(W::load(x + j)).store(x + j);
  });
  return rounding.amax();
}

template <typename V>
float fp8_values_in_place(float* x, int64_t begin, int64_t end, float scale, Fp8Format format) {
  return format == Fp8Format::kE4M3 ? fp8_values_in_place<V, Fp8Format::kE4M3>(x, begin, end, scale)
                                    : fp8_values_in_place<V, Fp8Format::kE5M2>(x, begin, end, scale);
}

// dst[c][j] = src[j][c] (times factor[j][c], laid out as src, when given) for j < rows,
// c < cols (dst rows ld_dst apart), zero for j in [rows, padded_rows).
inline void transpose(const float* src, int64_t ld_src, int64_t rows, int64_t padded_rows, int64_t cols, float* dst,
                      int64_t ld_dst, const float* factor = nullptr) {
  for (int64_t c = 0; c < cols; ++c) {
    float* out = dst + c * ld_dst;
    if (factor != nullptr) {
      for (int64_t j = 0; j < rows; ++j) out[j] = src[j * ld_src + c] * factor[j * ld_src + c];
    } else {
      for (int64_t j = 0; j < rows; ++j) out[j] = src[j * ld_src + c];
    }
    std::fill(out + rows, out + padded_rows, 0.0f);
  }
}

inline int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// The products of inputs of type T on the CPU's bf16 dot-product instructions, where this tier
// compiles them (attention_bf16_dots.h specialises it for bf16_t in the avx512 tier): none here.
template <typename T>
struct Bf16Dots {
  static constexpr bool kCompiled = false;
};

// Whether a pass over inputs of type T takes Bf16Dots<T>'s products on this CPU.
template <typename T>
bool use_bf16_dots() {
  if constexpr (Bf16Dots<T>::kCompiled) {
    return Bf16Dots<T>::available();
  } else {
    return false;
  }
}

// Runs body(task, slot) for every task in [0, tasks): each of the pool's bodies takes a
// workspace slot and pulls tasks from a shared counter until none is left. Which thread runs
// a task never changes its result.
template <typename Body>
void for_each_task(int64_t tasks, const ThreadPool& pool, Body&& body) {
  const int64_t slots = attention_layout::slot_count(tasks, pool);
  std::atomic<int64_t> next{0};
  pool.parallel_for(slots, 1, [&](int64_t begin, int64_t end) {
    for (int64_t slot = begin; slot < end; ++slot) {
      for (int64_t task = next.fetch_add(1); task < tasks; task = next.fetch_add(1)) body(task, slot);
    }
  });
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE::attention_detail
