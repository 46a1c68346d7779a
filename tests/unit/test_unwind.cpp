// Unit tests: the call sites' stack walk (interposer/src/core/callsites/unwind.hpp) returns exactly the
// return addresses glibc's backtrace() returns, through code without frame pointers, with
// them, alloca'ed frames, a shared library's PLT, libc, another thread; and falls back
// (kFallback, never a wrong stack or a fault) where its rules do not reach: a CFA given by an
// expression, a signal frame, a signal's alternate stack, code outside every object (a JIT's),
// a frame whose CFA leaves the stack; and ends at a return address that cannot be read
// (backtrace() would fault there). A fork's child whose parent had a thread inside the table's
// lock still inserts and empties.
#include <catch2/catch.hpp>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/callsites/unwind.hpp"
#include "unwind_chains.hpp"
#include "unwind_check.hpp"

namespace unwind = cuw::core::unwind;

// The walk's lookups of a thread's stack, counted on each thread, and failed there on demand:
// this program links with --wrap=pthread_getattr_np, which sends the calls of its own objects
// (unwind.cpp's among them) here and leaves those of the sanitizers' runtimes, which look a new
// thread's stack up before it runs, to libc.
namespace {
thread_local int t_getattr_calls = 0;
thread_local int t_getattr_fail = 0;
}  // namespace
extern "C" int __real_pthread_getattr_np(pthread_t thread, pthread_attr_t* attr);
extern "C" int __wrap_pthread_getattr_np(pthread_t thread, pthread_attr_t* attr) {
  ++t_getattr_calls;
  if (t_getattr_fail > 0) {
    --t_getattr_fail;
    return ENOMEM;
  }
  return __real_pthread_getattr_np(thread, attr);
}

namespace {
/// What the tracker's atfork child handler does.
void register_fork_handler() {
  static const int registered = pthread_atfork(nullptr, nullptr, &unwind::after_fork_child);
  REQUIRE(registered == 0);
}
}  // namespace

// An assembler frame whose CFA rule is DW_CFA_def_cfa_expression (DW_OP_breg6 16: RBP + 16),
// as PLT entries and realigned frames have: the walk must refuse it.
__asm__(R"(
  .text
  .globl cuwt_expr_frame
  .type cuwt_expr_frame, @function
cuwt_expr_frame:
  .cfi_startproc
  pushq %rbp
  .cfi_def_cfa_offset 16
  .cfi_offset %rbp, -16
  movq %rsp, %rbp
  .cfi_escape 0x0f, 0x02, 0x76, 0x10
  movq %rdi, %rax
  movq %rsi, %rdi
  call *%rax
  popq %rbp
  .cfi_def_cfa %rsp, 8
  ret
  .cfi_endproc
  .size cuwt_expr_frame, .-cuwt_expr_frame

# Frames whose CFI lies, as a stale rule would: the CFA 1 GiB above RSP (past any stack's top),
# the CFA at RSP (the stack would not go up), a return address slot holding cuwt_lie_ra_value
# (an address the test unmapped).
  .globl cuwt_lie_high
  .type cuwt_lie_high, @function
cuwt_lie_high:
  .cfi_startproc
  subq $8, %rsp
  .cfi_def_cfa_offset 0x40000000
  movq %rdi, %rax
  movq %rsi, %rdi
  call *%rax
  addq $8, %rsp
  .cfi_def_cfa_offset 8
  ret
  .cfi_endproc
  .size cuwt_lie_high, .-cuwt_lie_high

  .globl cuwt_lie_flat
  .type cuwt_lie_flat, @function
cuwt_lie_flat:
  .cfi_startproc
  subq $8, %rsp
  .cfi_def_cfa_offset 0
  movq %rdi, %rax
  movq %rsi, %rdi
  call *%rax
  addq $8, %rsp
  .cfi_def_cfa_offset 8
  ret
  .cfi_endproc
  .size cuwt_lie_flat, .-cuwt_lie_flat

  .globl cuwt_lie_ra
  .type cuwt_lie_ra, @function
cuwt_lie_ra:
  .cfi_startproc
  pushq cuwt_lie_ra_value(%rip)
  .cfi_def_cfa_offset 16
  .cfi_offset %rip, -16
  movq %rdi, %rax
  movq %rsi, %rdi
  call *%rax
  addq $8, %rsp
  .cfi_def_cfa_offset 8
  .cfi_offset %rip, -8
  ret
  .cfi_endproc
  .size cuwt_lie_ra, .-cuwt_lie_ra

# A frame without CFI (no FDE covers it): backtrace() ends at its return address, and so does
# the walk.
  .globl cuwt_no_cfi
  .type cuwt_no_cfi, @function
cuwt_no_cfi:
  subq $8, %rsp
  movq %rdi, %rax
  movq %rsi, %rdi
  call *%rax
  addq $8, %rsp
  ret
  .size cuwt_no_cfi, .-cuwt_no_cfi
)");

