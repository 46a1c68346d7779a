// cuwarden daemon: survive SIGBUS/SIGSEGV while touching another process's shared memory.
//
// A ring's owner can truncate the file under our mapping (SIGBUS on the next access) or,
// through a header field re-read by common code, steer a read out of bounds. Every access
// to ring memory runs inside guarded(): a fault there unwinds to guarded(), which returns
// false, and the caller drops the ring. Faults anywhere else keep their default action.
//
// Inside the guarded function: touch ring memory and write into storage prepared beforehand;
// no allocation, no locks (a fault would leave them held).
#pragma once

namespace cuw::daemon {

/// Install the SIGBUS/SIGSEGV handlers. Call once, before any ring is mapped.
void install_fault_guard();

/// Run fn(arg). Returns false if a SIGBUS or SIGSEGV interrupted it.
bool guarded(void (*fn)(void*), void* arg) noexcept;

/// Convenience for lambdas: guarded_call([&]{ ... }).
template <class F>
bool guarded_call(F& f) noexcept {
  return guarded([](void* p) { (*static_cast<F*>(p))(); }, &f);
}

}  // namespace cuw::daemon
