// The entry points of nvfp4.cpp built by nvfp4_<tier>.cpp, 4over6's cast aside
// (nvfp4_four_over_six_entry.h): each runs the templates of nvfp4_kernels.h for its dtype.
#include "cpu/nvfp4/nvfp4_kernels.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace nvfp4_detail {

template <typename T>
struct Amax {
  static void run(const Nvfp4AmaxParams& p, const ThreadPool& pool) { amax<T>(p, pool); }
};
// The transform and the stochastic rounding are compiled in or out: the plain cast keeps its
// group in registers.
template <typename T>
struct Quantize {
  static void run(const Nvfp4QuantizeParams& p, const ThreadPool& pool) {
    if (p.source.rht) {
      if (p.stochastic) quantize<T, true, true, false>(p, pool);
      else quantize<T, true, false, false>(p, pool);
    } else {
      if (p.stochastic) quantize<T, false, true, false>(p, pool);
      else quantize<T, false, false, false>(p, pool);
    }
  }
};
template <typename T>
struct Dequantize {
  static void run(const Nvfp4DequantizeParams& p, const ThreadPool& pool) { dequantize<T>(p, pool); }
};

}  // namespace nvfp4_detail

void nvfp4_amax(const Nvfp4AmaxParams& p, const ThreadPool& pool) {
  nvfp4_detail::dispatch<nvfp4_detail::Amax>(p.source.dtype, p, pool);
}
void nvfp4_quantize(const Nvfp4QuantizeParams& p, const ThreadPool& pool) {
  nvfp4_detail::dispatch<nvfp4_detail::Quantize>(p.source.dtype, p, pool);
}
void nvfp4_dequantize(const Nvfp4DequantizeParams& p, const ThreadPool& pool) {
  nvfp4_detail::dispatch<nvfp4_detail::Dequantize>(p.out_dtype, p, pool);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
