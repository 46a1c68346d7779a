// cuwarden interposer core: configuration, ring creation, caps and counters.
#include "core/tracker.hpp"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "cuw/attrs.hpp"
#include "cuw/paths.hpp"
#include "base/fast_clock.hpp"
#include "core/ledger.hpp"
#include "base/log.hpp"
#include "base/nvml_process.hpp"
#include "base/real.hpp"
#include "core/run_dir.hpp"
#include "core/callsites/unwind.hpp"

namespace cuw::core {

// ---- instance and fork -----------------------------------------------------------------

namespace detail {

CUW_COLD uint32_t thread_id_slow() noexcept {
  const auto tid = static_cast<uint32_t>(syscall(SYS_gettid));
  fast_clock::detail::t_state.tid = tid;
  return tid;
}

/// hook::g_hot.tls_offset, at load: a pointer difference (no thread, no file, no call).
/// Never 0: x86-64 puts static TLS below the thread pointer, aarch64 past its header.
__attribute__((constructor)) void set_tls_offset() {
  hook::g_hot.tls_offset.store(reinterpret_cast<char*>(&fast_clock::detail::t_state) -
                                    static_cast<char*>(__builtin_thread_pointer()),
                                std::memory_order_relaxed);
}
}  // namespace detail

using hook::g_hot;

// The tracker lives in hook::g_page, beside g_hot, rather than on the heap.
static_assert(sizeof(Tracker) <= hook::kTrackerBytes,
              "the tracker no longer fits beside g_hot in one page: shrink one, or let HotPage span two (real.hpp)");
static_assert(alignof(Tracker) <= 64, "HotPage::tracker is 64-byte aligned");

namespace {

pthread_mutex_t g_create_mu = PTHREAD_MUTEX_INITIALIZER;

void atfork_prepare() { pthread_mutex_lock(&g_create_mu); }
void atfork_parent() { pthread_mutex_unlock(&g_create_mu); }
void atfork_child() {
  // The child never writes into its parent's ring or counters: it starts afresh at its own
  // first CUDA call, constructing its tracker over the parent's copy, which is never
  // destroyed (its destructors would release what the parent still uses: its heap objects
  // are leaked in the child on purpose).
  g_hot.instance.store(nullptr, std::memory_order_release);
  fast_clock::detail::t_state.tid = 0;  // the child's thread has an id of its own
  unwind::after_fork_child();
  pthread_mutex_unlock(&g_create_mu);
}

void read_small_file(const char* path, char* out, size_t cap, bool nul_to_space) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = ::read(fd, out, cap - 1);
  ::close(fd);
  if (n <= 0) return;
  out[n] = '\0';
  for (ssize_t i = 0; i < n; ++i) {
    if (out[i] == '\n') out[i] = nul_to_space ? ' ' : '\0';
    if (nul_to_space && out[i] == '\0') out[i] = ' ';
  }
  while (n > 0 && out[n - 1] == ' ') out[--n] = '\0';
}

void copy_str(char* dst, size_t cap, const std::string& s) {
  size_t n = s.size() < cap - 1 ? s.size() : cap - 1;
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

}  // namespace

CUW_COLD Tracker& Tracker::create() {
  pthread_mutex_lock(&g_create_mu);
  auto* t = static_cast<Tracker*>(g_hot.instance.load(std::memory_order_acquire));
  if (!t) {
    static bool atfork_registered = false;
    if (!atfork_registered) {
      pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
      atfork_registered = true;
    }
    std::vector<std::string> notes;
    t = new (hook::g_page.tracker) Tracker(&notes);  // never destroyed (a forked child builds anew over it)
    g_hot.instance.store(t, std::memory_order_release);
  }
  pthread_mutex_unlock(&g_create_mu);
  return *t;
}

Tracker::Tracker(std::vector<std::string>* notes) : config_(load_config(notes)) {
  for (auto& g : job_gpu_) g.store(-1, std::memory_order_relaxed);
  log::init(config_.log_level, config_.log_file);
  for (const std::string& n : *notes) log::always("cuwarden: %s", n.c_str());
  {
    // Never the shared directory when another user could delete or replace our files there.
    std::string note;
    bool suspicious = false;
    config_.run_dir = choose_run_dir(config_.run_dir, static_cast<unsigned>(geteuid()), &note, &suspicious);
    if (!note.empty()) {
      if (suspicious) log::warn("cuwarden: %s", note.c_str());
      else log::info("cuwarden: %s", note.c_str());
    }
  }
  if (!config_.job.empty() && config_.errors.empty()) join_job();
  if (!config_.errors.empty()) {
    for (const std::string& e : config_.errors) {
      if (config_.fail_open)
        log::always("cuwarden: warning: %s; CUWARDEN_ON_ERROR=open: running without caps", e.c_str());
      else
        log::always("cuwarden: %s; exiting with status %d (CUWARDEN_ON_ERROR=open runs uncapped instead)",
                    e.c_str(), kExitConfig);
    }
    if (!config_.fail_open) {
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(kExitConfig);
    }
    config_.limits.clear();
    job_slot_ = -1;
  }
  // NVML loaded now, at the first CUDA call and outside every lock (it takes the loader's).
  if (config_.cap_scope_process) {
    if (hook::nvml_prepare()) {
      process_scope_.store(true, std::memory_order_relaxed);
    } else {
      config_.cap_scope_process = false;
      log::warn("cuwarden: CUWARDEN_CAP_SCOPE=process: NVML (libnvidia-ml.so.1) cannot report this process's "
                "memory; caps count allocations only");
    }
  }
  fast_clock::init(config_.clock);
  create_ring();
  log::info("cuwarden: tracking pid %d, ring %s, cap %s", static_cast<int>(getpid()),
            ring_is_file_ ? ring_path().c_str() : "(private)",
            config_.limits.empty()                ? "none"
            : secure_getenv("CUWARDEN_LIMIT") != nullptr ? secure_getenv("CUWARDEN_LIMIT")
                                                         : "from the config file (CUWARDEN_CONFIG)");
}

void Tracker::create_ring() {
  slot_count_ = ring::kDefaultSlotCount;
  const uint64_t bytes = ring::file_size(slot_count_);
  void* base = MAP_FAILED;
  const std::string& dir = config_.run_dir;
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const uint64_t start = paths::self_start_time();

  if (!dir.empty()) {
    // A process of ours killed while no daemon ran left its ring behind, which nothing else
    // would remove (a daemon removes what it saw exit). Only our own uid's, of our own pid
    // namespace, proven gone: the daemon cleans the rest.
    if (!daemon_listening())
      if (const int n = paths::remove_dead_rings(dir, static_cast<uint32_t>(geteuid())))
        log::debug("cuwarden: removed %d ring(s) of processes gone from %s", n, dir.c_str());
    const std::string path = dir + "/" + paths::ring_file_name(pid, start);
    // The owner's alone (0600): the header holds the command line. The daemon reads it as
    // root; a daemon of another user does not count it.
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) {
      // A leftover of an earlier process with our pid and start time cannot exist unless
      // the clock went back; a file we do not own is not ours to reuse either way.
      log::warn("cuwarden: %s exists; using a private ring", path.c_str());
    } else if (fd < 0) {
      log::warn("cuwarden: cannot create %s (%s); using a private ring, which no daemon counts", path.c_str(),
                std::strerror(errno));
    }
    if (fd >= 0) {
      ::fchmod(fd, 0600);
      // Every page allocated before it is mapped: on a full tmpfs the first write to a page
      // that is not would be SIGBUS in the program.
      const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
      if (err == 0) {
        base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base != MAP_FAILED) ring_is_file_ = true;
      } else {
        log::warn("cuwarden: cannot allocate %llu bytes for %s (%s); using a private ring, which no daemon counts",
                  static_cast<unsigned long long>(bytes), path.c_str(), std::strerror(err));
      }
      ::close(fd);
      if (!ring_is_file_) ::unlink(path.c_str());
    }
  }
  if (base == MAP_FAILED) {
    base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      // Without memory for counters we cannot enforce; this is a fatal environment error.
      log::always("cuwarden: cannot map %llu bytes for counters; exiting", static_cast<unsigned long long>(bytes));
      _exit(kExitConfig);
    }
  }
  header_ = static_cast<ring::RingHeader*>(base);

  header_->pid = pid;
  header_->pidns = job::self_pidns();
  header_->uid = static_cast<uint32_t>(getuid());
  header_->start_time = start;
  header_->created_ns = fast_clock::realtime_ns_slow();
  read_small_file("/proc/self/comm", header_->comm, sizeof header_->comm, false);
  read_small_file("/proc/self/cmdline", header_->cmdline, sizeof header_->cmdline, true);
  copy_str(header_->job, sizeof header_->job, config_.job);
  copy_str(header_->pool, sizeof header_->pool, pool_name(config_.pool));
  header_->priority = config_.priority;  // the daemon reads it once and clamps it by its policy
  header_->priority_asked = config_.priority_asked ? 1 : 0;
  header_->cap_scope = static_cast<uint32_t>(process_scope_.load(std::memory_order_relaxed) ? ring::CapScope::process
                                                                                           : ring::CapScope::allocations);
  header_->state.store(static_cast<uint32_t>(ring::ProcessState::running), std::memory_order_relaxed);
  ring::init(*header_, slots(), slot_count_);  // publishes the magic last

  // The live segment beside the ring (a private one when the ring is private: the process's
  // own reports still read it). The tables keep their slots there from their first insert.
  const bool sites = config_.callsites > 0;
  live_->segment.open(ring_is_file_ ? dir : std::string(), pid, header_->uid, start, header_->created_ns,
             static_cast<uint32_t>(config_.callsites), sites && config_.pyframes);
  if (live_->segment.usable()) {
    pointers_.attach(&live_->segment, live::Table::device);
    handles_.attach(&live_->segment, live::Table::handles);
    host_.attach(&live_->segment, live::Table::host);
    static_assert(live::kPooledDevices == ring::kMaxDevices, "one pooled table per device the ring tracks");
    for (uint32_t d = 0; d < ring::kMaxDevices; ++d)
      live_->pool_books[d].blocks.attach_slot(&live_->segment, live::pooled_slot(static_cast<int>(d)));
    live_->pool_segments.attach(&live_->segment, live::Table::segments);
  }
  if (sites) {
    live_->sites.init(&live_->segment, config_.callsites, config_.pyframes);
    callsites_on_.store(live_->sites.enabled(), std::memory_order_relaxed);
  }
}

