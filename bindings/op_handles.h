// Typed handles of the library's own ops, for C++ code that calls them through the dispatcher
// (autograd kernels, the direct calls), so that every device's kernel and autograd apply.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace portable_te {

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

}  // namespace portable_te