extern "C" {
int cuwt_lie_high(int (*cb)(void*), void* arg);
int cuwt_lie_flat(int (*cb)(void*), void* arg);
int cuwt_lie_ra(int (*cb)(void*), void* arg);
uintptr_t cuwt_lie_ra_value = 0;
int cuwt_no_cfi(int (*cb)(void*), void* arg);
}

TEST_CASE("unwind: equal to backtrace() through code without frame pointers, to _start", "[unwind]") {
  const uint64_t ended = unwind::stats().ended_early;
  Capture c[2];
  both([](Job* j) { chain_nofp(j); }, c);
  require_same(c);
  REQUIRE(c[0].n < Capture::kMax);  // the whole stack: both end at the same outermost frame
  REQUIRE(unwind::stats().ended_early == ended);  // that frame's return address is undefined
}

TEST_CASE("unwind: at code without an FDE it ends where backtrace() does, and counts it", "[unwind]") {
  const uint64_t ended = unwind::stats().ended_early;
  Capture c[2];
  both([](Job* j) { cuwt_no_cfi([](void* a) { return chain_nofp(static_cast<Job*>(a)); }, j); }, c);
  require_same(c);
  REQUIRE(reinterpret_cast<uintptr_t>(c[0].frames[c[0].n - 1]) - reinterpret_cast<uintptr_t>(&cuwt_no_cfi) < 32);
  REQUIRE(unwind::stats().ended_early == ended + 1);
}

TEST_CASE("unwind: equal to backtrace() through code with frame pointers", "[unwind]") {
  Capture c[2];
  both([](Job* j) { chain_fp(j); }, c);
  require_same(c);
}

TEST_CASE("unwind: equal to backtrace() through alloca'ed frames (CFA from RBP)", "[unwind]") {
  for (int bytes : {16, 1000, 40000}) {
    Capture c[2];
    both([bytes](Job* j) { chain_alloca(j, bytes); }, c);
    require_same(c);
  }
}

TEST_CASE("unwind: equal to backtrace() through a shared library's PLT", "[unwind]") {
  Capture c[2];
  both([](Job* j) { cuwt_lib_outer([](void* a) { return chain_nofp(static_cast<Job*>(a)); }, j); }, c);
  require_same(c);
  Dl_info info{};
  bool through_lib = false;
  for (int i = 0; i < c[0].n; ++i)
    through_lib |= dladdr(c[0].frames[i], &info) && info.dli_sname &&
                   std::strcmp(info.dli_sname, "cuwt_lib_outer") == 0;
  REQUIRE(through_lib);
}

namespace {
Job* g_sort_job = nullptr;
int compare_and_take(const void* a, const void* b) {
  if (g_sort_job) {
    take(g_sort_job);
    g_sort_job = nullptr;
  }
  return *static_cast<const int*>(a) - *static_cast<const int*>(b);
}
}  // namespace