void Tracker::join_job() {
  const std::string& dir = config_.run_dir;
  const std::string what = "CUWARDEN_JOB='" + config_.job + "': ";
  if (dir.empty()) {
    config_.errors.push_back(what + "no run directory to share the job's file in");
    return;
  }
  std::string error;
  job::DirChoice where;
  if (!job::choose_dir(dir, static_cast<uint32_t>(geteuid()), config_.job, &where, &error)) {
    config_.errors.push_back(what + error);
    return;
  }
  // Someone else holds a name we would have used: the job still runs, with one cap, in the
  // directory every member of it chooses.
  if (!where.skipped.empty())
    log::always("cuwarden: %sskipped what it cannot trust: %s; the job's file is in %s", what.c_str(),
                where.skipped.c_str(), where.path.c_str());
  job_ = job::Segment::open(where.path, static_cast<uint32_t>(geteuid()), config_.job, true, &error);
  if (!job_) {
    config_.errors.push_back(what + "cannot use the job segment: " + error);
    return;
  }
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const uint64_t start = paths::self_start_time();
  if (start == 0) {  // other members could not tell us from a reused pid
    config_.errors.push_back("CUWARDEN_JOB='" + config_.job + "': cannot read /proc/self/stat (start time)");
    return;
  }
  job_slot_ = job_->join(pid, start, config_.job_limit, fast_clock::realtime_ns_slow());
  if (job_slot_ < 0)
    config_.errors.push_back("CUWARDEN_JOB='" + config_.job + "': the job already has " +
                             std::to_string(job::kMaxMembers) + " live members");
}

