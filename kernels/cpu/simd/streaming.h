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

// Outputs larger than the last-level cache can hold (streaming_store_min_bytes(), see
// te_kernels/cpu_isa.h) are written with streaming stores: a normal store first reads the
// destination line (write-allocate), which costs a third of the traffic of a
// read-one-write-one op. Needs every vector store aligned, i.e. aligned rows.
template <typename V, typename XT>
bool use_streaming_stores(const void* out, int64_t rows, int64_t cols) {
  const size_t vector_bytes = V::kWidth * sizeof(XT);
  return size_t(rows * cols) * sizeof(XT) >= streaming_store_min_bytes() &&
         reinterpret_cast<uintptr_t>(out) % vector_bytes == 0 && (size_t(cols) * sizeof(XT)) % vector_bytes == 0;
}

// For a flat [numel] output: large enough, and the first vector store aligned (the scalar
// tail uses ordinary stores).
template <typename V, typename T>
bool use_streaming_stores(const void* out, int64_t numel) {
  return size_t(numel) * sizeof(T) >= streaming_store_min_bytes() && reinterpret_cast<uintptr_t>(out) % (V::kWidth * sizeof(T)) == 0;
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