TEST_CASE("unwind: equal to backtrace() from a callback inside libc (qsort)", "[unwind]") {
  Capture c[2];
  both(
      [](Job* j) {
        int v[32];
        for (int i = 0; i < 32; ++i) v[i] = (i * 7919) % 32;
        g_sort_job = j;
        qsort(v, 32, sizeof v[0], compare_and_take);
      },
      c);
  require_same(c);
  bool through_libc = false;
  for (int i = 0; i < c[0].n; ++i) {
    Dl_info info{};
    through_libc |= dladdr(c[0].frames[i], &info) && info.dli_fname && std::strstr(info.dli_fname, "libc.so");
  }
  REQUIRE(through_libc);
}

TEST_CASE("unwind: equal to backtrace() on another thread, to the thread's start", "[unwind]") {
  Capture c[2];
  const uint64_t ended = unwind::stats().ended_early;
  std::thread t([&c] { both([](Job* j) { chain_nofp(j); }, c); });
  t.join();
  require_same(c);
  REQUIRE(c[0].n < Capture::kMax);
  REQUIRE(unwind::stats().ended_early == ended);
}

TEST_CASE("unwind: a return address seen before is not looked up again", "[unwind]") {
  std::vector<Capture> c(2 * 100);
  std::vector<uint64_t> cold(100);
  for (int i = 0; i < 100; ++i) {  // one call instruction: the same frames every time
    both([](Job* j) { chain_nofp(j); }, &c[2 * i]);
    cold[i] = unwind::stats().cold;
  }
  REQUIRE(cold[0] > 0);
  REQUIRE(cold[99] == cold[0]);
  require_same(&c[2 * 99]);
}

TEST_CASE("unwind: a CFA given by an expression falls back, and backtrace() gives the frames", "[unwind]") {
  const uint64_t before = unwind::stats().fallback_rule;
  Capture c[2];
  both([](Job* j) { cuwt_expr_frame([](void* a) { return chain_nofp(static_cast<Job*>(a)); }, j); }, c);
  REQUIRE(c[0].n == unwind::kFallback);
  REQUIRE(unwind::stats().fallback_rule == before + 1);
  // What the caller gets then: backtrace()'s frames (one more on top: walk_or_backtrace's own).
  Capture d[2];
  static volatile int rounds = 2;
  for (int i = 0; i < rounds; ++i) {
    Job job{i == 0 ? &walk_or_backtrace : &backtrace, &d[i]};
    cuwt_expr_frame([](void* a) { return chain_nofp(static_cast<Job*>(a)); }, &job);
  }
  std::vector<void*> fast = reference(d[0]);
  REQUIRE(!fast.empty());
  fast.erase(fast.begin());
  REQUIRE(fast == reference(d[1]));
}

TEST_CASE("unwind: a frame whose CFA leaves the stack falls back, without a fault", "[unwind]") {
  using Frame = int (*)(int (*)(void*), void*);
  // backtrace() is not asked here: these frames' CFI itself lies, and libgcc would follow it.
  for (Frame frame : {&cuwt_lie_high, &cuwt_lie_flat}) {
    const uint64_t before = unwind::stats().fallback_frame;
    Capture c;
    Job job{&unwind::walk, &c};
    frame([](void* a) { return chain_nofp(static_cast<Job*>(a)); }, &job);
    REQUIRE(c.n == unwind::kFallback);
    REQUIRE(unwind::stats().fallback_frame == before + 1);
  }
}

