// nvfp4_transpose_tiles (te_kernels/nvfp4.h): the column-wise usage of a 16 x 16-tile cast
// taken from its row-wise codes instead of cast again from the high-precision values (a
// weight's second cast read 32 MiB of bf16 at [4096, 4096]; this reads 8 MiB of codes). Pure
// data movement, nibbles regrouped: the SSE2 steps (x86-64's baseline, so no tier to choose)
// and the scalar edges write the same bytes.
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "cpu/isa/entries.h"
#include "te_kernels/nvfp4.h"

namespace te_kernels {
namespace {

// A SIMD step: 16 input rows (8 bytes of each transposed row) by 16 input bytes (32 columns,
// 32 transposed rows).
constexpr int64_t kStepRows = 16;
constexpr int64_t kStepColumns = 32;
// A task: 128 columns, so that it reads whole 64-byte lines of each input row (4 steps side by
// side) and no line is fetched again by the next task.
constexpr int64_t kTaskColumns = 4 * kStepColumns;
// The bands whose bytes a task stages before writing them out: a 64-byte line of each row.
constexpr int64_t kStagedBands = 8;
constexpr int64_t kStagedBytes = kStagedBands * kStepRows / 2;

uint8_t code_at(const uint8_t* data, int64_t stride, int64_t row, int64_t col) {
  return data[row * stride + col / 2] >> (4 * (col % 2)) & 0xF;
}

// Byte i of transposed row c: the codes of input rows 2 i (low nibble) and 2 i + 1 (0 past the rows).
uint8_t transposed_byte(const Nvfp4TransposeTilesParams& p, int64_t in_stride, int64_t c, int64_t i) {
  const uint8_t low = code_at(p.data, in_stride, 2 * i, c);
  const uint8_t high = 2 * i + 1 < p.rows ? code_at(p.data, in_stride, 2 * i + 1, c) : 0;
  return uint8_t(low | high << 4);
}

#if defined(__SSE2__)
// v[q]'s byte j is byte q of column j (j < 16): each column's 8 bytes to out + j * stride.
// Byte, word and dword unpacks gather them: t[2 q] holds bytes 2 q, 2 q + 1 of columns 0-7,
// t[2 q + 1] of columns 8-15; u[4 h + g] bytes 0-3 of columns 8 h + 4 g .. + 3, u[4 h + 2 + g]
// their bytes 4-7; a dword unpack of the two leaves two columns' 8 bytes per register.
void store_columns(const __m128i (&v)[8], uint8_t* out, int64_t stride) {
  __m128i t[8], u[8];
  for (int q = 0; q < 4; ++q) {
    t[2 * q] = _mm_unpacklo_epi8(v[2 * q], v[2 * q + 1]);
    t[2 * q + 1] = _mm_unpackhi_epi8(v[2 * q], v[2 * q + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    u[4 * h] = _mm_unpacklo_epi16(t[h], t[2 + h]);
    u[4 * h + 1] = _mm_unpackhi_epi16(t[h], t[2 + h]);
    u[4 * h + 2] = _mm_unpacklo_epi16(t[4 + h], t[6 + h]);
    u[4 * h + 3] = _mm_unpackhi_epi16(t[4 + h], t[6 + h]);
  }
  for (int h = 0; h < 2; ++h) {
    for (int g = 0; g < 2; ++g) {
      const __m128i first = _mm_unpacklo_epi32(u[4 * h + g], u[4 * h + 2 + g]);   // columns + 0, + 1
      const __m128i second = _mm_unpackhi_epi32(u[4 * h + g], u[4 * h + 2 + g]);  // columns + 2, + 3
      uint8_t* column = out + (8 * h + 4 * g) * stride;
      _mm_storel_epi64(reinterpret_cast<__m128i*>(column), first);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(column + stride), _mm_unpackhi_epi64(first, first));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(column + 2 * stride), second);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(column + 3 * stride), _mm_unpackhi_epi64(second, second));
    }
  }
}

// `bytes` staged bytes to out: a whole 16-byte-aligned line by streaming stores (the
// transposed codes are read by a later GEMM, not now: no line is fetched to be overwritten),
// else copied.
void write_line(uint8_t* out, const uint8_t* staged, int64_t bytes) {
  if (bytes != kStagedBytes || reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    std::memcpy(out, staged, size_t(bytes));
    return;
  }
  for (int64_t b = 0; b < kStagedBytes; b += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + b), _mm_load_si128(reinterpret_cast<const __m128i*>(staged + b)));
  }
}

// Input rows [0, 16) x bytes [0, 16) at `in` to the 32 transposed rows at `out` (8 bytes each).
// Row pair q's bytes a, b give, per byte j, column 2 j's byte q (a's low nibble, b's low nibble
// above it) and column 2 j + 1's (their high nibbles).
void transpose_step(const uint8_t* in, int64_t in_stride, uint8_t* out, int64_t out_stride) {
  const __m128i low = _mm_set1_epi8(0x0F);
  __m128i even[8], odd[8];
  for (int q = 0; q < 8; ++q) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * q * in_stride));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + (2 * q + 1) * in_stride));
    even[q] = _mm_or_si128(_mm_and_si128(a, low), _mm_slli_epi16(_mm_and_si128(b, low), 4));
    odd[q] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), low), _mm_andnot_si128(low, b));
  }
  store_columns(even, out, 2 * out_stride);
  store_columns(odd, out + out_stride, 2 * out_stride);
}
#endif