uint64_t Tracker::configured_limit(int ordinal, uint64_t physical) const noexcept {
  return lowest_cap(config_.limits, ordinal, physical);
}

uint64_t Tracker::job_cap() const noexcept {
  if (job_slot_ < 0) return ring::kNoLimit;
  const uint64_t cap = job_->cap();
  return cap == job::kNoLimit ? ring::kNoLimit : cap;
}

bool Tracker::job_view(int ordinal, uint64_t* cap, uint64_t* used) const noexcept {
  const int g = job_gpu(ordinal);
  if (g < 0) return false;
  *cap = job_->cap();
  if (*cap == job::kNoLimit) return false;
  *used = job_->used(g);
  return true;
}

void Tracker::fill_device(int ordinal, ring::DeviceSlot& d) {
  using uuid_fn = CUresult (*)(CUuuid*, CUdevice);
  using name_fn = CUresult (*)(char*, int, CUdevice);
  static auto get_uuid = reinterpret_cast<uuid_fn>(hook::driver_symbol("cuDeviceGetUuid_v2"));
  static auto get_uuid_v1 = reinterpret_cast<uuid_fn>(hook::driver_symbol("cuDeviceGetUuid"));
  static auto get_name = reinterpret_cast<name_fn>(hook::driver_symbol("cuDeviceGetName"));
  CUuuid u{};
  if ((get_uuid && get_uuid(&u, ordinal) == CUDA_SUCCESS) || (get_uuid_v1 && get_uuid_v1(&u, ordinal) == CUDA_SUCCESS))
    std::memcpy(d.uuid, u.bytes, sizeof d.uuid);
  if (get_name) get_name(d.name, static_cast<int>(sizeof d.name) - 1, ordinal);
  size_t total = 0;
  if (auto f = REAL(cuDeviceTotalMem_v2); f && f(&total, ordinal) == CUDA_SUCCESS) d.physical_total = total;
  d.ordinal = ordinal;
  // An MPS client's contexts live in the MPS server, which the checkpoint API cannot carry:
  // the daemon refuses to suspend the process (model/suspend.cpp). A driver too old to know
  // the attribute answers CUDA_ERROR_INVALID_VALUE (left 0); it has no checkpoint API either.
  using attr_fn = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  static auto get_attr = reinterpret_cast<attr_fn>(hook::driver_symbol("cuDeviceGetAttribute"));
  if (int mps = 0; get_attr && get_attr(&mps, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, ordinal) == CUDA_SUCCESS && mps == 1)
    d.mps_client.store(1, std::memory_order_relaxed);
  for (const LimitSpec& l : config_.limits)
    if (const auto spec = l.for_device(ordinal); spec && spec->percent && d.physical_total == 0)
      log::warn("cuwarden: device %d: physical memory unknown, cannot apply %s", ordinal, spec->str().c_str());
  d.limit.store(configured_limit(ordinal, d.physical_total), std::memory_order_relaxed);
  if (job_slot_ >= 0) {
    const int g = job_->gpu_index(d.uuid, d.physical_total);
    job_gpu_[ordinal].store(static_cast<int8_t>(g), std::memory_order_relaxed);
    if (g < 0)
      log::warn("cuwarden: job %s uses more than %u GPUs; device %d is not counted in the job", config_.job.c_str(),
                job::kMaxGpus, ordinal);
  }
  // One device visible to the process (CUDA_VISIBLE_DEVICES, MIG, or the machine): every
  // context is on ordinal 0, so allocation hooks need not ask the driver (allocation_device).
  using count_fn = CUresult (*)(int*);
  static auto get_count = reinterpret_cast<count_fn>(hook::driver_symbol("cuDeviceGetCount"));
  if (int n = 0; ordinal == 0 && get_count && get_count(&n) == CUDA_SUCCESS && n == 1)
    single_device_.store(true, std::memory_order_relaxed);
  if (header_->visible_devices.load(std::memory_order_relaxed) == 0) note_visible_devices();
  uint32_t count = header_->device_count.load(std::memory_order_relaxed);
  if (static_cast<uint32_t>(ordinal) + 1 > count)
    header_->device_count.store(static_cast<uint32_t>(ordinal) + 1, std::memory_order_relaxed);
  d.present.store(1, std::memory_order_release);
  filled_.fetch_or(1u << ordinal, std::memory_order_release);
}

