// Byte-matrix transposes and line writes for the fused FP8 quantize + transpose. Square
// blocks go through registers: 16 x 16 with SSE2 byte unpacks on x86-64 (every tier there
// has SSE2), 8 x 8 as eight 64-bit words elsewhere; ragged edges byte by byte.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including byte_transpose.h"
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

// The fused quantize + transpose works on tiles of kTile rows x kPanel columns, kStrip rows
// at a time: a strip's codes are staged in L1 ([kStrip, kPanel], 2 KiB) and transposed into
// the tile's transpose buffer ([kPanel, kTile], 16 KiB), which then gives each row of `out_t`
// one run of kTile bytes (two cache lines) at once. Both buffers and the input rows in flight
// fit in L1 together.
constexpr int64_t kTile = 128;
constexpr int64_t kPanel = 128;
constexpr int64_t kStrip = 16;
// Input rows are prefetched this many rows ahead, into L2. A panel's row segments lie a whole
// row apart, a power of two for the common widths, so they share a handful of cache sets: a
// whole panel prefetched ahead evicts itself before it is read, and in L1 (12 ways) not even
// 16 rows stay; L2 holds them. bf16 [8192, 4096] on the 2-core Sapphire Rapids VM: 8 rows
// into L1 8.4-8.6 ms, 16 rows into L2 8.0-8.3 ms (in-cache [4096, 1024]: 0.85 -> 0.92 ms).
constexpr int64_t kPrefetchRows = 16;
// Outputs of at least this many bytes each are written with streaming stores, from a lower
// size than the other kernels' (streaming.h): an ordinary store first reads its line, and
// here that is two extra bytes read per input element, with the transposed lines scattered
// all over out_t. Measured on bf16 [4096, 1024] (4 MiB outputs): 1.36 -> 1.16 ms.
constexpr size_t kTransposeStreamMinBytes = size_t(2) << 20;

#if defined(__x86_64__) || defined(_M_X64)
constexpr int64_t kByteBlock = 16;

// dst[j * dst_stride + i] = src[i * src_stride + j] for a 16 x 16 block. Four rounds of
// unpacks, each interleaving pairs of registers at twice the previous width (8, 16, 32,
// then 64 bits); after round k a register holds 2^k rows of 16 / 2^k columns.
inline void transpose_byte_block(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
  __m128i a[16], b[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * src_stride));
  for (int k = 0; k < 8; ++k) {  // b[2k], b[2k+1]: columns 0-7 / 8-15 of rows 2k, 2k+1
    b[2 * k] = _mm_unpacklo_epi8(a[2 * k], a[2 * k + 1]);
    b[2 * k + 1] = _mm_unpackhi_epi8(a[2 * k], a[2 * k + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // a[4g + q]: columns 4q..4q+3 of rows 4g..4g+3
    a[4 * g + 0] = _mm_unpacklo_epi16(b[4 * g], b[4 * g + 2]);
    a[4 * g + 1] = _mm_unpackhi_epi16(b[4 * g], b[4 * g + 2]);
    a[4 * g + 2] = _mm_unpacklo_epi16(b[4 * g + 1], b[4 * g + 3]);
    a[4 * g + 3] = _mm_unpackhi_epi16(b[4 * g + 1], b[4 * g + 3]);
  }
  for (int h = 0; h < 2; ++h) {  // b[8h + m]: columns 2m, 2m+1 of rows 8h..8h+7
    for (int q = 0; q < 4; ++q) {
      b[8 * h + 2 * q] = _mm_unpacklo_epi32(a[8 * h + q], a[8 * h + 4 + q]);
      b[8 * h + 2 * q + 1] = _mm_unpackhi_epi32(a[8 * h + q], a[8 * h + 4 + q]);
    }
  }
  for (int m = 0; m < 8; ++m) {  // column 2m and 2m+1, all sixteen rows
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * m) * dst_stride), _mm_unpacklo_epi64(b[m], b[8 + m]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * m + 1) * dst_stride), _mm_unpackhi_epi64(b[m], b[8 + m]));
  }
}
#else
constexpr int64_t kByteBlock = 8;

