// cuwarden daemon: SIGBUS/SIGSEGV guard for ring accesses (see fault_guard.hpp).
#include "model/fault_guard.hpp"

#include <csetjmp>
#include <csignal>

namespace cuw::daemon {

namespace {

thread_local sigjmp_buf* t_jump = nullptr;

void on_fault(int sig, siginfo_t*, void*) {
  if (sigjmp_buf* j = t_jump) {
    t_jump = nullptr;
    siglongjmp(*j, 1);
  }
  // Not ours: restore the default action; returning re-executes the access and dies there
  // with the usual core dump.
  struct sigaction sa{};
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, nullptr);
}

}  // namespace

void install_fault_guard() {
  struct sigaction sa{};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);
  sigaction(SIGSEGV, &sa, nullptr);
}

bool guarded(void (*fn)(void*), void* arg) noexcept {
  sigjmp_buf jump;
  sigjmp_buf* const previous = t_jump;
  // No signal mask saved (0): the handler runs with SA_NODEFER and an empty sa_mask, so a
  // fault leaves the mask as it was, and saving it costs a system call per guarded access
  // (every ring at every drain tick).
  if (sigsetjmp(jump, 0) != 0) {
    t_jump = previous;
    return false;
  }
  t_jump = &jump;
  fn(arg);
  t_jump = previous;
  return true;
}

}  // namespace cuw::daemon