CUW_COLD ring::DeviceSlot* Tracker::fill_device_once(int ordinal) {
  ring::DeviceSlot& d = header_->devices[ordinal];
  bool filled = false;
  {
    std::lock_guard<std::mutex> lk(device_mu_);
    if (!d.present.load(std::memory_order_acquire)) {
      fill_device(ordinal, d);
      filled = true;
    }
  }
  // Measured later, by charge() or a context's retain: here an allocation that has reached
  // the driver may not be counted yet, and NVML's figure would count it twice.
  if (filled && process_scope_.load(std::memory_order_relaxed))
    filled_.fetch_or(1u << (kUnmeasured + ordinal), std::memory_order_relaxed);
  return &d;
}

CUW_COLD Tracker::ctx_get_device_fn Tracker::resolve_ctx_get_device() noexcept {
  auto f = reinterpret_cast<ctx_get_device_fn>(hook::driver_symbol("cuCtxGetDevice"));
  ctx_get_device_.store(f, std::memory_order_relaxed);
  return f;
}

CUW_COLD Tracker::Charge Tracker::refuse(ring::DeviceSlot& d, int ordinal, uint64_t bytes, ring::Api api,
                                         bool assumed) {
  if (assumed && current_device() < 0) return Charge::no_context;
  counter_add(d.refusals, 1);
  emit_at(ring::EventKind::refuse, api, ordinal, 0, bytes, 0, CUDA_ERROR_OUT_OF_MEMORY, now_ns());
  report_oom(ordinal, bytes, api, ring::EventKind::refuse, CUDA_ERROR_OUT_OF_MEMORY);
  return Charge::refused;
}