namespace {
/// `n` pages of address space, PROT_NONE; those not unmapped before are given back at the end.
struct Pages {
  static constexpr int kMax = 4;
  const long size = sysconf(_SC_PAGESIZE);
  const int n;
  char* const at;
  bool mapped[kMax] = {};
  explicit Pages(int count)
      : n(count), at(static_cast<char*>(mmap(nullptr, count * size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))) {
    REQUIRE(count <= kMax);
    REQUIRE(at != MAP_FAILED);
    for (int i = 0; i < n; ++i) mapped[i] = true;
  }
  ~Pages() {
    for (int i = 0; i < n; ++i)
      if (mapped[i]) munmap(page(i), size);
  }
  /// Leaves a hole at page i, which any later mmap may fill (the allocator's, a sanitizer's).
  void unmap(int i) {
    REQUIRE(munmap(page(i), size) == 0);
    mapped[i] = false;
  }
  char* page(int i) const { return at + i * size; }
};
}  // namespace

TEST_CASE("unwind: a return address that cannot be read ends the walk there, unmapped or PROT_NONE",
          "[unwind]") {
  // PROT_NONE: mapped, as CUDA reserves address ranges, where libgcc's read of the return
  // address's code would fault as where nothing is mapped.
  Pages reserved(1);
  static volatile int rounds = 2;
  for (const bool unmapped : {true, false}) {
    for (int i = 0; i < rounds; ++i) {  // twice from one call: an address with nothing there is not kept
      // Unmapped: the middle page of three just mapped, unmapped right before the walk, which
      // allocates nothing (a hole left longer may be mapped again).
      Pages pages(3);
      pages.unmap(1);
      char* const bad = (unmapped ? pages.page(1) : reserved.page(0)) + 0x560;
      cuwt_lie_ra_value = reinterpret_cast<uintptr_t>(bad);
      const unwind::Stats before = unwind::stats();
      Capture c;
      Job job{&unwind::walk, &c};
      cuwt_lie_ra([](void* a) { return chain_nofp(static_cast<Job*>(a)); }, &job);
      const unwind::Stats after = unwind::stats();
      INFO("walk (" << c.n << "):\n" << describe(frames_of(c)));
      REQUIRE(c.n >= 6);  // take, the chain's four frames, the lying one
      REQUIRE(c.frames[c.n - 1] == static_cast<void*>(bad));
      REQUIRE(reinterpret_cast<uintptr_t>(c.frames[c.n - 2]) - reinterpret_cast<uintptr_t>(&cuwt_lie_ra) < 32);
      REQUIRE(after.ended_early == before.ended_early + 1);
      REQUIRE(after.cold > before.cold);
    }
  }
}

TEST_CASE("unwind: a return address into code outside every object (a JIT's) falls back, near an unmapped page too",
          "[unwind]") {
  // A trampoline in an anonymous executable page, its return address 12 bytes before the end
  // of the page and the next page unmapped: libgcc reads 9 bytes there, which it can.
  //   sub $8,%rsp; mov %rdi,%rax; mov %rsi,%rdi; call *%rax; add $8,%rsp; ret
  static const unsigned char code[] = {0x48, 0x83, 0xec, 0x08, 0x48, 0x89, 0xf8, 0x48, 0x89, 0xf7,
                                       0xff, 0xd0, 0x48, 0x83, 0xc4, 0x08, 0xc3};
  Pages pages(2);
  pages.unmap(1);
  REQUIRE(mprotect(pages.page(0), pages.size, PROT_READ | PROT_WRITE) == 0);
  char* const entry = pages.page(1) - 24;
  std::memcpy(entry, code, sizeof code);
  REQUIRE(mprotect(pages.page(0), pages.size, PROT_READ | PROT_EXEC) == 0);
  using Jit = int (*)(int (*)(void*), void*);
  const auto jit = reinterpret_cast<Jit>(entry);
  const uint64_t before = unwind::stats().fallback_code;
  Capture c[2];
  for (int i = 0; i < 2; ++i) {
    Job job{i == 0 ? &unwind::walk : &walk_or_backtrace, &c[i]};
    jit([](void* a) { return chain_nofp(static_cast<Job*>(a)); }, &job);
  }
  REQUIRE(c[0].n == unwind::kFallback);
  REQUIRE(unwind::stats().fallback_code == before + 2);
  // backtrace() reaches the trampoline's return address and, finding no FDE, ends there.
  const std::vector<void*> slow = reference(c[1]);
  INFO("backtrace:\n" << describe(slow));
  REQUIRE(!slow.empty());
  REQUIRE(slow.back() == static_cast<void*>(entry + 12));
}

