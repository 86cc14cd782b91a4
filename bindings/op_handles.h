// Typed handles of the library's own ops, for C++ code that calls them through the dispatcher
// (autograd kernels, the direct calls), so that every device's kernel and autograd apply.
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>

#include <utility>

namespace portable_te {

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// A backward op's call from an autograd node's backward. Under create_graph (grad mode on in
// backward) it goes through autograd, whose formula for the backward ops raises when
// differentiated (custom_ops: no double backward); otherwise straight to the device kernel.
template <typename Signature, typename... Args>
auto call_backward_op(const c10::TypedOperatorHandle<Signature>& op, Args&&... args) {
  if (at::GradMode::is_enabled()) {
    return op.call(std::forward<Args>(args)...);
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(std::forward<Args>(args)...);
}

}  // namespace portable_te