CUW_COLD bool Tracker::held_back_slow(uint32_t mask, int ordinal) noexcept {
  if (__builtin_expect(mask & ring::kDevicesMoved, 0)) {
    devices_moved();
    mask &= ~ring::kDevicesMoved;
  }
  if (static_cast<unsigned>(ordinal) >= ring::kMaxDevices || !(mask >> ordinal & 1)) return false;
  // A daemon that stopped (killed while a restore was pending) leaves its mark behind: one
  // that has not drained the ring for 5 s holds nothing back (it beats every 250 ms).
  const uint64_t beat = header_->consumer_heartbeat_ns.load(std::memory_order_relaxed);
  const uint64_t now = fast_clock::realtime_ns_slow();
  return beat != 0 && (beat > now || now - beat <= 5'000'000'000ULL);
}

CUW_COLD bool Tracker::held_back_refused(ring::DeviceSlot& d, int ordinal, uint64_t bytes, ring::Api api,
                                         bool assumed) {
  return held_back(ordinal) && refuse(d, ordinal, bytes, api, assumed) == Charge::refused;
}

CUW_HOT Tracker::Charge Tracker::charge(ring::DeviceSlot& d, int ordinal, uint64_t bytes, ring::Api api,
                                        bool assumed, bool quiet) {
  // Held back for a higher-priority process waiting to be resumed on this GPU: refused as a
  // cap refuses (a pool gives back what it keeps first, as for a cap).
  if (__builtin_expect(held_back(ordinal), 0)) {
    if (quiet) return assumed && current_device() < 0 ? Charge::no_context : Charge::refused;
    return refuse(d, ordinal, bytes, api, assumed);
  }
  // CUWARDEN_CAP_SCOPE=process: the context's figure made current first where it matters (a
  // device not measured yet, an allocation that comes near a cap), so that the test below
  // sees it and nothing is charged to be taken back.
  if (__builtin_expect(process_scope_.load(std::memory_order_relaxed), 0)) context_before_charge(d, ordinal, bytes);
  const int g = job_gpu(ordinal);
  // The cap's test and the charge in one compare-and-swap of `used`, no lock: `used` never
  // passes `limit`, not even for an instant a reader could see, and a request the process
  // cap refuses never makes another one fail (a fetch-add rolled back on refusal, RMM's
  // limiting adaptor, would let both). (In a job, bytes charged here go back if the job's
  // cap refuses them below.) A cap changed meanwhile counts as changed after.
  auto fits = [&]() CUW_LAMBDA_INLINE {
    const uint64_t limit = d.limit.load(std::memory_order_relaxed);
    uint64_t used = d.used.load(std::memory_order_relaxed);
    do {
      if (!within(limit, used, bytes)) return false;
    } while (__builtin_expect(!d.used.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed), 0));
    // In a job the peak waits for the job's answer: a refused request never was held.
    if (__builtin_expect(g < 0, 1)) raise_peak(d.peak, used + bytes);
    return true;
  };
  bool over = !fits();
  // Counting the context: its figure may be stale (memory the driver gave back), so it is
  // measured once before the answer, and the test made again if it fell.
  if (__builtin_expect(over, 0) && process_scope_.load(std::memory_order_relaxed) && measure_context(ordinal, false))
    over = !fits();
  if (__builtin_expect(over, 0)) {
    if (quiet) return assumed && current_device() < 0 ? Charge::no_context : Charge::refused;
    return refuse(d, ordinal, bytes, api, assumed);
  }
  if (__builtin_expect(g >= 0, 0)) {
    uint64_t job_cap = 0, job_used = 0;
    const bool ok = job_->charge(job_slot_, g, bytes, &job_cap, &job_used);
    if (!ok && assumed && current_device() < 0) {  // no context: nothing was asked for
      uncharge_locked(d, bytes);  // the job's own share was not taken (refused)
      return Charge::no_context;
    }
    if (!ok) {
      counter_sub(d.used, bytes);
      if (quiet) return Charge::refused;
      counter_add(d.refusals, 1);
      // used_after: what the job's other members hold (the figure that refused us).
      emit_at(ring::EventKind::job_refuse, api, ordinal, 0, bytes, job_cap, CUDA_ERROR_OUT_OF_MEMORY, now_ns(),
              job_used);
      report_oom(ordinal, bytes, api, ring::EventKind::job_refuse, CUDA_ERROR_OUT_OF_MEMORY);
      return Charge::refused;
    }
    raise_peak(d.peak, d.used.load(std::memory_order_relaxed));
  }
  return Charge::ok;
}

