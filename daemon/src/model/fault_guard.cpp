// cuwarden daemon: SIGBUS/SIGSEGV guard for ring accesses (see fault_guard.hpp).
#include "model/fault_guard.hpp"

#include <pthread.h>

#include <csetjmp>
#include <csignal>

namespace cuw::daemon {

namespace {

thread_local sigjmp_buf* t_jump = nullptr;
thread_local sigset_t t_mask;  ///< the thread's signal mask, read at its first guarded()
thread_local bool t_mask_read = false;

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
  // The mask is not saved at each call (sigsetjmp's 1 costs a system call per guarded
  // access: every ring at every drain tick) but read once per thread, and put back only
  // after a fault: the handler runs with SA_NODEFER and an empty sa_mask, but a runtime
  // that wraps handlers (TSan does) may block signals while it runs, and a SIGBUS left
  // blocked would kill the daemon at the next fault.
  if (!t_mask_read) {
    pthread_sigmask(SIG_SETMASK, nullptr, &t_mask);
    t_mask_read = true;
  }
  if (sigsetjmp(jump, 0) != 0) {
    pthread_sigmask(SIG_SETMASK, &t_mask, nullptr);
    t_jump = previous;
    return false;
  }
  t_jump = &jump;
  fn(arg);
  t_jump = previous;
  return true;
}

}  // namespace cuw::daemon
