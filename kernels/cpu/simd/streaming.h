// Streaming (non-temporal) stores for outputs larger than the caches, shared by the kernel
// families. Included by each ISA translation unit inside its namespace.
#ifndef TE_CPU_ISA_NAMESPACE
#error "define TE_CPU_ISA_NAMESPACE before including streaming.h"
#endif

#include "te_kernels/cpu_isa.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {

template <bool kStream, typename W, typename T>
inline void put(const W& value, T* p) {
  if constexpr (kStream) value.store_stream(p);
  else value.store(p);
}

// Streaming stores skip the read of each destination line a normal store makes first
// (write-allocate), a third of the traffic of a read-one-write-one op, but they also send the
// output past the caches. They pay for large outputs (16 MiB on) of ops whose data, inputs
// and outputs together (op_bytes), cannot stay in the last-level cache anyway
// (streaming_store_min_bytes(), te_kernels/cpu_isa.h); below that, the op reading the output
// next finds it in cache.
constexpr size_t kMinStreamedOutputBytes = size_t(16) << 20;

inline bool worth_streaming(size_t out_bytes, size_t op_bytes) {
  return out_bytes >= kMinStreamedOutputBytes && op_bytes >= streaming_store_min_bytes();
}

// A [rows, cols] output: worth it, and every vector store aligned (aligned rows).
template <typename V, typename XT>
bool use_streaming_stores(const void* out, int64_t rows, int64_t cols, size_t op_bytes) {
  const size_t vector_bytes = V::kWidth * sizeof(XT);
  return worth_streaming(size_t(rows * cols) * sizeof(XT), op_bytes) &&
         reinterpret_cast<uintptr_t>(out) % vector_bytes == 0 && (size_t(cols) * sizeof(XT)) % vector_bytes == 0;
}

// A flat [numel] output: worth it, and the first vector store aligned (the scalar tail uses
// ordinary stores).
template <typename V, typename T>
bool use_streaming_stores(const void* out, int64_t numel, size_t op_bytes) {
  return worth_streaming(size_t(numel) * sizeof(T), op_bytes) && reinterpret_cast<uintptr_t>(out) % (V::kWidth * sizeof(T)) == 0;
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