namespace {
Capture g_sig[2];
void take_in_handler(int) { both([](Job* j) { chain_nofp(j); }, g_sig); }
/// A thread's first walk looks its stack up (pthread_getattr_np, which allocates), and the
/// first backtrace() loads libgcc_s: not in a signal handler (neither is async-signal-safe;
/// the test is what the walk does in one afterwards).
void first_walk_outside_handlers() {
  void* frames[4];
  (void)unwind::walk(frames, 4);
  (void)backtrace(frames, 4);
}
}  // namespace

TEST_CASE("unwind: in a signal handler it falls back (the signal frame's rule is not kept)", "[unwind]") {
  struct sigaction sa{}, old{};
  sa.sa_handler = take_in_handler;
  sigemptyset(&sa.sa_mask);
  REQUIRE(sigaction(SIGUSR1, &sa, &old) == 0);
  first_walk_outside_handlers();
  const uint64_t before = unwind::stats().fallback_rule;
  raise(SIGUSR1);
  sigaction(SIGUSR1, &old, nullptr);
  REQUIRE(g_sig[0].n == unwind::kFallback);
  REQUIRE(unwind::stats().fallback_rule == before + 1);
  REQUIRE(g_sig[1].n > 4);
}

TEST_CASE("unwind: on a signal's alternate stack it falls back (not the thread's stack)", "[unwind]") {
  std::vector<char> alt(1 << 16);
  stack_t ss{}, old_ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  REQUIRE(sigaltstack(&ss, &old_ss) == 0);
  struct sigaction sa{}, old{};
  sa.sa_handler = take_in_handler;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  REQUIRE(sigaction(SIGUSR1, &sa, &old) == 0);
  first_walk_outside_handlers();
  const uint64_t before = unwind::stats().fallback_stack;
  raise(SIGUSR1);
  sigaction(SIGUSR1, &old, nullptr);
  ss.ss_flags = SS_DISABLE;
  sigaltstack(&ss, nullptr);
  REQUIRE(g_sig[0].n == unwind::kFallback);
  REQUIRE(unwind::stats().fallback_stack == before + 1);
}

