// The caller-owned scratch buffer the kernels' workspace arguments take, for the C++ tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace te_kernels::test {

// A 64-byte aligned scratch buffer of `bytes` bytes.
struct Workspace {
  std::vector<char> storage;
  void* data = nullptr;
  explicit Workspace(size_t bytes) : storage(bytes + 64) {
    data = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t(63));
  }
};

}  // namespace te_kernels::test
