// The pybind11 side of the extension: build and CPU-capability facts, and gemm_pack_b, which
// lays a GEMM operand out for this CPU's kernel (a matter of the CPU kernel, not an op: its
// result is scaled_gemm's b_packed). Every tensor op goes through the dispatcher (each family's
// <family>_ops.cpp declares its schemas), the hottest also by direct calls (submodule direct,
// direct_calls.h).
#include <torch/extension.h>

#include <string>
#include <vector>

#include "direct_calls.h"
#include "te_kernels/cpu_isa.h"
#include "te_kernels/gemm.h"

#ifndef TE_VERSION
#error "setup.py defines TE_VERSION"
#endif
#ifndef TE_BACKENDS
#error "setup.py defines TE_BACKENDS (comma-separated device backends compiled in)"
#endif

namespace portable_te {
at::Tensor gemm_pack_b_cpu(const at::Tensor& b);  // scaled_gemm_ops.cpp

namespace {
std::vector<DirectCall::Define>& direct_call_definitions() {
  static std::vector<DirectCall::Define> definitions;
  return definitions;
}
}  // namespace

DirectCall::DirectCall(Define define) { direct_call_definitions().push_back(define); }

void define_direct_calls(pybind11::module_& direct) {
  for (const DirectCall::Define define : direct_call_definitions()) define(direct);
}
}  // namespace portable_te

namespace {

te_kernels::CpuIsa isa_from_name(const std::string& name) {
  for (auto isa : {te_kernels::CpuIsa::kPortable, te_kernels::CpuIsa::kAvx2, te_kernels::CpuIsa::kAvx512,
                   te_kernels::CpuIsa::kAmx}) {
    if (name == te_kernels::cpu_isa_name(isa)) return isa;
  }
  throw pybind11::value_error("unknown CPU ISA '" + name + "'; expected portable, avx2, avx512 or amx");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "portable TransformerEngine kernels: build information (ops are registered under torch.ops.portable_te)";
  m.attr("version") = TE_VERSION;
  m.attr("backends") = TE_BACKENDS;
  m.def("detected_cpu_isa", [] { return std::string(te_kernels::cpu_isa_name(te_kernels::detected_cpu_isa())); },
        "Best SIMD tier this CPU and OS support: portable, avx2, avx512 or amx.");
  m.def("active_cpu_isa", [] { return std::string(te_kernels::cpu_isa_name(te_kernels::active_cpu_isa())); },
        "SIMD tier the CPU kernels dispatch to now.");
  m.def(
      "limit_cpu_isa",
      [](const std::string& name) {
        return std::string(te_kernels::cpu_isa_name(te_kernels::limit_cpu_isa(isa_from_name(name))));
      },
      "Cap the SIMD tier (for tests of the lower tiers); returns the previous cap.");
  m.def("gemm_bf16_kernel", [] { return std::string(te_kernels::gemm_bf16_kernel()); },
        "What the bf16 GEMM runs on at the active tier: amx, avx512_bf16 or fma.");
  m.def("gemm_pack_b", &portable_te::gemm_pack_b_cpu,
        "b [n, k] (bf16 or FP8 codes, on the CPU) packed for the CPU GEMM kernel of the active tier, behind a "
        "header naming the tier and [n, k]: scaled_gemm's b_packed, for a b that serves many GEMMs.");
  m.def("last_level_cache_bytes", &te_kernels::last_level_cache_bytes,
        "Size of the last-level cache the OS reports (0 where it reports none).");
  m.def("streaming_store_min_bytes", &te_kernels::streaming_store_min_bytes,
        "Ops that move at least this many bytes write their large outputs with streaming stores (a quarter "
        "of the last-level cache, at least 16 MiB).");
  m.def("set_streaming_store_min_bytes", &te_kernels::set_streaming_store_min_bytes,
        "Set that threshold (tests use it to reach the streaming paths); returns the previous one.");
  pybind11::module_ direct = m.def_submodule("direct", "dispatcher calls of the hottest ops (direct_calls.h)");
  portable_te::define_direct_calls(direct);
}
