// fakecuda: the checkpoint API across processes and the shared device (CUWARDEN_FAKE_DIR).
//
// This process is the controller, as cuwarden's daemon will be: it calls cuInit, resolves the
// cuCheckpointProcess* entry points through cuGetProcAddress (as on driver 580) and watches the
// device through the simulated NVML. The processes it checkpoints are ckpt_victim programs it
// starts and drives through their stdin/stdout. Every test case runs in a process of its own
// (ctest), whose main() gives it a fresh directory: a device of 256 MiB shared by its processes.
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "fakecuda.h"
#include "fakenvml.h"

extern char** environ;

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kCapacity = 256 * kMiB;  // CUWARDEN_FAKE_MEMORY, set by main()

// Waits up to 30 s for `done` (a loaded machine may be slow; a broken driver never gets there).
bool eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A ckpt_victim process, spoken to line by line. `args`: ckpt_victim's own (a one-shot
// command); `as`: a user to run it as (through setpriv), or nullptr.
class Victim {
 public:
  explicit Victim(const std::vector<std::string>& args = {}, const passwd* as = nullptr) {
    int to[2], from[2];
    REQUIRE(pipe2(to, O_CLOEXEC) == 0);
    REQUIRE(pipe2(from, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from[1], 1);
    std::vector<std::string> words;
    if (as)
      words = {"/usr/bin/setpriv", "--reuid=" + std::to_string(as->pw_uid), "--regid=" + std::to_string(as->pw_gid),
               "--clear-groups"};
    words.push_back(FAKECUDA_VICTIM);
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    REQUIRE(posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    close(to[0]);
    close(from[1]);
    in_ = fdopen(to[1], "w");
    out_ = fdopen(from[0], "r");
    if (args.empty()) REQUIRE(line() == "ready " + std::to_string(pid_));
  }
  ~Victim() {
    if (pid_ > 0) stop();
    if (in_) std::fclose(in_);
    if (out_) std::fclose(out_);
  }
  Victim(const Victim&) = delete;
  Victim& operator=(const Victim&) = delete;

  int pid() const { return pid_; }
  void send(const std::string& cmd) {
    std::fprintf(in_, "%s\n", cmd.c_str());
    std::fflush(in_);
  }
  std::string line() {
    char buf[256];
    if (!std::fgets(buf, sizeof buf, out_)) return "<eof>";
    std::string s = buf;
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  std::string ask(const std::string& cmd) {
    send(cmd);
    return line();
  }
  void stop() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

// The checkpoint entry points as the daemon finds them: cuGetProcAddress, CUDA 12.8's ABI.
struct Api {
  CUresult (*lock)(int, CUcheckpointLockArgs*) = nullptr;
  CUresult (*checkpoint)(int, CUcheckpointCheckpointArgs*) = nullptr;
  CUresult (*restore)(int, CUcheckpointRestoreArgs*) = nullptr;
  CUresult (*unlock)(int, CUcheckpointUnlockArgs*) = nullptr;
  CUresult (*get_state)(int, CUprocessState*) = nullptr;
  CUresult (*restore_tid)(int, int*) = nullptr;

  Api() {
    REQUIRE(cuInit(0) == CUDA_SUCCESS);  // a restore needs it (persistence mode is off)
    resolve("cuCheckpointProcessLock", &lock);
    resolve("cuCheckpointProcessCheckpoint", &checkpoint);
    resolve("cuCheckpointProcessRestore", &restore);
    resolve("cuCheckpointProcessUnlock", &unlock);
    resolve("cuCheckpointProcessGetState", &get_state);
    resolve("cuCheckpointProcessGetRestoreThreadId", &restore_tid);
  }
  template <typename F>
  void resolve(const char* name, F* out) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult status{};
    REQUIRE(cuGetProcAddress_v2(name, &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS);
    REQUIRE(status == CU_GET_PROC_ADDRESS_SUCCESS);
    REQUIRE(p != nullptr);
    *out = reinterpret_cast<F>(p);
  }
  CUresult lock_with(int pid, unsigned timeout_ms) {
    CUcheckpointLockArgs args{};
    args.timeoutMs = timeout_ms;
    return lock(pid, &args);
  }
  int state(int pid) {
    CUprocessState s = CU_PROCESS_STATE_FAILED;
    REQUIRE(get_state(pid, &s) == CUDA_SUCCESS);
    return s;
  }
};

// The simulated NVML, as the daemon reads it: device 0's used bytes and one process's bytes.
struct Nvml {
  nvmlDevice_t dev = nullptr;
  Nvml() {
    REQUIRE(nvmlInit_v2() == NVML_SUCCESS);
    REQUIRE(nvmlDeviceGetHandleByIndex_v2(0, &dev) == NVML_SUCCESS);
  }
  ~Nvml() { nvmlShutdown(); }
  nvmlMemory_t memory() {
    nvmlMemory_t m{};
    REQUIRE(nvmlDeviceGetMemoryInfo(dev, &m) == NVML_SUCCESS);
    return m;
  }
  std::vector<nvmlProcessInfo_t> processes() {
    std::vector<nvmlProcessInfo_t> list(64);
    unsigned n = static_cast<unsigned>(list.size());
    REQUIRE(nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, list.data()) == NVML_SUCCESS);
    list.resize(n);
    return list;
  }
  unsigned long long bytes_of(int pid) {
    for (const auto& p : processes())
      if (static_cast<int>(p.pid) == pid) return p.usedGpuMemory;
    return 0;
  }
};

// A user of the machine's own for cross-user tests, created when missing (root only).
const passwd* test_user(const char* name) {
  if (!getpwnam(name)) {
    const std::string cmd = std::string("useradd --system --no-create-home --shell /usr/sbin/nologin ") + name;
    REQUIRE(std::system(cmd.c_str()) == 0);
  }
  const passwd* pw = getpwnam(name);
  REQUIRE(pw != nullptr);
  return pw;
}

fakecuda_checkpoint_info info_of(int pid) {
  fakecuda_checkpoint_info info{};
  REQUIRE(fakecuda_process_checkpoint_info(pid, &info) == 0);
  return info;
}

}  // namespace

TEST_CASE("a checkpointed process's device bytes go to its host memory and come back at the same addresses") {
  Api api;
  Nvml nvml;
  Victim v;
  const std::string ptr = v.ask("alloc " + std::to_string(16 * kMiB));
  REQUIRE(ptr.rfind("ptr 0x", 0) == 0);
  REQUIRE(nvml.bytes_of(v.pid()) == 16 * kMiB);
  REQUIRE(nvml.memory().used == 16 * kMiB);
  REQUIRE(api.state(v.pid()) == CU_PROCESS_STATE_RUNNING);

  // The driver's state machine: each operation only from its state, and nothing changes.
  CHECK(api.checkpoint(v.pid(), nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(api.unlock(v.pid(), nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(api.restore(v.pid(), nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  REQUIRE(api.state(v.pid()) == CU_PROCESS_STATE_RUNNING);

  // The service thread that does the work is one of the process's threads.
  int tid = 0;
  REQUIRE(api.restore_tid(v.pid(), &tid) == CUDA_SUCCESS);
  REQUIRE(access(("/proc/" + std::to_string(v.pid()) + "/task/" + std::to_string(tid)).c_str(), F_OK) == 0);

  REQUIRE(api.lock_with(v.pid(), 10000) == CUDA_SUCCESS);
  REQUIRE(api.state(v.pid()) == CU_PROCESS_STATE_LOCKED);
  CHECK(api.lock_with(v.pid(), 10000) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(api.restore(v.pid(), nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  // Locked, its device bytes are still on the device.
  REQUIRE(nvml.bytes_of(v.pid()) == 16 * kMiB);

  REQUIRE(api.checkpoint(v.pid(), nullptr) == CUDA_SUCCESS);
  REQUIRE(api.state(v.pid()) == CU_PROCESS_STATE_CHECKPOINTED);
  CHECK(nvml.bytes_of(v.pid()) == 0);
  CHECK(nvml.memory().used == 0);
  CHECK(nvml.memory().free == kCapacity);
  CHECK(info_of(v.pid()).host_bytes == 16 * kMiB);
  // A restore asked by a process that has not called cuInit is refused, and changes nothing.
  {
    Victim uninitialized({"restore", std::to_string(v.pid())});
    CHECK(uninitialized.line() == "rc " + std::to_string(CUDA_ERROR_NOT_INITIALIZED));
  }
  REQUIRE(api.state(v.pid()) == CU_PROCESS_STATE_CHECKPOINTED);

  // Its next CUDA call waits while it is checkpointed.
  v.send("check");
  REQUIRE(v.line() == "calling");
  REQUIRE(eventually([&] { return info_of(v.pid()).blocked_calls == 1; }));
  REQUIRE(api.state(v.pid()) == CU_PROCESS_STATE_CHECKPOINTED);

  REQUIRE(api.restore(v.pid(), nullptr) == CUDA_SUCCESS);
  REQUIRE(api.state(v.pid()) == CU_PROCESS_STATE_LOCKED);
  CHECK(nvml.bytes_of(v.pid()) == 16 * kMiB);
  CHECK(info_of(v.pid()).host_bytes == 0);
  CHECK(info_of(v.pid()).blocked_calls == 1);  // restored but locked: still waiting

  REQUIRE(api.unlock(v.pid(), nullptr) == CUDA_SUCCESS);
  // The call returns with the pattern intact, at the same device address.
  REQUIRE(v.line() == "ok " + ptr.substr(4));
  REQUIRE(api.state(v.pid()) == CU_PROCESS_STATE_RUNNING);
  CHECK(info_of(v.pid()).blocked_calls == 0);
  // And the process goes on: a second round trip is as good as the first.
  REQUIRE(api.lock_with(v.pid(), 10000) == CUDA_SUCCESS);
  REQUIRE(api.checkpoint(v.pid(), nullptr) == CUDA_SUCCESS);
  REQUIRE(api.restore(v.pid(), nullptr) == CUDA_SUCCESS);
  REQUIRE(api.unlock(v.pid(), nullptr) == CUDA_SUCCESS);
  v.send("check");
  REQUIRE(v.line() == "calling");
  REQUIRE(v.line() == "ok " + ptr.substr(4));
}

TEST_CASE("memory mapped through the VMM API is carried too, with the process's other memory") {
  Api api;
  Nvml nvml;
  Victim v;
  const std::string ptr = v.ask("alloc " + std::to_string(kMiB));
  REQUIRE(ptr.rfind("ptr 0x", 0) == 0);
  const std::string vmm = v.ask("vmm");
  REQUIRE(vmm.rfind("ptr 0x", 0) == 0);
  REQUIRE(nvml.bytes_of(v.pid()) == 3 * kMiB);
  REQUIRE(api.lock_with(v.pid(), 10000) == CUDA_SUCCESS);
  REQUIRE(api.checkpoint(v.pid(), nullptr) == CUDA_SUCCESS);
  CHECK(nvml.bytes_of(v.pid()) == 0);
  CHECK(info_of(v.pid()).host_bytes == 3 * kMiB);
  REQUIRE(api.restore(v.pid(), nullptr) == CUDA_SUCCESS);
  REQUIRE(api.unlock(v.pid(), nullptr) == CUDA_SUCCESS);
  REQUIRE(v.ask("vmm_check") == "ok " + vmm.substr(4));
  v.send("check");
  REQUIRE(v.line() == "calling");
  REQUIRE(v.line() == "ok " + ptr.substr(4));
}

TEST_CASE("a lock waits for the work a process submitted and for its calls inside the driver") {
  Api api;
  Victim v;
  REQUIRE(v.ask("alloc " + std::to_string(4 * kMiB)).rfind("ptr", 0) == 0);

  SECTION("work queued on a stream is done before the checkpoint copies the memory") {
    REQUIRE(v.ask("fill 90 300") == "queued");
    REQUIRE(api.lock_with(v.pid(), 20000) == CUDA_SUCCESS);
    REQUIRE(api.checkpoint(v.pid(), nullptr) == CUDA_SUCCESS);
    REQUIRE(api.restore(v.pid(), nullptr) == CUDA_SUCCESS);
    REQUIRE(api.unlock(v.pid(), nullptr) == CUDA_SUCCESS);
    REQUIRE(v.ask("filled 90") == "filled");
  }
  SECTION("a call inside the driver is waited for: the lock completes once it returns") {
    REQUIRE(v.ask("stuck_call") == "inside");
    // While a call stays inside, a lock with a timeout gives up and changes nothing.
    REQUIRE(api.lock_with(v.pid(), 100) == CUDA_ERROR_NOT_READY);
    REQUIRE(api.state(v.pid()) == CU_PROCESS_STATE_RUNNING);
    CUresult locked = CUDA_ERROR_UNKNOWN;
    std::thread locker([&] { locked = api.lock_with(v.pid(), 0); });
    v.send("release");
    REQUIRE(v.line() == "recorded 0");
    locker.join();
    REQUIRE(locked == CUDA_SUCCESS);
    REQUIRE(api.checkpoint(v.pid(), nullptr) == CUDA_SUCCESS);
    REQUIRE(api.restore(v.pid(), nullptr) == CUDA_SUCCESS);
    REQUIRE(api.unlock(v.pid(), nullptr) == CUDA_SUCCESS);
    v.send("check");
    REQUIRE(v.line() == "calling");
    REQUIRE(v.line().rfind("ok ", 0) == 0);
  }
}

TEST_CASE("a lock past its timeout answers CUDA_ERROR_NOT_READY and leaves the process running") {
  Api api;
  Victim v;
  REQUIRE(v.ask("busy 120000") == "queued");  // a "kernel" far longer than the test
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(api.lock_with(v.pid(), 200) == CUDA_ERROR_NOT_READY);
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(200));
  REQUIRE(api.state(v.pid()) == CU_PROCESS_STATE_RUNNING);
  // Its calls go on at once: the gate is open again.
  REQUIRE(v.ask("call") == "rc 0");
  REQUIRE(v.ask("info").rfind("free ", 0) == 0);
}

TEST_CASE("what the driver cannot carry fails the checkpoint and leaves the process FAILED") {
  const std::string what = GENERATE(as<std::string>{}, "managed 1048576", "ipc", "vmm_export");
  CAPTURE(what);
  Api api;
  Victim v;
  REQUIRE(v.ask("alloc " + std::to_string(kMiB)).rfind("ptr", 0) == 0);
  REQUIRE(v.ask(what) == "rc 0");
  REQUIRE(api.lock_with(v.pid(), 10000) == CUDA_SUCCESS);
  REQUIRE(api.checkpoint(v.pid(), nullptr) == CUDA_ERROR_NOT_SUPPORTED);
  REQUIRE(api.state(v.pid()) == CU_PROCESS_STATE_FAILED);
  // No way back: the driver does not roll back, and the process's calls fail.
  CHECK(api.unlock(v.pid(), nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(api.restore(v.pid(), nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(api.lock_with(v.pid(), 100) == CUDA_ERROR_ILLEGAL_STATE);
  REQUIRE(v.ask("call") == "rc " + std::to_string(CUDA_ERROR_ILLEGAL_STATE));
}

TEST_CASE("processes naming the same device share its capacity and see each other's use") {
  Nvml nvml;
  Victim a, b;
  REQUIRE(a.ask("reserve " + std::to_string(150 * kMiB)).rfind("ptr", 0) == 0);
  // The second process finds the device full, and its cuMemGetInfo counts the first's bytes.
  REQUIRE(b.ask("reserve " + std::to_string(150 * kMiB)) == "rc " + std::to_string(CUDA_ERROR_OUT_OF_MEMORY));
  REQUIRE(b.ask("info") == "free " + std::to_string(kCapacity - 150 * kMiB) + " total " + std::to_string(kCapacity));
  REQUIRE(b.ask("reserve " + std::to_string(75 * kMiB)).rfind("ptr", 0) == 0);
  CHECK(nvml.bytes_of(a.pid()) == 150 * kMiB);
  CHECK(nvml.bytes_of(b.pid()) == 75 * kMiB);
  CHECK(nvml.processes().size() == 2);
  CHECK(nvml.memory().used == 225 * kMiB);
  CHECK(nvml.memory().free == kCapacity - 225 * kMiB);
  // A process that is gone holds nothing: its bytes come back to the others.
  a.stop();
  REQUIRE(eventually([&] { return nvml.processes().size() == 1; }));
  CHECK(nvml.memory().used == 75 * kMiB);
  REQUIRE(b.ask("reserve " + std::to_string(150 * kMiB)).rfind("ptr", 0) == 0);
}

TEST_CASE("a checkpoint frees the shared device for another process, and a restore without room leaves FAILED") {
  Api api;
  Nvml nvml;
  Victim a, b;
  REQUIRE(a.ask("reserve " + std::to_string(150 * kMiB)).rfind("ptr", 0) == 0);
  REQUIRE(b.ask("reserve " + std::to_string(150 * kMiB)) == "rc " + std::to_string(CUDA_ERROR_OUT_OF_MEMORY));
  REQUIRE(api.lock_with(a.pid(), 10000) == CUDA_SUCCESS);
  REQUIRE(api.checkpoint(a.pid(), nullptr) == CUDA_SUCCESS);
  CHECK(nvml.memory().free == kCapacity);
  // The room is the other process's now.
  REQUIRE(b.ask("reserve " + std::to_string(150 * kMiB)).rfind("ptr", 0) == 0);
  REQUIRE(api.restore(a.pid(), nullptr) == CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE(api.state(a.pid()) == CU_PROCESS_STATE_FAILED);
  CHECK(nvml.bytes_of(a.pid()) == 0);
  CHECK(nvml.memory().used == 150 * kMiB);
}

TEST_CASE("the checkpoint API answers for pids that are not CUDA processes as the driver does") {
  Api api;
  CUprocessState s;
  // A process without CUDA (the one that started this test), and no process at all.
  CHECK(api.get_state(getppid(), &s) == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(api.lock_with(getppid(), 100) == CUDA_ERROR_NOT_INITIALIZED);
  pid_t gone = 0;
  {
    char* argv[] = {const_cast<char*>("/bin/true"), nullptr};
    REQUIRE(posix_spawn(&gone, "/bin/true", nullptr, nullptr, argv, environ) == 0);
    waitpid(gone, nullptr, 0);
  }
  CHECK(api.get_state(gone, &s) == CUDA_ERROR_OPERATING_SYSTEM);
  CHECK(api.get_state(0, &s) == CUDA_ERROR_INVALID_VALUE);
  CHECK(api.get_state(getpid(), nullptr) == CUDA_ERROR_INVALID_VALUE);
  // Reserved fields must be zero.
  CUcheckpointLockArgs args{};
  args.reserved0 = 1;
  CHECK(api.lock(getpid(), &args) == CUDA_ERROR_INVALID_VALUE);
  // This process itself: it may lock and unlock itself, and its own queries are not gated.
  REQUIRE(api.lock_with(getpid(), 1000) == CUDA_SUCCESS);
  REQUIRE(api.state(getpid()) == CU_PROCESS_STATE_LOCKED);
  REQUIRE(api.unlock(getpid(), nullptr) == CUDA_SUCCESS);
  REQUIRE(api.state(getpid()) == CU_PROCESS_STATE_RUNNING);
}

// ctest runs it as fakecuda.checkpoint_users (label root); elsewhere it says it is skipped.
TEST_CASE("root checkpoints another user's process; a third user cannot reach it", "[root]") {
  if (geteuid() != 0) {
    std::puts("SKIPPED: needs root (two more users)");
    return;
  }
  // The users' processes create their files in the shared directory.
  REQUIRE(chmod(std::getenv("CUWARDEN_FAKE_DIR"), 01777) == 0);
  Api api;
  Nvml nvml;
  passwd victim_user = *test_user("cuwarden-test-victim");
  const passwd* attacker_user = test_user("cuwarden-test-attacker");
  Victim v({}, &victim_user);
  const std::string ptr = v.ask("alloc " + std::to_string(16 * kMiB));
  REQUIRE(ptr.rfind("ptr 0x", 0) == 0);
  CHECK(nvml.bytes_of(v.pid()) == 16 * kMiB);
  {
    Victim attacker({"lock", std::to_string(v.pid())}, attacker_user);
    CHECK(attacker.line() == "rc " + std::to_string(CUDA_ERROR_OPERATING_SYSTEM));
  }
  REQUIRE(api.state(v.pid()) == CU_PROCESS_STATE_RUNNING);
  REQUIRE(api.lock_with(v.pid(), 10000) == CUDA_SUCCESS);
  REQUIRE(api.checkpoint(v.pid(), nullptr) == CUDA_SUCCESS);
  CHECK(nvml.bytes_of(v.pid()) == 0);
  REQUIRE(api.restore(v.pid(), nullptr) == CUDA_SUCCESS);
  REQUIRE(api.unlock(v.pid(), nullptr) == CUDA_SUCCESS);
  v.send("check");
  REQUIRE(v.line() == "calling");
  REQUIRE(v.line() == "ok " + ptr.substr(4));
}
