// te_kernels::ThreadPool over PyTorch's intra-op pool: kernels obey torch.set_num_threads()
// and never start threads of their own.
#pragma once

#include <ATen/Parallel.h>

#include "te_kernels/parallel.h"

namespace portable_te {

class AtenThreadPool final : public te_kernels::ThreadPool {
 public:
  int num_threads() const override { return at::get_num_threads(); }
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& body) const override {
    at::parallel_for(0, n, grain, body);
  }
};

}  // namespace portable_te
