// fakecuda: a process for the checkpoint tests to lock, checkpoint and restore from outside.
//
// It starts CUDA (cuInit, device 0's primary context), prints "ready PID", then obeys one
// command per line on stdin and answers one line per command on stdout:
//   alloc BYTES       cuMemAlloc + a pattern written through cuMemcpyHtoD -> "ptr 0xADDR" | "rc N"
//   reserve BYTES     cuMemAlloc, nothing written                         -> "ptr 0xADDR" | "rc N"
//   reserve_retry BYTES  as reserve, and once more after an out-of-memory error, as a
//                     framework's allocator does after giving back its cache -> "ptr 0xADDR" | "rc N"
//   free_reserved     cuMemFree of every reserve                          -> "rc N"
//   retry_as KIND BYTES  as reserve_retry, through another allocation call: KIND pitch
//                     (cuMemAllocPitch, rows of 1 MiB), managed (cuMemAllocManaged), vmm
//                     (cuMemCreate of a handle, not mapped), pool (cuMemAllocFromPoolAsync from
//                     a pool of its own, then cuStreamSynchronize) -> "ok" | "rc N"
//   free_kept         frees what retry_as kept                            -> "rc N"
//   spawn_holder BYTES P  a child in a session of its own, CUWARDEN_PRIORITY=-P, that holds
//                     BYTES (cuMemAlloc) and waits to be killed; the child says "held PID" | "rc N"
//   vmm               2 MiB through cuMemCreate/AddressReserve/Map/SetAccess, the pattern written
//                     through cuMemcpyHtoD                                -> "ptr 0xADDR" | "rc N"
//   vmm_check         reads that mapping back                             -> "ok 0xADDR" | "bad ..." | "rc N"
//   managed BYTES     cuMemAllocManaged                                   -> "rc N"
//   ipc               cuIpcGetMemHandle of the first allocation           -> "rc N"
//   vmm_export        cuMemCreate (shareable) + cuMemExportToShareableHandle -> "rc N"
//   vmm_import        cuMemImportFromShareableHandle of a 2 MiB memfd, as another process's
//                     exported handle arrives over a socket (nothing made exportable here) -> "rc N"
//   fill VALUE MS     on a stream: wait MS ms, then set the first allocation to VALUE -> "queued"
//   busy MS           on a stream: wait MS ms (nothing waits for it)      -> "queued"
//   stuck_call        a second thread's cuEventRecord stops inside the driver (the closed
//                     fault-injection gate, fakecuda_inline_gate) -> "inside"; that thread
//                     says "recorded N" once it returns
//   release           opens that gate (no answer of its own)
//   check             says "calling", then reads the first allocation back -> "ok 0xADDR" | "bad ..." | "rc N"
//   filled VALUE      reads the first allocation back                     -> "filled" | "bad ..." | "rc N"
//   call              cuCtxGetDevice                                      -> "rc N"
//   device N          makes device N's primary context current (what follows allocates
//                     there)                                              -> "rc N"
//   info              cuMemGetInfo                                        -> "free F total T"
//   uuid N            cuDeviceGetUuid of ordinal N                        -> "GPU-..." | "rc N"
//   alloc_on N BYTES  cuMemAlloc in device N's primary context (then back to device 0's)
//                                                                         -> "ptr 0xADDR" | "rc N"
// `ckpt_victim restore PID` instead asks for PID's restore without calling cuInit first and
// prints "rc N" (the driver requires cuInit or persistence mode before a restore);
// `ckpt_victim lock PID` calls cuInit, asks for PID's lock (1 s timeout), prints "rc N";
// `ckpt_victim move PID OLD=NEW,...` calls cuInit and asks for PID's restore with those GPU
// pairs (UUIDs), prints "rc N".
// "calling" comes before a call that may block, so that the test knows the
// process is on its way into it. EOF on stdin ends it.
#include <cuda.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fakecuda.h"

