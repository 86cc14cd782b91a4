// A ThreadPool that really runs two threads: the kernels' task splits and per-task
// partials are exercised the way a multi-core pool would.
#pragma once

#include <functional>
#include <thread>

#include "te_kernels/parallel.h"

namespace te_kernels::test {

class TwoThreads final : public ThreadPool {
 public:
  int num_threads() const override { return 2; }
  void parallel_for(int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& body) const override {
    std::thread other([&] { body(n / 2, n); });
    if (n / 2 > 0) body(0, n / 2);
    other.join();
  }
};

}  // namespace te_kernels::test
