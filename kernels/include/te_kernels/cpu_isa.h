// Which SIMD instruction set the CPU kernels use. Detected once at run time from CPUID and
// the OS-enabled register state (XGETBV); the default build never assumes more than the
// baseline of the target architecture, so one binary serves every x86-64 machine.
#pragma once

#include <cstddef>

namespace te_kernels {

// Ordered from least to most capable; a tier implies every tier below it.
enum class CpuIsa : int {
  kPortable = 0,  // plain C++ (whatever the compiler's baseline target gives)
  kAvx2 = 1,      // AVX2 + FMA + F16C
  kAvx512 = 2,    // AVX-512 F/BW/VL/DQ
  kAmx = 3,       // + AVX512-BF16 and the AMX-BF16 tiles, with the OS's permission to use them:
                  // the other families run their avx512 builds, the GEMM its AMX kernel
};

const char* cpu_isa_name(CpuIsa isa);

// The best tier this CPU and OS support.
CpuIsa detected_cpu_isa();

// The tier kernels dispatch to: the detected one unless capped by limit_cpu_isa().
CpuIsa active_cpu_isa();

// Caps the tier used from now on (tests use it to exercise every path on one machine).
// A cap above the detected tier has no effect. Returns the previous cap.
CpuIsa limit_cpu_isa(CpuIsa cap);

// Whether the CPU (and OS) support the AVX512-BF16 dot products (vdpbf16ps); used at the
// avx512 and amx tiers only.
bool cpu_has_avx512_bf16();

// Whether the CPU has AVX512-VBMI's byte permutes (with AVX-512 and the OS's ZMM state), used
// at the avx512 tier by the few-rows GEMM's FP8 widening; false in the emulated test build.
bool cpu_has_avx512_vbmi();

// Size of the last-level cache the OS reports (0 where it reports none); read once.
size_t last_level_cache_bytes();

// Ops that move at least this many bytes (inputs and outputs together) write their large
// outputs with streaming stores (cpu/simd/streaming.h): by default a quarter of the
// last-level cache, and at least 16 MiB.
size_t streaming_store_min_bytes();

// Sets that threshold (tests use it to reach the streaming paths whatever the cache size);
// returns the previous one.
size_t set_streaming_store_min_bytes(size_t bytes);

}  // namespace te_kernels
