// cuwarden interposer base: call_ref, a non-owning reference to a callable.
#pragma once

#include <type_traits>
#include <utility>

namespace cuw {

template <class Signature>
class call_ref;

/// A reference to a callable R(Args...), for a call that runs it before returning: nothing is
/// copied or allocated (std::function may allocate, and a hook must not throw std::bad_alloc
/// into its caller). The callable must outlive the reference; a temporary passed straight to
/// a call lives until the call returns. Calling it costs one indirect call.
template <class R, class... Args>
class call_ref<R(Args...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::remove_cvref_t<F>, call_ref>>>
  call_ref(F&& f) noexcept  // implicit, as std::function's: a parameter type
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

}  // namespace cuw
