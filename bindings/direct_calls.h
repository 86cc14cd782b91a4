// Direct calls of the hottest ops from Python: the same dispatcher call as torch.ops makes
// (every device's kernel, the C++ autograd kernels, Python dispatch modes), without its generic
// boxing of the arguments against the schema, which costs about 5 us a call: on the small inputs
// of decoding more than the kernel. custom_ops/norm.py, activation.py and rope.py take them only
// where torch.ops would add nothing (not while torch.compile traces, no __torch_function__
// override).
//
// A family's binding file adds its own with a DirectCall at namespace scope; at import, the
// extension module (build_info.cpp) defines every one of them in its `direct` submodule.
#pragma once

#include <torch/python.h>

namespace portable_te {

class DirectCall {
 public:
  using Define = void (*)(pybind11::module_& direct);
  // Runs at static initialisation, before the extension module is imported.
  explicit DirectCall(Define define);
};

// Every DirectCall's definitions, into `direct` (build_info.cpp's module).
void define_direct_calls(pybind11::module_& direct);

}  // namespace portable_te