// An 8 x 8 block held as eight 64-bit rows, transposed in place by swapping 1-, 2- then
// 4-byte pieces between rows 1, 2 and 4 apart: afterwards word k holds column k.
inline void transpose_byte_block(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
  uint64_t w[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&w[i], src + i * src_stride, 8);
  for (int i = 0; i < 8; i += 2) {
    const uint64_t t = ((w[i] >> 8) ^ w[i + 1]) & 0x00FF00FF00FF00FFull;
    w[i + 1] ^= t, w[i] ^= t << 8;
  }
  for (int i : {0, 1, 4, 5}) {
    const uint64_t t = ((w[i] >> 16) ^ w[i + 2]) & 0x0000FFFF0000FFFFull;
    w[i + 2] ^= t, w[i] ^= t << 16;
  }
  for (int i = 0; i < 4; ++i) {
    const uint64_t t = ((w[i] >> 32) ^ w[i + 4]) & 0x00000000FFFFFFFFull;
    w[i + 4] ^= t, w[i] ^= t << 32;
  }
  for (int k = 0; k < 8; ++k) std::memcpy(dst + k * dst_stride, &w[k], 8);
}
#endif

// dst[j * dst_stride + i] = src[i * src_stride + j] for i < n_rows, j < n_cols: square
// blocks through registers, ragged edges byte by byte. Local restrict pointers: byte stores
// may alias anything, so without them the compiler reloads every bound per store.
inline void transpose_bytes(const uint8_t* __restrict src, int64_t src_stride, uint8_t* __restrict dst,
                            int64_t dst_stride, int64_t n_rows, int64_t n_cols) {
  const int64_t full_rows = n_rows / kByteBlock * kByteBlock, full_cols = n_cols / kByteBlock * kByteBlock;
  for (int64_t i = 0; i < full_rows; i += kByteBlock) {
    for (int64_t j = 0; j < full_cols; j += kByteBlock) {
      transpose_byte_block(src + i * src_stride + j, src_stride, dst + j * dst_stride + i, dst_stride);
    }
    for (int64_t j = full_cols; j < n_cols; ++j)
      for (int64_t k = i; k < i + kByteBlock; ++k) dst[j * dst_stride + k] = src[k * src_stride + j];
  }
  for (int64_t i = full_rows; i < n_rows; ++i)
    for (int64_t j = 0; j < n_cols; ++j) dst[j * dst_stride + i] = src[i * src_stride + j];
}

// Copies n bytes; with `stream`, whole 16-byte pieces to a 16-byte aligned dst go out as
// non-temporal stores (the caller fences), so a destination line written in one go is not
// first read from memory.
inline void write_bytes(uint8_t* dst, const uint8_t* src, int64_t n, bool stream) {
#if defined(__x86_64__) || defined(_M_X64)
  if (stream && reinterpret_cast<uintptr_t>(dst) % 16 == 0 && n % 16 == 0) {
    int64_t k = 0;
    // The tier's own vectors stream whole 32 or 64 bytes per store (half or a quarter of
    // the stores); the portable tier's vectors have no streaming store.
    constexpr int64_t kVecBytes = int64_t(sizeof(float)) * Vec::kWidth;
    if constexpr (!std::is_same_v<Vec, VecPortable<float, Vec::kWidth>>) {
      if (reinterpret_cast<uintptr_t>(dst) % kVecBytes == 0) {
        for (; k + kVecBytes <= n; k += kVecBytes) {
          Vec::load(reinterpret_cast<const float*>(src + k)).store_stream(reinterpret_cast<float*>(dst + k));
        }
      }
    }
    for (; k < n; k += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k)));
    }
    return;
  }
#endif
  std::memcpy(dst, src, size_t(n));
}

// Prefetches base[first, first + count) into L2, clipped to the numel elements of base, line by
// line. The tiled passes read each input row kPanel elements at a time, a pattern the
// hardware prefetchers do not follow.
template <typename T>
inline void prefetch_elements(const T* base, int64_t first, int64_t count, int64_t numel) {
  const int64_t end = std::min(first + count, numel);
  if (first >= end) return;
  const char* line = reinterpret_cast<const char*>(base + first);
  const char* stop = reinterpret_cast<const char*>(base + end);
  for (; line < stop; line += 64) __builtin_prefetch(line, 0, 2);
}

inline void fence_streaming_stores() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_sfence();
#endif
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