TEST_CASE("unwind: a fork's child inserts and empties though a thread held the table's lock at the fork",
          "[unwind]") {
  register_fork_handler();
  first_walk_outside_handlers();  // libgcc_s loaded before the fork, not in each child
  // forget() in a loop holds the lock most of the time: most forks below catch it held.
  std::atomic<bool> done{false};
  std::thread eraser([&done] {
    while (!done.load(std::memory_order_relaxed)) unwind::forget();
  });
  int failed = 0;
  for (int i = 0; i < 20; ++i) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      alarm(20);  // a child that waits on its parent's thread is killed, and counted below
      std::vector<Capture> c(4);
      uint64_t cold[2];
      static volatile int rounds = 2;  // read at run time: not unrolled, one call instruction
      for (int k = 0; k < rounds; ++k) {  // the second walk's frames are all in the table
        both([](Job* j) { chain_nofp(j); }, &c[2 * k]);
        cold[k] = unwind::stats().cold;
      }
      const bool inserted = cold[1] == cold[0];
      const bool same = c[2].n != unwind::kFallback && frames_of(c[2]) == reference(c[3]);
      unwind::forget();
      _exit(inserted && same ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  done.store(true);
  eraser.join();
  REQUIRE(failed == 0);
}

TEST_CASE("unwind: the main thread's stack is found without pthread_getattr_np (no /proc, no allocation)",
          "[unwind]") {
  REQUIRE(syscall(SYS_gettid) == getpid());
  const int before = t_getattr_calls;
  Capture c[2];
  both([](Job* j) { chain_nofp(j); }, c);  // the first walk on this thread
  REQUIRE(t_getattr_calls == before);
  require_same(c);
  REQUIRE(c[0].n < Capture::kMax);  // to _start: the bounds hold every frame
}

TEST_CASE("unwind: prepare() finds the calling thread's stack, and its walks then look nothing up", "[unwind]") {
  Capture c[2];
  int in_prepare = 0, in_walk = 0;
  std::thread t([&] {
    const int start = t_getattr_calls;
    unwind::prepare();
    in_prepare = t_getattr_calls - start;
    both([](Job* j) { chain_nofp(j); }, c);
    in_walk = t_getattr_calls - start - in_prepare;
  });
  t.join();
  REQUIRE(in_prepare == 1);
  REQUIRE(in_walk == 0);
  require_same(c);
}

TEST_CASE("unwind: a thread whose stack is not found falls back, and the lookup is tried again 1,024 walks later",
          "[unwind]") {
  int walks = 0, calls = 0;
  uint64_t counted = 0;
  Capture c;
  std::thread t([&] {
    const uint64_t before = unwind::stats().fallback_bounds;
    const int start = t_getattr_calls;
    t_getattr_fail = 1;
    do {
      c.n = unwind::walk(c.frames, Capture::kMax);
      ++walks;
    } while (c.n == unwind::kFallback && walks < 5000);
    calls = t_getattr_calls - start;
    counted = unwind::stats().fallback_bounds - before;
  });
  t.join();
  REQUIRE(c.n > 0);
  REQUIRE(walks == 1025);  // the first fails; 1,023 fall back without a lookup; then it succeeds
  REQUIRE(calls == 2);
  REQUIRE(counted == 1024);
}

TEST_CASE("unwind: a fork's child of a thread other than the main one walks its stack", "[unwind]") {
  register_fork_handler();
  first_walk_outside_handlers();
  int status = -1;
  std::thread t([&status] {  // no walk on this thread before the fork
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(20);
      Capture c[2];
      both([](Job* j) { chain_nofp(j); }, c);
      _exit(c[0].n != unwind::kFallback && frames_of(c[0]) == reference(c[1]) ? 0 : 1);
    }
    if (pid > 0) waitpid(pid, &status, 0);
  });
  t.join();
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

TEST_CASE("unwind: many threads walk at once while the table is emptied", "[unwind]") {
  constexpr int kThreads = 6, kWalks = 2000;
  std::atomic<int> mismatches{0}, fallbacks{0};
  std::atomic<bool> done{false};
  std::thread eraser([&done] {
    while (!done.load()) {
      unwind::forget();
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&] {
      std::vector<Capture> c(2 * kWalks);
      for (int i = 0; i < kWalks; ++i) both([](Job* j) { chain_fp(j); }, &c[2 * i]);  // one call instruction
      const std::vector<void*> first = frames_of(c[0]);
      if (first != reference(c[1])) mismatches.fetch_add(1);
      for (int i = 0; i < kWalks; ++i) {
        if (c[2 * i].n == unwind::kFallback) fallbacks.fetch_add(1);
        else if (frames_of(c[2 * i]) != first) mismatches.fetch_add(1);
      }
    });
  for (auto& t : ts) t.join();
  done.store(true);
  eraser.join();
  REQUIRE(mismatches.load() == 0);
  REQUIRE(fallbacks.load() == 0);
}

TEST_CASE("unwind: unloading a library empties the table", "[unwind]") {
  // The next return address not in the table after the unload sees the loader's unload count
  // move, and every frame after it is looked up again, those seen before (Catch2's, main's) too.
  int frames = 0;
  const unwind::Stats before = walk_across_an_unload(&frames);
  const unwind::Stats after = unwind::stats();
  REQUIRE(after.invalidations == before.invalidations + 1);
  REQUIRE(after.cold - before.cold >= static_cast<uint64_t>(frames - 1));
}
