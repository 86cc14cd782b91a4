#include "te_kernels/cpu_isa.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#if defined(__unix__)
#include <unistd.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define TE_KERNELS_X86 1
#endif

namespace te_kernels {
namespace {

#if TE_KERNELS_X86
// XCR0: which register states the OS saves on a context switch. Instructions on a state
// the OS does not save must not be used even if CPUID lists them.
uint64_t read_xcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

CpuIsa probe_simd() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return CpuIsa::kPortable;
  const bool osxsave = ecx & (1u << 27);
  const bool fma = ecx & (1u << 12);
  const bool f16c = ecx & (1u << 29);
  const bool avx = ecx & (1u << 28);
  if (!(osxsave && avx)) return CpuIsa::kPortable;
  const uint64_t xcr0 = read_xcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;       // SSE + AVX
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;     // + opmask, ZMM_Hi256, Hi16_ZMM
  if (__get_cpuid_max(0, nullptr) < 7) return CpuIsa::kPortable;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool avx2 = ebx & (1u << 5);
  const bool avx512f = ebx & (1u << 16), avx512dq = ebx & (1u << 17);
  const bool avx512bw = ebx & (1u << 30), avx512vl = ebx & (1u << 31);
  if (!(ymm_state && avx2 && fma && f16c)) return CpuIsa::kPortable;
#if defined(TE_KERNELS_EMULATE_AVX512)
  return CpuIsa::kAvx512;  // the test build whose avx512 tier runs on SIMDe (tier_avx512.h)
#endif
  if (zmm_state && avx512f && avx512dq && avx512bw && avx512vl) return CpuIsa::kAvx512;
  return CpuIsa::kAvx2;
}

bool probe_avx512_bf16() {
  if (probe_simd() != CpuIsa::kAvx512 || __get_cpuid_max(0, nullptr) < 7) return false;
#if defined(TE_KERNELS_EMULATE_AVX512)
  return true;  // SIMDe's vdpbf16ps, in the emulated test build
#endif
  unsigned eax, ebx, ecx, edx;
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  return eax & (1u << 5);
}

bool probe_avx512_vbmi() {
#if defined(TE_KERNELS_EMULATE_AVX512)
  return false;  // SIMDe's tier: the VBMI paths run natively only
#endif
  if (probe_simd() != CpuIsa::kAvx512 || __get_cpuid_max(0, nullptr) < 7) return false;
  unsigned eax, ebx, ecx, edx;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  return ecx & (1u << 1);
}

// AMX-BF16 tiles: CPUID lists AMX-TILE, AMX-BF16 (and AVX512-VBMI), XCR0 has the tile state (XTILECFG,
// XTILEDATA), and the OS grants this process the 8 KiB of tile data it must save on every
// context switch. Linux asks for that grant (arch_prctl ARCH_REQ_XCOMP_PERM, since 5.16);
// without it the first tile instruction faults. Elsewhere the tiles stay unused.
bool probe_amx_bf16() {
  if (!probe_avx512_bf16()) return false;
  unsigned eax, ebx, ecx, edx;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool amx_bf16 = edx & (1u << 22), amx_tile = edx & (1u << 24);
  const bool avx512_vbmi = ecx & (1u << 1);  // every AMX CPU has it; gemm_amx.cpp's widening uses it
  const bool tile_state = (read_xcr0() & (uint64_t(3) << 17)) == (uint64_t(3) << 17);
  if (!(amx_bf16 && amx_tile && avx512_vbmi && tile_state)) return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuIsa probe() { return probe_amx_bf16() ? CpuIsa::kAmx : probe_simd(); }
#else
CpuIsa probe() { return CpuIsa::kPortable; }
bool probe_avx512_bf16() { return false; }
bool probe_avx512_vbmi() { return false; }
#endif

std::atomic<int> g_cap{int(CpuIsa::kAmx)};

// Streaming stores pay where an op's data cannot stay in the last-level cache; below that,
// ordinary stores leave the output there for the op that reads it next. A quarter of the
// cache: the op shares it with what the program keeps around. Measured on a Sapphire Rapids
// VM (480 MiB L3, beside eager and compiled PyTorch): bf16 [8192, 4096] dequantize (96 MiB
// moved) 8.7 ms streamed, 5.6 stored; LayerNorm forward (128 MiB) faster streamed. 16 MiB at
// least (caches that report less, or nothing).
constexpr size_t kMinStreamingOpBytes = size_t(16) << 20;
std::atomic<size_t> g_streaming_store_min_bytes{std::max(kMinStreamingOpBytes, last_level_cache_bytes() / 4)};

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable: return "portable";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAmx: return "amx";
  }
  return "unknown";
}

CpuIsa detected_cpu_isa() {
  static const CpuIsa detected = probe();
  return detected;
}

bool cpu_has_avx512_bf16() {
  static const bool present = probe_avx512_bf16();
  return present;
}

bool cpu_has_avx512_vbmi() {
  static const bool present = probe_avx512_vbmi();
  return present;
}

CpuIsa active_cpu_isa() {
  const int cap = g_cap.load(std::memory_order_relaxed);
  const int detected = int(detected_cpu_isa());
  return CpuIsa(cap < detected ? cap : detected);
}

CpuIsa limit_cpu_isa(CpuIsa cap) { return CpuIsa(g_cap.exchange(int(cap))); }

size_t last_level_cache_bytes() {
  static const size_t bytes = [] {
    long largest = 0;
#if defined(_SC_LEVEL3_CACHE_SIZE)
    for (int level : {_SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL4_CACHE_SIZE}) {
      largest = std::max(largest, sysconf(level));
    }
#endif
    return size_t(largest);
  }();
  return bytes;
}

size_t streaming_store_min_bytes() { return g_streaming_store_min_bytes.load(std::memory_order_relaxed); }

size_t set_streaming_store_min_bytes(size_t bytes) { return g_streaming_store_min_bytes.exchange(bytes); }

}  // namespace te_kernels