// The scales of transposed rows [c0, c1) (c0 a multiple of 128): row c's t-th is tile (t, c / 16)'s,
// on input row 16 t. Input rows 16 t lie 16 * ceil(cols / 16) bytes apart, often a multiple of
// 4 KiB, where all of them fall in one set of L1: reading them column by column missed L1 on
// every byte (5 ms of a [4096, 4096] weight's 10). So each row's bytes for these columns are
// read once into `tiles` ([kTileChunk][kTaskColumns / 16]), and the rows written from there.
constexpr int64_t kTileChunk = 256;

void transpose_scales(const Nvfp4TransposeTilesParams& p, int64_t c0, int64_t c1) {
  const int64_t scale_cols = (p.cols + kNvfp4Block - 1) / kNvfp4Block;
  const int64_t tile_rows = (p.rows + kNvfp4Block - 1) / kNvfp4Block;
  const int64_t q0 = c0 / kNvfp4Block, q1 = (c1 + kNvfp4Block - 1) / kNvfp4Block;  // the tiles' columns
  const uint8_t* scales = p.scales;
  uint8_t* transposed = p.transposed_scales;
  uint8_t tiles[kTileChunk][kTaskColumns / kNvfp4Block];
  for (int64_t t0 = 0; t0 < tile_rows; t0 += kTileChunk) {
    const int64_t chunk = std::min(kTileChunk, tile_rows - t0);
    for (int64_t t = 0; t < chunk; ++t) {
      std::copy(scales + (t0 + t) * kNvfp4Block * scale_cols + q0, scales + (t0 + t) * kNvfp4Block * scale_cols + q1,
                tiles[t]);
    }
    for (int64_t c = c0; c < c1; ++c) {
      for (int64_t t = 0; t < chunk; ++t) transposed[c * tile_rows + t0 + t] = tiles[t][c / kNvfp4Block - q0];
    }
  }
}

// Transposed rows [c0, c1): their codes and their scales (tile (t, c / 16)'s, on input row 16 t).
void transpose_columns(const Nvfp4TransposeTilesParams& p, int64_t c0, int64_t c1) {
  const int64_t in_stride = (p.cols + 1) / 2, out_stride = (p.rows + 1) / 2;
  // Columns [c0, stepped) have their bytes [0, scalar_from) from the SIMD steps; the rest one by one.
  int64_t stepped = c0, scalar_from = 0;
#if defined(__SSE2__)
  // The steps write into `staged` (64 bytes of each transposed row: 8 bands), copied out a
  // whole line at a time: transposed rows lie out_stride bytes apart, often a multiple of 4 KiB
  // (all in one set of L1), so 8-byte writes straight to them missed L1 every time.
  const int64_t steps = (c1 - c0) / kStepColumns, bands = p.rows / kStepRows;
  alignas(64) uint8_t staged[kTaskColumns][kStagedBytes];
  for (int64_t b0 = 0; b0 < bands; b0 += kStagedBands) {
    const int64_t staged_bands = std::min(kStagedBands, bands - b0);
    for (int64_t band = b0; band < b0 + staged_bands; ++band) {
      for (int64_t step = 0; step < steps; ++step) {
        transpose_step(p.data + band * kStepRows * in_stride + (c0 + step * kStepColumns) / 2, in_stride,
                       &staged[step * kStepColumns][(band - b0) * kStepRows / 2], kStagedBytes);
      }
    }
    for (int64_t j = 0; j < steps * kStepColumns; ++j) {
      write_line(p.transposed_data + (c0 + j) * out_stride + b0 * kStepRows / 2, staged[j],
                 staged_bands * kStepRows / 2);
    }
  }
  _mm_sfence();  // the streaming stores of write_line, ordered before the task ends
  stepped = c0 + steps * kStepColumns, scalar_from = bands * kStepRows / 2;
#endif
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t i = c < stepped ? scalar_from : 0; i < out_stride; ++i) {
      p.transposed_data[c * out_stride + i] = transposed_byte(p, in_stride, c, i);
    }
  }
  transpose_scales(p, c0, c1);
}

}  // namespace

void nvfp4_transpose_tiles(const Nvfp4TransposeTilesParams& p, const ThreadPool& pool) {
  assert(p.rows >= 0 && p.cols >= 0 && "nvfp4_transpose_tiles: negative size");
  // Tasks of 128 transposed rows (the last may be fewer), each writing only its own rows.
  const int64_t tasks = (p.cols + kTaskColumns - 1) / kTaskColumns;
  const int64_t grain = std::max<int64_t>(1, cpu::kMinElementsPerTask / std::max<int64_t>(1, kTaskColumns * p.rows));
  pool.parallel_for(tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      transpose_columns(p, t * kTaskColumns, std::min(p.cols, (t + 1) * kTaskColumns));
    }
  });
}

}  // namespace te_kernels
