// 4over6's cast (nvfp4_kernels.h with kFourOverSix), the entry point of nvfp4.cpp built by
// nvfp4_four_over_six_<tier>.cpp: units of its own, so that its code leaves GCC's inlining
// budget of the other casts' units as it was (in one unit with them it changed what was
// inlined into the plain cast, whose fp32 1 x 16 form then ran 10% slower beyond the caches).
#include "cpu/nvfp4/nvfp4_kernels.h"

namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE {
namespace nvfp4_detail {

template <typename T>
struct QuantizeFourOverSix {
  static void run(const Nvfp4QuantizeParams& p, const ThreadPool& pool) {
    if (p.source.rht) quantize<T, true, false, true>(p, pool);
    else quantize<T, false, false, true>(p, pool);
  }
};

}  // namespace nvfp4_detail

void nvfp4_quantize_four_over_six(const Nvfp4QuantizeParams& p, const ThreadPool& pool) {
  nvfp4_detail::dispatch<nvfp4_detail::QuantizeFourOverSix>(p.source.dtype, p, pool);
}

}  // namespace te_kernels::cpu::TE_CPU_ISA_NAMESPACE
