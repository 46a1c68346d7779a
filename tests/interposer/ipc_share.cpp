// Interposer test: IPC of device memory between two processes, both ways, as
// torch.multiprocessing shares tensors (parent to child and child to parent). Run under
// LD_PRELOAD=libcuwarden.so with the simulated driver, under each CUWARDEN_POOL.
//
//   cuwt_ipc_share both BYTES        parent exports to a child (which also opens it from another
//                                    device's context, and in a context it destroys with the
//                                    import open), then a child exports to the parent;
//                                    then two blocks of one exporter imported together (one
//                                    opened twice: the same address, counted closes), and a
//                                    handle whose exporter exited
//   cuwt_ipc_share plain BYTES CODE  the importer runs without cuwarden (its LD_PRELOAD
//                                    dropped); its open must answer CUresult CODE, or any
//                                    error for CODE `fail` (a real driver's answer to a handle
//                                    it did not make is its own)
//
// Each importer checks the exporter's bytes, that the driver's range queries describe the
// block (base and size), writes its own bytes, and closes; the exporter then sees them. Once
// the exporter freed the block, opening the same handle again fails (a second child).
// Exit 0 when every check passed; each failure is printed.
#include <cuda.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace {

int failures = 0;

// The one flag the driver accepts (it refuses 0: measured on the H200).
constexpr unsigned kFlags = CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;

#define CHECK_EQ(a, b)                                                                                   \
  do {                                                                                                   \
    const auto va = (a);                                                                                 \
    const auto vb = (b);                                                                                 \
    if (!(va == vb)) {                                                                                   \
      std::fprintf(stderr, "[%d] %s:%d: %s == %s failed (%lld vs %lld)\n", static_cast<int>(getpid()), \
                   __FILE__, __LINE__, #a, #b, static_cast<long long>(va), static_cast<long long>(vb));  \
      ++failures;                                                                                        \
    }                                                                                                    \
  } while (0)

void context() {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    std::fprintf(stderr, "no context\n");
    std::exit(2);
  }
}

std::string hex(const CUipcMemHandle& h) {
  std::string s;
  char b[3];
  for (unsigned char c : h.reserved) {
    std::snprintf(b, sizeof b, "%02x", c);
    s += b;
  }
  return s;
}

CUipcMemHandle unhex(const char* s) {
  CUipcMemHandle h{};
  for (size_t i = 0; i < sizeof h.reserved && s[2 * i] && s[2 * i + 1]; ++i) {
    unsigned v = 0;
    std::sscanf(s + 2 * i, "%2x", &v);
    h.reserved[i] = static_cast<char>(v);
  }
  return h;
}

/// Every byte of [p, p + bytes) equals `v`.
bool holds(CUdeviceptr p, size_t bytes, unsigned char v) {
  std::vector<unsigned char> host(bytes);
  if (cuMemcpyDtoH(host.data(), p, bytes) != CUDA_SUCCESS) return false;
  for (unsigned char c : host)
    if (c != v) return false;
  return true;
}

/// Opens `h` (a block of `bytes` holding `expect`), checks it, writes `write`, closes it.
/// Returns the open's result.
CUresult import_check_write(const CUipcMemHandle& h, size_t bytes, unsigned char expect, unsigned char write) {
  CUdeviceptr p = 0;
  const CUresult r = cuIpcOpenMemHandle(&p, h, kFlags);
  if (r != CUDA_SUCCESS) return r;
  CHECK_EQ(holds(p, bytes, expect), true);
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_EQ(cuMemGetAddressRange(&base, &size, p + bytes / 2), CUDA_SUCCESS);
  CHECK_EQ(base, p);
  CHECK_EQ(size, bytes);
  CUdeviceptr start = 0;
  CHECK_EQ(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 1), CUDA_SUCCESS);
  CHECK_EQ(start, p);
  if (getenv("CUWT_LATE_WRITE")) {
    // The simulated driver (device memory is host memory): the write is work queued on a
    // stream that runs after the close was called; the close must wait for it, as the
    // driver's does, rather than unmap under it.
    struct Late {
      CUdeviceptr p;
      size_t n;
      unsigned char v;
    };
    static Late late;
    late = Late{p, bytes, write};
    CUstream s = nullptr;
    CHECK_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(cuLaunchHostFunc(
                 s,
                 [](void* a) {
                   usleep(200 * 1000);
                   const Late* l = static_cast<const Late*>(a);
                   std::memset(reinterpret_cast<void*>(l->p), l->v, l->n);
                 },
                 &late),
             CUDA_SUCCESS);
  } else {
    CHECK_EQ(cuMemsetD8(p, write, bytes), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  }
  CHECK_EQ(cuIpcCloseMemHandle(p), CUDA_SUCCESS);
  CHECK_EQ(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);  // closed once only
  return r;
}

