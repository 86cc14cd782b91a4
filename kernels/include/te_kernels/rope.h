// Rotary position embedding (RoPE) of the first `rotary_dim` channels of every head.
//
// For a token at position p and channel j < rotary_dim (d2), with angle a = freqs[p, j]:
//   forward:   y[j] = x[j] * cos(a[j]) + rot(x)[j] * sin(a[j])
//   backward:  dx   = dy * cos(a) - rot(dy * sin(a))     (rot is antisymmetric: rot^T = -rot)
// where rot rotates pairs by 90 degrees:
//   halves (interleaved = false):  rot(x) = [-x[d2/2:], x[:d2/2]]
//   pairs  (interleaved = true):   rot(x)[2k] = -x[2k+1],  rot(x)[2k+1] = x[2k]
// Channels [rotary_dim, head_dim) pass through unchanged. cos/sin are evaluated in fp32 once
// per position (into the caller's workspace), never per head or per batch entry; all math is
// fp32 and the output is rounded once to the input's dtype.
//
// Layouts of x and y (same shape; y contiguous, x too unless its strides are given below):
//   kSbhd [seq, batch, heads, head_dim], kBshd [batch, seq, heads, head_dim],
//   kThd  [tokens, heads, head_dim]: `batch` packed sequences, sequence b holding tokens
//         [cu_seqlens[b], cu_seqlens[b+1]); positions restart at 0 at each sequence start.
// The position of a token is its index in its sequence plus start_positions[b] (0 if null).
#pragma once

#include <cstddef>
#include <cstdint>

#include "te_kernels/dtype.h"
#include "te_kernels/parallel.h"

namespace te_kernels {

enum class RopeFormat : int { kSbhd, kBshd, kThd };

struct RopeParams {
  RopeFormat format = RopeFormat::kSbhd;
  bool interleaved = false;
  bool backward = false;      // apply the transpose (rotation by -angle) to a gradient
  DType dtype = DType::kFloat32;  // of x and y: float32, bfloat16 or float16
  int64_t seq_len = 0;        // sbhd/bshd: positions per sequence; thd: total tokens
  int64_t batch = 0;          // sequences (thd: cu_seqlens has batch + 1 entries)
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;     // even, <= head_dim
  const void* x = nullptr;
  void* y = nullptr;
  // Elements from one token of x to the next and from one head to the next (0: packed, that
  // is heads * head_dim and head_dim). Each head's channels are contiguous; y is always packed.
  // A view of q or k split off a fused QKV projection is read where it lies.
  int64_t x_token_stride = 0, x_head_stride = 0;
  const float* freqs = nullptr;   // [freqs_rows, rotary_dim] angles
  int64_t freqs_rows = 0;
  const int64_t* cu_seqlens = nullptr;       // thd only: [batch + 1], 0 ... tokens
  const int64_t* start_positions = nullptr;  // optional: [batch]
  // Positions in use are [0, table_rows) (table_rows <= freqs_rows); see rope_table_rows().
  int64_t table_rows = 0;
  void* workspace = nullptr;  // rope_workspace_bytes(*this) bytes, 64-byte aligned
};

// One past the largest position any token uses (0 when there are no tokens).
int64_t rope_table_rows(const RopeParams& params);
size_t rope_workspace_bytes(const RopeParams& params);
// Rotates. The binding (bindings/rope_ops.cpp) checks the arguments first; debug builds assert
// what the kernel assumes (the constraints noted on the fields above).
void rope(const RopeParams& params, const ThreadPool& pool);

}  // namespace te_kernels