namespace {

CUdeviceptr g_first = 0;
CUdeviceptr g_vmm = 0;
constexpr size_t kVmmBytes = size_t{2} << 20;
size_t g_first_bytes = 0;
std::vector<CUdeviceptr> g_reserved;
CUstream g_stream = nullptr;

// One whole line per call: two threads may answer.
__attribute__((format(printf, 1, 2))) void say(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  std::strcat(buf, "\n");
  flockfile(stdout);
  std::fputs(buf, stdout);
  std::fflush(stdout);
  funlockfile(stdout);
}

std::string format_uuid(const CUuuid& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char buf[64];
  std::snprintf(buf, sizeof buf, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return buf;
}

bool parse_uuid(const std::string& text, CUuuid* out) {
  std::string hex;
  for (char c : text.rfind("GPU-", 0) == 0 ? text.substr(4) : text)
    if (c != '-') hex.push_back(c);
  if (hex.size() != 32 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) return false;
  for (int i = 0; i < 16; ++i) out->bytes[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return true;
}

/// What retry_as kept, by kind, to be freed by free_kept.
std::vector<CUdeviceptr> g_kept_ptrs;  // pitch, managed, pool
std::vector<CUmemGenericAllocationHandle> g_kept_handles;  // vmm
CUmemoryPool g_own_pool = nullptr;

/// One allocation of `bytes` through the call `kind` names.
CUresult allocate_as(const std::string& kind, size_t bytes) {
  CUdeviceptr p = 0;
  if (kind == "pitch") {
    size_t pitch = 0;
    const size_t row = size_t{1} << 20;
    const CUresult rc = cuMemAllocPitch(&p, &pitch, row, (bytes + row - 1) / row, 4);
    if (rc == CUDA_SUCCESS) g_kept_ptrs.push_back(p);
    return rc;
  }
  if (kind == "managed") {
    const CUresult rc = cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
    if (rc == CUDA_SUCCESS) g_kept_ptrs.push_back(p);
    return rc;
  }
  if (kind == "vmm") {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h = 0;
    const size_t granule = size_t{2} << 20;
    const CUresult rc = cuMemCreate(&h, (bytes + granule - 1) / granule * granule, &prop, 0);
    if (rc == CUDA_SUCCESS) g_kept_handles.push_back(h);
    return rc;
  }
  if (kind == "pool") {
    if (!g_own_pool) {
      CUmemPoolProps props{};
      props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
      props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      props.location.id = 0;
      if (CUresult rc = cuMemPoolCreate(&g_own_pool, &props)) return rc;
    }
    CUresult rc = cuMemAllocFromPoolAsync(&p, bytes, g_own_pool, g_stream);
    if (rc == CUDA_SUCCESS) rc = cuStreamSynchronize(g_stream);
    if (rc == CUDA_SUCCESS) g_kept_ptrs.push_back(p);
    return rc;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult free_kept() {
  CUresult rc = CUDA_SUCCESS;
  for (CUdeviceptr p : g_kept_ptrs)
    if (CUresult r = cuMemFree(p); r != CUDA_SUCCESS) rc = r;
  for (CUmemGenericAllocationHandle h : g_kept_handles)
    if (CUresult r = cuMemRelease(h); r != CUDA_SUCCESS) rc = r;
  g_kept_ptrs.clear();
  g_kept_handles.clear();
  if (g_own_pool) {  // the pool keeps what was freed into it until trimmed
    if (CUresult r = cuCtxSynchronize(); r != CUDA_SUCCESS) rc = r;
    if (CUresult r = cuMemPoolTrimTo(g_own_pool, 0); r != CUDA_SUCCESS) rc = r;
  }
  return rc;
}

unsigned char pattern(size_t i) { return static_cast<unsigned char>((i * 131 + 7) >> 3); }

void check() {
  say("calling");
  std::vector<unsigned char> back(g_first_bytes);
  const CUresult rc = cuMemcpyDtoH(back.data(), g_first, g_first_bytes);
  if (rc != CUDA_SUCCESS) return say("rc %d", rc);
  for (size_t i = 0; i < g_first_bytes; ++i)
    if (back[i] != pattern(i)) return say("bad at %zu: %d", i, back[i]);
  say("ok 0x%llx", static_cast<unsigned long long>(g_first));
}

CUresult vmm_map() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle h = 0;
  if (CUresult rc = cuMemCreate(&h, kVmmBytes, &prop, 0)) return rc;
  if (CUresult rc = cuMemAddressReserve(&g_vmm, kVmmBytes, 0, 0, 0)) return rc;
  if (CUresult rc = cuMemMap(g_vmm, kVmmBytes, 0, h, 0)) return rc;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult rc = cuMemSetAccess(g_vmm, kVmmBytes, &access, 1)) return rc;
  std::vector<unsigned char> host(kVmmBytes);
  for (size_t i = 0; i < kVmmBytes; ++i) host[i] = pattern(i + 1);
  return cuMemcpyHtoD(g_vmm, host.data(), kVmmBytes);
}

void vmm_check() {
  std::vector<unsigned char> back(kVmmBytes);
  const CUresult rc = cuMemcpyDtoH(back.data(), g_vmm, kVmmBytes);
  if (rc != CUDA_SUCCESS) return say("rc %d", rc);
  for (size_t i = 0; i < kVmmBytes; ++i)
    if (back[i] != pattern(i + 1)) return say("bad at %zu: %d", i, back[i]);
  say("ok 0x%llx", static_cast<unsigned long long>(g_vmm));
}

void filled(unsigned value) {
  std::vector<unsigned char> back(g_first_bytes);
  const CUresult rc = cuMemcpyDtoH(back.data(), g_first, g_first_bytes);
  if (rc != CUDA_SUCCESS) return say("rc %d", rc);
  for (size_t i = 0; i < g_first_bytes; ++i)
    if (back[i] != value) return say("bad at %zu: %d", i, back[i]);
  say("filled");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "restore") == 0) {
    say("rc %d", cuCheckpointProcessRestore(std::atoi(argv[2]), nullptr));
    return 0;
  }
  if (argc == 4 && std::strcmp(argv[1], "move") == 0) {
    std::vector<CUcheckpointGpuPair> pairs;
    std::string list = argv[3];
    for (std::size_t at = 0; at < list.size();) {
      const std::size_t end = std::min(list.find(',', at), list.size());
      const std::string item = list.substr(at, end - at);
      const std::size_t eq = item.find('=');
      CUcheckpointGpuPair pair{};
      if (eq == std::string::npos || !parse_uuid(item.substr(0, eq), &pair.oldUuid) ||
          !parse_uuid(item.substr(eq + 1), &pair.newUuid))
        return say("bad pair %s", item.c_str()), 2;
      pairs.push_back(pair);
      at = end + 1;
    }
    CUcheckpointRestoreArgs args{};
    args.gpuPairs = pairs.data();
    args.gpuPairsCount = static_cast<unsigned>(pairs.size());
    const CUresult init = cuInit(0);
    say("rc %d", init != CUDA_SUCCESS ? init : cuCheckpointProcessRestore(std::atoi(argv[2]), &args));
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "lock") == 0) {
    CUcheckpointLockArgs args{};
    args.timeoutMs = 1000;
    const CUresult init = cuInit(0);
    say("rc %d", init != CUDA_SUCCESS ? init : cuCheckpointProcessLock(std::atoi(argv[2]), &args));
    return 0;
  }
  const bool holder = argc == 3 && std::strcmp(argv[1], "holder") == 0;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
      cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    say("no cuda");
    return 1;
  }
  if (holder) {
    CUdeviceptr p = 0;
    const CUresult rc = cuMemAlloc(&p, std::strtoull(argv[2], nullptr, 10));
    if (rc != CUDA_SUCCESS) say("rc %d", rc);
    else say("held %d", static_cast<int>(getpid()));
    for (;;) pause();
  }
  say("ready %d", static_cast<int>(getpid()));
  char line[256];
  while (std::fgets(line, sizeof line, stdin)) {
    char cmd[64] = {};
    unsigned long long a = 0, b = 0;
    std::sscanf(line, "%63s %llu %llu", cmd, &a, &b);
    const std::string c = cmd;
    if (c == "alloc") {
      CUdeviceptr p = 0;
      CUresult rc = cuMemAlloc(&p, a);
      if (rc == CUDA_SUCCESS && !g_first) {
        std::vector<unsigned char> host(a);
        for (size_t i = 0; i < a; ++i) host[i] = pattern(i);
        rc = cuMemcpyHtoD(p, host.data(), a);
        g_first = p;
        g_first_bytes = a;
      }
      if (rc != CUDA_SUCCESS) say("rc %d", rc);
      else say("ptr 0x%llx", static_cast<unsigned long long>(p));
    } else if (c == "reserve") {
      CUdeviceptr p = 0;
      const CUresult rc = cuMemAlloc(&p, a);
      if (rc == CUDA_SUCCESS) g_reserved.push_back(p);
      if (rc != CUDA_SUCCESS) say("rc %d", rc);
      else say("ptr 0x%llx", static_cast<unsigned long long>(p));
    } else if (c == "reserve_retry") {
      CUdeviceptr p = 0;
      CUresult rc = cuMemAlloc(&p, a);
      if (rc == CUDA_ERROR_OUT_OF_MEMORY) rc = cuMemAlloc(&p, a);
      if (rc == CUDA_SUCCESS) g_reserved.push_back(p);
      if (rc != CUDA_SUCCESS) say("rc %d", rc);
      else say("ptr 0x%llx", static_cast<unsigned long long>(p));
    } else if (c == "retry_as") {
      char kind[32] = {};
      unsigned long long bytes = 0;
      std::sscanf(line, "%*s %31s %llu", kind, &bytes);
      CUresult rc = allocate_as(kind, bytes);
      if (rc == CUDA_ERROR_OUT_OF_MEMORY) rc = allocate_as(kind, bytes);
      if (rc != CUDA_SUCCESS) say("rc %d", rc);
      else say("ok");
    } else if (c == "free_kept") {
      say("rc %d", free_kept());
    } else if (c == "free_reserved") {
      CUresult rc = CUDA_SUCCESS;
      for (CUdeviceptr p : g_reserved)
        if (CUresult r = cuMemFree(p); r != CUDA_SUCCESS) rc = r;
      g_reserved.clear();
      say("rc %d", rc);
    } else if (c == "spawn_holder") {
      const std::string bytes = std::to_string(a), priority = "-" + std::to_string(b);
      std::fflush(stdout);
      const pid_t child = fork();
      if (child == 0) {
        setsid();
        setenv("CUWARDEN_PRIORITY", priority.c_str(), 1);
        execl("/proc/self/exe", "ckpt_victim", "holder", bytes.c_str(), static_cast<char*>(nullptr));
        _exit(127);
      }
      if (child < 0) say("rc -1");
    } else if (c == "vmm") {
      const CUresult rc = vmm_map();
      if (rc != CUDA_SUCCESS) say("rc %d", rc);
      else say("ptr 0x%llx", static_cast<unsigned long long>(g_vmm));
    } else if (c == "vmm_check") {
      vmm_check();
    } else if (c == "managed") {
      CUdeviceptr p = 0;
      say("rc %d", cuMemAllocManaged(&p, a, CU_MEM_ATTACH_GLOBAL));
    } else if (c == "ipc") {
      CUipcMemHandle h;
      say("rc %d", cuIpcGetMemHandle(&h, g_first));
    } else if (c == "vmm_export") {
      CUmemAllocationProp prop{};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = 0;
      prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
      CUmemGenericAllocationHandle h = 0;
      CUresult rc = cuMemCreate(&h, size_t{2} << 20, &prop, 0);
      int fd = -1;
      if (rc == CUDA_SUCCESS) rc = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      say("rc %d", rc);
    } else if (c == "vmm_import") {
      const int fd = memfd_create("ckpt_victim_import", MFD_CLOEXEC);
      CUmemGenericAllocationHandle h = 0;
      if (fd < 0 || ftruncate(fd, kVmmBytes) != 0) say("rc -1");
      else say("rc %d", cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    } else if (c == "fill") {
      fakecuda_stream_fill_async(g_stream, g_first, static_cast<unsigned char>(a), g_first_bytes, static_cast<unsigned>(b));
      say("queued");
    } else if (c == "busy") {
      fakecuda_stream_delay(g_stream, static_cast<unsigned>(a));
      say("queued");
    } else if (c == "stuck_call") {
      CUstream s = nullptr;
      CUevent ev = nullptr;
      if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS || cuEventCreate(&ev, 0) != CUDA_SUCCESS) {
        say("no stream");
        continue;
      }
      fakecuda_inline_gate(1);
      std::thread([s, ev] { say("recorded %d", cuEventRecord(ev, s)); }).detach();
      say(fakecuda_inline_gate_waiting(30000) >= 1 ? "inside" : "not inside");
    } else if (c == "release") {
      fakecuda_inline_gate(0);
    } else if (c == "check") {
      check();
    } else if (c == "filled") {
      filled(static_cast<unsigned>(a));
    } else if (c == "device") {
      CUdevice d = -1;
      CUcontext x = nullptr;
      CUresult rc = cuDeviceGet(&d, static_cast<int>(a));
      if (rc == CUDA_SUCCESS) rc = cuDevicePrimaryCtxRetain(&x, d);
      if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(x);
      say("rc %d", rc);
    } else if (c == "call") {
      CUdevice d = -1;
      say("rc %d", cuCtxGetDevice(&d));
    } else if (c == "uuid") {
      CUuuid u{};
      const CUresult rc = cuDeviceGetUuid(&u, static_cast<CUdevice>(a));
      if (rc != CUDA_SUCCESS) say("rc %d", rc);
      else say("%s", format_uuid(u).c_str());
    } else if (c == "alloc_on") {
      CUcontext other = nullptr;
      CUdeviceptr p = 0;
      CUresult rc = cuDevicePrimaryCtxRetain(&other, static_cast<CUdevice>(a));
      if (rc == CUDA_SUCCESS) rc = cuCtxSetCurrent(other);
      if (rc == CUDA_SUCCESS) rc = cuMemAlloc(&p, b);
      cuCtxSetCurrent(ctx);
      if (rc != CUDA_SUCCESS) say("rc %d", rc);
      else say("ptr 0x%llx", static_cast<unsigned long long>(p));
    } else if (c == "info") {
      size_t free = 0, total = 0;
      const CUresult rc = cuMemGetInfo(&free, &total);
      if (rc != CUDA_SUCCESS) say("rc %d", rc);
      else say("free %zu total %zu", free, total);
    } else {
      say("unknown %s", cmd);
    }
  }
  return 0;
}