/// Runs this program with `args`; `plain` drops LD_PRELOAD from its environment. Returns the
/// child's pid; its stdin/stdout are the given descriptors (-1: inherited).
pid_t spawn(const char* self, const std::vector<std::string>& args, bool plain, int in = -1, int out = -1) {
  std::vector<char*> argv{const_cast<char*>(self)};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e)
    if (!plain || std::strncmp(*e, "LD_PRELOAD=", 11) != 0) envp.push_back(*e);
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (in >= 0) posix_spawn_file_actions_adddup2(&fa, in, 0);
  if (out >= 0) posix_spawn_file_actions_adddup2(&fa, out, 1);
  pid_t pid = -1;
  if (posix_spawn(&pid, self, &fa, nullptr, argv.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

int wait_exit(pid_t pid) {
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/// Parent to child: the child imports, the parent sees the child's bytes; after the free a
/// second child's open fails.
void parent_exports(const char* self, size_t bytes) {
  CUdeviceptr p = 0;
  CHECK_EQ(cuMemAlloc(&p, bytes), CUDA_SUCCESS);
  CHECK_EQ(cuMemsetD8(p, 0x5a, bytes), CUDA_SUCCESS);
  CHECK_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  CUipcMemHandle h{};
  CHECK_EQ(cuIpcGetMemHandle(&h, p), CUDA_SUCCESS);
  const std::string sz = std::to_string(bytes);
  CHECK_EQ(wait_exit(spawn(self, {"import", hex(h), sz, "90", "165"}, false)), 0);  // 0x5a, then 0xa5
  CHECK_EQ(holds(p, bytes, 0xa5), true);
  // Other contexts of the importer: another device's, and one destroyed with the import open.
  CHECK_EQ(wait_exit(spawn(self, {"import-contexts", hex(h), sz}, false)), 0);
  CHECK_EQ(cuMemFree(p), CUDA_SUCCESS);
  // The freed block: a handle of ours opens nothing (CUWT_FREED_FAILS=1: the driver's own
  // handles, which the simulated driver cannot check across processes, are not asked).
  if (const char* e = getenv("CUWT_FREED_FAILS"); e && *e == '1')
    CHECK_EQ(wait_exit(spawn(self, {"import-fails", hex(h), sz}, false)), 0);
}

/// Two blocks of one exporter in one importer: each opened, one twice, closed in turn.
void two_blocks(const char* self, size_t bytes) {
  CUdeviceptr a = 0, b = 0;
  CHECK_EQ(cuMemAlloc(&a, bytes), CUDA_SUCCESS);
  CHECK_EQ(cuMemAlloc(&b, bytes), CUDA_SUCCESS);
  CHECK_EQ(cuMemsetD8(a, 0x11, bytes), CUDA_SUCCESS);
  CHECK_EQ(cuMemsetD8(b, 0x22, bytes), CUDA_SUCCESS);
  CHECK_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  CUipcMemHandle ha{}, hb{};
  CHECK_EQ(cuIpcGetMemHandle(&ha, a), CUDA_SUCCESS);
  CHECK_EQ(cuIpcGetMemHandle(&hb, b), CUDA_SUCCESS);
  CHECK_EQ(wait_exit(spawn(self, {"import-two", hex(ha), hex(hb), std::to_string(bytes)}, false)), 0);
  CHECK_EQ(cuMemFree(a), CUDA_SUCCESS);
  CHECK_EQ(cuMemFree(b), CUDA_SUCCESS);
}

/// A handle whose exporter has exited opens nothing, and says so without waiting long.
void exporter_gone(const char* self, size_t bytes) {
  int from_child[2];
  if (pipe(from_child) != 0) std::exit(2);
  const pid_t pid = spawn(self, {"export-exit", std::to_string(bytes)}, false, -1, from_child[1]);
  close(from_child[1]);
  char line[256] = {};
  FILE* in = fdopen(from_child[0], "r");
  const bool said = in && std::fgets(line, sizeof line, in);
  CHECK_EQ(said, true);
  CHECK_EQ(wait_exit(pid), 0);
  if (said) {
    CUdeviceptr p = 0;
    const CUresult r = cuIpcOpenMemHandle(&p, unhex(line), kFlags);
    CHECK_EQ(r != CUDA_SUCCESS, true);
  }
  if (in) std::fclose(in);
}

/// A freed block's handle names that block, not the next one handed out at its address and
/// size (under vmm another Block of the pool's may stand there by then: here the second of
/// two blocks, merged into the first when both are freed and split off again). Says whether
/// the address came back; checks the handle only then (CUWT_FREED_FAILS=1).
void reused_address(const char* self, size_t bytes) {
  CUdeviceptr a = 0, b = 0, c1 = 0, c2 = 0;
  CHECK_EQ(cuMemAlloc(&a, bytes), CUDA_SUCCESS);
  CHECK_EQ(cuMemAlloc(&b, bytes), CUDA_SUCCESS);
  CUipcMemHandle h{};
  CHECK_EQ(cuIpcGetMemHandle(&h, b), CUDA_SUCCESS);
  CHECK_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  CHECK_EQ(cuMemFree(a), CUDA_SUCCESS);
  CHECK_EQ(cuMemFree(b), CUDA_SUCCESS);
  CHECK_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  CHECK_EQ(cuMemAlloc(&c1, bytes), CUDA_SUCCESS);
  CHECK_EQ(cuMemAlloc(&c2, bytes), CUDA_SUCCESS);
  std::printf("freed block's address handed out again: %d\n", c2 == b ? 1 : 0);
  if (const char* e = getenv("CUWT_FREED_FAILS"); e && *e == '1' && c2 == b)
    CHECK_EQ(wait_exit(spawn(self, {"import-fails", hex(h), std::to_string(bytes)}, false)), 0);
  CHECK_EQ(cuMemFree(c1), CUDA_SUCCESS);
  CHECK_EQ(cuMemFree(c2), CUDA_SUCCESS);
}

/// Child to parent: the child allocates and exports, the parent imports and writes, the child
/// sees it.
void child_exports(const char* self, size_t bytes) {
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) std::exit(2);
  const pid_t pid = spawn(self, {"export", std::to_string(bytes)}, false, to_child[0], from_child[1]);
  close(to_child[0]);
  close(from_child[1]);
  char line[256] = {};
  FILE* in = fdopen(from_child[0], "r");
  if (!in || !std::fgets(line, sizeof line, in)) {
    std::fprintf(stderr, "the exporting child said nothing\n");
    ++failures;
  } else {
    CHECK_EQ(import_check_write(unhex(line), bytes, 0x3c, 0xc3), CUDA_SUCCESS);
  }
  CHECK_EQ(write(to_child[1], "done\n", 5), 5);
  close(to_child[1]);
  CHECK_EQ(wait_exit(pid), 0);
  if (in) std::fclose(in);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s both|plain BYTES\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  context();
  if (mode == "import" && argc == 6) {  // HANDLE BYTES EXPECT WRITE
    const CUresult r = import_check_write(unhex(argv[2]), std::strtoull(argv[3], nullptr, 10),
                                          static_cast<unsigned char>(std::atoi(argv[4])),
                                          static_cast<unsigned char>(std::atoi(argv[5])));
    CHECK_EQ(r, CUDA_SUCCESS);
    return failures ? 1 : 0;
  }
  if (mode == "import-two" && argc == 5) {  // HANDLE_A HANDLE_B BYTES: blocks holding 0x11 and 0x22
    const size_t n = std::strtoull(argv[4], nullptr, 10);
    const CUipcMemHandle ha = unhex(argv[2]), hb = unhex(argv[3]);
    CUdeviceptr a = 0, a2 = 0, b = 0;
    CHECK_EQ(cuIpcOpenMemHandle(&a, ha, kFlags), CUDA_SUCCESS);
    CHECK_EQ(cuIpcOpenMemHandle(&b, hb, kFlags), CUDA_SUCCESS);
    // Again: the same address, counted (a driver may also refuse a second open; then once).
    const CUresult again = cuIpcOpenMemHandle(&a2, ha, kFlags);
    std::printf("second open of one handle: %d\n", static_cast<int>(again));
    if (again != CUDA_ERROR_ALREADY_MAPPED) {
      CHECK_EQ(again, CUDA_SUCCESS);
      CHECK_EQ(a2, a);
    }
    CHECK_EQ(holds(a, n, 0x11), true);
    CHECK_EQ(holds(b, n, 0x22), true);
    CHECK_EQ(cuIpcCloseMemHandle(a + 16) != CUDA_SUCCESS, true);  // no open returned it
    if (again == CUDA_SUCCESS) {
      CHECK_EQ(cuIpcCloseMemHandle(a), CUDA_SUCCESS);
      CHECK_EQ(holds(a, n, 0x11), true);  // still open once
      CHECK_EQ(holds(b, n, 0x22), true);
    }
    CHECK_EQ(cuIpcCloseMemHandle(a), CUDA_SUCCESS);
    CHECK_EQ(holds(b, n, 0x22), true);  // b's mapping (the same slab, maybe) stays
    CHECK_EQ(cuIpcCloseMemHandle(b), CUDA_SUCCESS);
    CHECK_EQ(cuIpcCloseMemHandle(b) != CUDA_SUCCESS, true);
    return failures ? 1 : 0;
  }
  if (mode == "import-contexts" && argc == 4) {  // HANDLE BYTES: a block holding 0xa5
    const CUipcMemHandle h = unhex(argv[2]);
    const size_t n = std::strtoull(argv[3], nullptr, 10);
    int devices = 0;
    CHECK_EQ(cuDeviceGetCount(&devices), CUDA_SUCCESS);
    if (devices > 1) {  // opened from device 1's context: readable there (peer, or mapped for it)
      CUdevice d1 = 0;
      CUcontext c1 = nullptr, c0 = nullptr;
      CHECK_EQ(cuCtxGetCurrent(&c0), CUDA_SUCCESS);
      CHECK_EQ(cuDeviceGet(&d1, 1), CUDA_SUCCESS);
      CHECK_EQ(cuDevicePrimaryCtxRetain(&c1, d1), CUDA_SUCCESS);
      CHECK_EQ(cuCtxSetCurrent(c1), CUDA_SUCCESS);
      CUdeviceptr q = 0;
      CHECK_EQ(cuIpcOpenMemHandle(&q, h, kFlags), CUDA_SUCCESS);
      CHECK_EQ(holds(q, n, 0xa5), true);
      CHECK_EQ(cuIpcCloseMemHandle(q), CUDA_SUCCESS);
      CHECK_EQ(cuCtxSetCurrent(c0), CUDA_SUCCESS);
    }
    // A context of its own, destroyed with the import open: the import goes with it.
    CUdevice d0 = 0;
    CUcontext mine = nullptr;
    CHECK_EQ(cuDeviceGet(&d0, 0), CUDA_SUCCESS);
    CHECK_EQ(cuCtxCreate(&mine, nullptr, 0, d0), CUDA_SUCCESS);
    CUdeviceptr q = 0;
    CHECK_EQ(cuIpcOpenMemHandle(&q, h, kFlags), CUDA_SUCCESS);
    CHECK_EQ(holds(q, n, 0xa5), true);
    CHECK_EQ(cuCtxDestroy(mine), CUDA_SUCCESS);
    CUdevice dev = 0;
    CUcontext primary = nullptr;
    CHECK_EQ(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&primary, dev), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    CHECK_EQ(cuIpcCloseMemHandle(q) != CUDA_SUCCESS, true);  // nothing left to close
    CUdeviceptr again = 0;
    CHECK_EQ(cuIpcOpenMemHandle(&again, h, kFlags), CUDA_SUCCESS);  // opened afresh here
    CHECK_EQ(holds(again, n, 0xa5), true);
    CHECK_EQ(cuIpcCloseMemHandle(again), CUDA_SUCCESS);
    return failures ? 1 : 0;
  }
  if (mode == "export-exit" && argc == 3) {  // export a block, say its handle, exit at once
    CUdeviceptr q = 0;
    CHECK_EQ(cuMemAlloc(&q, std::strtoull(argv[2], nullptr, 10)), CUDA_SUCCESS);
    CUipcMemHandle h{};
    CHECK_EQ(cuIpcGetMemHandle(&h, q), CUDA_SUCCESS);
    std::printf("%s\n", hex(h).c_str());
    return failures ? 1 : 0;
  }
  if (mode == "import-fails" && argc == 4) {
    CUdeviceptr p = 0;
    const CUresult r = cuIpcOpenMemHandle(&p, unhex(argv[2]), kFlags);
    if (r == CUDA_SUCCESS) {
      std::fprintf(stderr, "a freed block's handle opened\n");
      return 1;
    }
    return 0;
  }
  if (mode == "import-plain" && argc == 4) {
    CUdeviceptr p = 0;
    const CUresult r = cuIpcOpenMemHandle(&p, unhex(argv[2]), kFlags);
    if (r == CUDA_SUCCESS) cuIpcCloseMemHandle(p);
    return static_cast<int>(r) & 0x7f;
  }
  const size_t bytes = std::strtoull(argv[2], nullptr, 10);
  if (mode == "export") {  // child side of child_exports
    CUdeviceptr p = 0;
    CHECK_EQ(cuMemAlloc(&p, bytes), CUDA_SUCCESS);
    CHECK_EQ(cuMemsetD8(p, 0x3c, bytes), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
    CUipcMemHandle h{};
    CHECK_EQ(cuIpcGetMemHandle(&h, p), CUDA_SUCCESS);
    std::printf("%s\n", hex(h).c_str());
    std::fflush(stdout);
    char line[16];
    if (!std::fgets(line, sizeof line, stdin)) ++failures;
    CHECK_EQ(holds(p, bytes, 0xc3), true);
    CHECK_EQ(cuMemFree(p), CUDA_SUCCESS);
    return failures ? 1 : 0;
  }
  if (mode == "both") {
    parent_exports(argv[0], bytes);
    child_exports(argv[0], bytes);
    two_blocks(argv[0], bytes);
    exporter_gone(argv[0], bytes);
    reused_address(argv[0], bytes);
  } else if (mode == "plain" && argc == 4) {
    CUdeviceptr p = 0;
    CHECK_EQ(cuMemAlloc(&p, bytes), CUDA_SUCCESS);
    CUipcMemHandle h{};
    CHECK_EQ(cuIpcGetMemHandle(&h, p), CUDA_SUCCESS);
    std::fflush(stdout);
    const int code = wait_exit(spawn(argv[0], {"import-plain", hex(h), std::to_string(bytes)}, true));
    std::printf("plain importer's open: %d\n", code);
    if (std::strcmp(argv[3], "fail") == 0)
      CHECK_EQ(code != 0, true);
    else
      CHECK_EQ(code, std::atoi(argv[3]));
    CHECK_EQ(cuMemFree(p), CUDA_SUCCESS);
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  if (failures) std::fprintf(stderr, "%d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
