// The kernels never own threads. Whoever calls them (the PyTorch binding, a C++ test)
// hands in a ThreadPool, so that CPU kernels share PyTorch's intra-op pool and its
// set_num_threads() setting instead of oversubscribing the cores with a second pool.
#pragma once

#include <cstdint>
#include <functional>

namespace te_kernels {

class ThreadPool {
 public:
  virtual ~ThreadPool() = default;
  // Upper bound on how many ranges parallel_for may run at once.
  virtual int num_threads() const = 0;
  // Calls body(begin, end) on disjoint sub-ranges covering [0, n); each sub-range holds at
  // least `grain` items unless it is the last one. Blocks until all bodies returned.
  virtual void parallel_for(int64_t n, int64_t grain,
                            const std::function<void(int64_t, int64_t)>& body) const = 0;
};

// Runs everything on the calling thread; for tests and tiny problems.
class SerialThreadPool final : public ThreadPool {
 public:
  int num_threads() const override { return 1; }
  void parallel_for(int64_t n, int64_t /*grain*/,
                    const std::function<void(int64_t, int64_t)>& body) const override {
    if (n > 0) body(0, n);
  }
};

}  // namespace te_kernels