void Tracker::force_charge_locked(ring::DeviceSlot& d, uint64_t bytes) noexcept {
  raise_peak(d.peak, d.used.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

CUW_COLD void Tracker::job_uncharge_slow(int g, uint64_t bytes) noexcept { job_->uncharge(job_slot_, g, bytes); }

void Tracker::job_force_charge(int ordinal, uint64_t bytes) noexcept {
  if (const int g = job_gpu(ordinal); __builtin_expect(g >= 0, 0)) job_->force_charge(job_slot_, g, bytes);
}

void Tracker::uncharge(ring::DeviceSlot& d, uint64_t bytes) noexcept {
  uncharge_locked(d, bytes);
  job_uncharge(d.ordinal, bytes);
}

void Tracker::refresh_pools(int ordinal, CUmemoryPool pool, bool force, bool discover) noexcept {
  if (ordinal < 0 || ordinal >= static_cast<int>(ring::kMaxDevices)) return;
  PoolSet& ps = pools_[ordinal];
  if (!discover && ps.pools[0].load(std::memory_order_relaxed) == nullptr) return;  // none seen
  const uint64_t now = now_ns();
  if (!force && now - ps.refreshed_ns.load(std::memory_order_relaxed) < 1'000'000ULL) {
    // Still note a pool we have not seen, so the next refresh includes it.
    if (pool == nullptr) return;
    for (auto& p : ps.pools)
      if (p.load(std::memory_order_relaxed) == pool) return;
  }
  using default_fn = CUresult (*)(CUmemoryPool*, CUdevice);
  using attr_fn = CUresult (*)(CUmemoryPool, CUmemPool_attribute, void*);
  static auto get_default = reinterpret_cast<default_fn>(hook::driver_symbol("cuDeviceGetDefaultMemPool"));
  static auto get_attr = reinterpret_cast<attr_fn>(hook::driver_symbol("cuMemPoolGetAttribute"));
  if (!get_attr) return;
  std::unique_lock<std::mutex> lk(ps.mu, std::try_to_lock);
  if (!lk.owns_lock()) return;  // another thread is refreshing this device
  if (pool == nullptr && discover && get_default) get_default(&pool, ordinal);
  if (pool) {
    bool known = false;
    for (auto& p : ps.pools)
      if (p.load(std::memory_order_relaxed) == pool) known = true;
    for (int i = 0; !known && i < PoolSet::kMax; ++i) {
      CUmemoryPool empty = nullptr;
      if (ps.pools[i].compare_exchange_strong(empty, pool)) known = true;
    }
  }
  uint64_t total = 0;
  for (auto& p : ps.pools) {
    CUmemoryPool q = p.load(std::memory_order_relaxed);
    cuuint64_t v = 0;
    if (q && get_attr(q, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_SUCCESS) total += v;
  }
  const uint64_t old = ps.reserved.exchange(total, std::memory_order_relaxed);
  ps.refreshed_ns.store(now, std::memory_order_relaxed);
  if (total != old) {
    if (ring::DeviceSlot* d = device(ordinal)) counter_add(d->reserved, total - old);  // wraps for a decrease
  }
}

CUW_COLD void Tracker::pooled_refresh(int ordinal, CUmemoryPool pool, CUstream stream) noexcept {
  // A refresh is due (pooled_alloc). Not inside a stream capture: the allocation is then a graph node.
  using capturing_fn = CUresult (*)(CUstream, CUstreamCaptureStatus*);
  static auto is_capturing = reinterpret_cast<capturing_fn>(hook::driver_symbol("cuStreamIsCapturing"));
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (is_capturing && (is_capturing(stream, &st) != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_NONE)) return;
  refresh_pools(ordinal, pool, true);
}

void Tracker::emit(ring::EventKind kind, ring::Api api, int ordinal, uint64_t address, uint64_t bytes, uint64_t aux,
                   uint32_t result) noexcept {
  emit_at(kind, api, ordinal, address, bytes, aux, result, now_ns());
}

// The process exits (or the library is unloaded): mark it in the ring.
__attribute__((destructor)) static void cuw_on_unload() {
  if (Tracker* t = Tracker::instance_if_created()) t->on_exit();
}

void Tracker::on_exit() noexcept {
  report_unsaid_ooms();
  if (config_.leaks_report) report_leaks();
  live_->sites.log_stats();
  header_->exited_ns.store(fast_clock::realtime_ns_slow(), std::memory_order_relaxed);
  header_->state.store(static_cast<uint32_t>(ring::ProcessState::exited), std::memory_order_release);
  if (!ring_is_file_) return;
  // No daemon reading us: remove the file now rather than leave it in tmpfs. With a daemon
  // attached, it drains the last events and removes the file itself.
  const uint64_t beat = header_->consumer_heartbeat_ns.load(std::memory_order_relaxed);
  if (beat != 0 && fast_clock::realtime_ns_slow() - beat <= 5'000'000'000ULL) return;
  // A daemon that has not reached us yet (a short-lived process) still gets the ring if
  // one is listening: it shows the process as exited and removes the file itself.
  if (daemon_listening()) return;
  live_->segment.unlink();
  ::unlink(ring_path().c_str());
}

std::string Tracker::ring_path() const {
  return config_.run_dir + "/" + paths::ring_file_name(header_->pid, header_->start_time);
}

bool Tracker::daemon_listening() const noexcept {
  if (config_.run_dir.empty()) return false;
  // Only a daemon we may believe counts: another user's impostor on the socket's name would
  // otherwise make every exiting process leave its files for a daemon that never comes.
  const std::string sock = paths::socket_path_for(config_.socket.c_str(), config_.run_dir.c_str());
  sockaddr_un addr{};
  if (sock.size() >= sizeof addr.sun_path || !paths::trusted_socket_dir(sock, nullptr)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0)
    ok = paths::trusted_peer(fd, nullptr);
  else
    ok = errno == EAGAIN;  // a full backlog: a busy daemon, in a directory we trust
  ::close(fd);
  return ok;
}

CUW_COLD backend_base* Tracker::start_backend(call_ref<backend_base*()> make) {
  std::lock_guard<std::mutex> lk(device_mu_);
  if (backend_base* b = backend_.load(std::memory_order_acquire)) return b;
  backend_base* b = make();
  backend_.store(b, std::memory_order_release);
  if (b->pools()) pooling_.store(true, std::memory_order_release);
  return b;
}

CUW_COLD uint64_t Tracker::reclaim() {
  if (!pooling()) return 0;
  backend_base* b = backend();
  return b ? b->release() : 0;
}

CUW_COLD void Tracker::record_segment(int ordinal, uint64_t base, uint64_t bytes, bool added, uint64_t unit) noexcept {
  const uint64_t now = now_ns();
  std::lock_guard<spin_lock> lk(mu_);
  LiveTable& t = live_->pool_segments;
  const uint64_t step = unit ? unit : bytes;
  if (added) {
    for (uint64_t at = 0; at < bytes || (bytes == 0 && at == 0); at += step ? step : 1)
      if (!t.insert(base + at, LiveRecord{step, static_cast<int8_t>(ordinal),
                                          static_cast<uint16_t>(ring::Api::cuMemAlloc), 0, live::make_tag(now, 0)}))
        live_->segment.mark_incomplete();
  } else if (unit) {
    for (uint64_t at = 0; at < bytes; at += unit) t.take(base + at, nullptr);
  } else {
    LiveRecord rec;
    if (t.take(base, &rec) && bytes == 0) bytes = rec.bytes;
  }
  ring::Event e;
  e.time_ns = now;
  e.address = base;
  e.bytes = bytes;
  e.api = static_cast<uint16_t>(ring::Api::cuMemAlloc);
  e.kind = static_cast<uint8_t>(added ? ring::EventKind::segment_alloc : ring::EventKind::segment_free);
  e.device = static_cast<int8_t>(static_cast<unsigned>(ordinal) < ring::kMaxDevices ? ordinal : -1);
  e.used_after = static_cast<unsigned>(ordinal) < ring::kMaxDevices
                     ? header_->devices[ordinal].used.load(std::memory_order_relaxed)
                     : 0;
  push_event(e);
}

void Tracker::count_freed_unseen_locked(uint64_t key, const LiveRecord& rec, ring::Api api, uint64_t now) noexcept {
  if (static_cast<unsigned>(rec.device) >= ring::kMaxDevices) return;  // never inserted so
  ring::DeviceSlot& d = header_->devices[rec.device];
  Ledger::freed(*this, d, key, rec, api, 0, now);
}

}  // namespace cuw::core
