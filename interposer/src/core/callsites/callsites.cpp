// cuwarden interposer core: call sites (callsites.hpp).
#include "core/callsites/callsites.hpp"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/log.hpp"
#include "core/callsites/pyframes.hpp"
#include "core/callsites/unwind.hpp"

namespace cuw::core {

namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

/// The PT_LOAD extent and GNU build-id of one loaded object.
struct Found {
  uint64_t start = ~0ULL, end = 0, bias = 0;
  char build_id[48] = {};
  char path[4096] = {};
};

void read_build_id(const dl_phdr_info* info, const ElfW(Phdr) & ph, char* out, std::size_t cap) {
  const auto* p = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
  const unsigned char* end = p + ph.p_memsz;
  while (p + sizeof(ElfW(Nhdr)) <= end) {
    ElfW(Nhdr) n;
    std::memcpy(&n, p, sizeof n);
    const unsigned char* name = p + sizeof n;
    const unsigned char* desc = name + ((n.n_namesz + 3) & ~3u);
    const unsigned char* next = desc + ((n.n_descsz + 3) & ~3u);
    if (next > end || next <= p) return;
    if (n.n_type == NT_GNU_BUILD_ID && n.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
      std::size_t o = 0;
      for (uint32_t i = 0; i < n.n_descsz && o + 3 <= cap; ++i) o += std::snprintf(out + o, cap - o, "%02x", desc[i]);
      return;
    }
    p = next;
  }
}

/// Every loaded object containing one of the wanted pcs that is not already known.
struct Scan {
  const uint64_t* pcs;
  int n;
  const std::vector<std::pair<uint64_t, uint64_t>>* known;
  std::vector<Found>* out;
};

int scan_one(dl_phdr_info* info, size_t, void* arg) {
  auto* s = static_cast<Scan*>(arg);
  Found f;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    f.start = std::min<uint64_t>(f.start, info->dlpi_addr + ph.p_vaddr);
    f.end = std::max<uint64_t>(f.end, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
  }
  if (f.end <= f.start) return 0;
  bool wanted = false;
  for (int i = 0; i < s->n && !wanted; ++i) wanted = s->pcs[i] >= f.start && s->pcs[i] < f.end;
  if (!wanted) return 0;
  for (const auto& k : *s->known)
    if (k.first == f.start) return 0;
  f.bias = info->dlpi_addr;
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_NOTE && !f.build_id[0])
      read_build_id(info, info->dlpi_phdr[i], f.build_id, sizeof f.build_id);
  const char* name = info->dlpi_name;
  if (name && name[0] == '/') {
    std::snprintf(f.path, sizeof f.path, "%s", name);
  } else if (!name || !name[0]) {  // the main program
    const ssize_t len = ::readlink("/proc/self/exe", f.path, sizeof f.path - 1);
    f.path[len > 0 ? len : 0] = '\0';
  } else {
    std::snprintf(f.path, sizeof f.path, "%s", name);  // the vDSO: no file
  }
  s->out->push_back(f);
  return 0;
}

uintptr_t text_of_this_library(uintptr_t* hi) {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&text_of_this_library), &info) || !info.dli_fbase) return 0;
  struct Arg {
    uintptr_t base, lo = ~uintptr_t{0}, hi = 0;
  } a{reinterpret_cast<uintptr_t>(info.dli_fbase)};
  dl_iterate_phdr(
      [](dl_phdr_info* i, size_t, void* p) {
        auto* arg = static_cast<Arg*>(p);
        bool ours = false;
        for (int k = 0; k < i->dlpi_phnum; ++k)
          if (i->dlpi_phdr[k].p_type == PT_LOAD && i->dlpi_addr + i->dlpi_phdr[k].p_vaddr == arg->base) ours = true;
        if (!ours && i->dlpi_addr != arg->base) return 0;
        for (int k = 0; k < i->dlpi_phnum; ++k) {
          const ElfW(Phdr)& ph = i->dlpi_phdr[k];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
          arg->lo = std::min<uintptr_t>(arg->lo, i->dlpi_addr + ph.p_vaddr);
          arg->hi = std::max<uintptr_t>(arg->hi, i->dlpi_addr + ph.p_vaddr + ph.p_memsz);
        }
        return 1;
      },
      &a);
  *hi = a.hi;
  return a.hi ? a.lo : 0;
}

}  // namespace

void CallSites::init(LiveSegment* segment, int native, bool python) noexcept {
  segment_ = segment;
  own_lo_ = text_of_this_library(&own_hi_);
  try {
    index_.assign(1024, Entry{});
    stacks_.reserve(1024);
  } catch (...) {
    return;
  }
  // The first backtrace() loads libgcc_s (dlopen, malloc), and a thread's first walk looks its
  // stack up (pthread_getattr_np, which allocates): done here, at the first CUDA call, rather
  // than inside some later allocation, for this thread and the main one.
  void* warm[4];
  (void)backtrace(warm, 4);
  unwind::prepare();
  python_ = python && pyframes::available();
  native_ = std::clamp(native, 1, kMaxNative);
}

uint32_t CallSites::capture() noexcept {
  if (native_ <= 0) return 0;
  // Our own frames (the hook, SiteScope, this function: three, whatever inlining did) come
  // first and are skipped below; the unwind's cost grows with every frame asked for, so ask
  // for just those more.
  void* raw[kMaxNative + kOwnFrames];
  int got = unwind::walk(raw, native_ + kOwnFrames);
  if (__builtin_expect(got == unwind::kFallback, 0)) got = backtrace(raw, native_ + kOwnFrames);
  uint64_t frames[kMaxNative + kMaxPython];
  // Up to the last of our frames among the first few: a runtime that intercepts
  // backtrace() itself (a sanitizer's) puts its own frame on top of ours.
  int native = 0, skip = 0;
  for (int i = 0; i < got && i < kOwnFrames + 2; ++i)
    if (reinterpret_cast<uintptr_t>(raw[i]) >= own_lo_ && reinterpret_cast<uintptr_t>(raw[i]) < own_hi_) skip = i + 1;
  for (int i = skip; i < got && native < native_; ++i) frames[native++] = reinterpret_cast<uint64_t>(raw[i]);
  int python = 0;
  if (python_) {
    pyframes::Frame py[kMaxPython];
    python = pyframes::capture(py, kMaxPython);
    for (int i = 0; i < python; ++i) frames[native + i] = uint64_t{py[i].code} << 32 | py[i].line;
  }
  const int n = native + python;
  uint64_t h = 0xcbf29ce484222325ULL ^ static_cast<uint64_t>(native);
  for (int i = 0; i < n; ++i) h = mix(h, frames[i]);
  if (h == 0) h = 1;
  std::lock_guard<std::mutex> g(mu_);
  if (index_.empty()) return 0;  // init() found no memory
  const std::size_t mask = index_.size() - 1;
  for (std::size_t i = h & mask;; i = (i + 1) & mask) {
    const Entry& e = index_[i];
    if (e.id == 0) break;
    if (e.hash != h) continue;
    const std::vector<uint64_t>& s = stacks_[e.id - 1];
    if (native_counts_[e.id - 1] == native && s.size() == static_cast<std::size_t>(n) &&
        std::equal(s.begin(), s.end(), frames))
      return e.id;
  }
  return store_locked(frames, native, python, h);
}

uint32_t CallSites::store_locked(const uint64_t* frames, int native, int python, uint64_t hash) noexcept {
  const int n = native + python;
  try {
    if ((count_ + 1) * 2 > index_.size()) {  // keep the index at most half full
      std::vector<Entry> bigger(index_.size() * 2);
      for (const Entry& e : index_) {
        if (e.id == 0) continue;
        std::size_t j = e.hash & (bigger.size() - 1);
        while (bigger[j].id != 0) j = (j + 1) & (bigger.size() - 1);
        bigger[j] = e;
      }
      index_.swap(bigger);
    }
    stacks_.emplace_back(frames, frames + n);
    native_counts_.push_back(static_cast<uint16_t>(native));
  } catch (...) {
    if (segment_) segment_->mark_incomplete();
    return 0;
  }
  const uint32_t id = ++count_;
  std::size_t j = hash & (index_.size() - 1);
  while (index_[j].id != 0) j = (j + 1) & (index_.size() - 1);
  index_[j] = Entry{hash, id};
  if (segment_) {
    note_modules_locked(frames, native);
    if (python) publish_codes_locked();
    alignas(8) unsigned char rec[sizeof(live::SiteRecord) + 8 * (kMaxNative + kMaxPython)];
    live::SiteRecord head{static_cast<uint32_t>(sizeof(live::SiteRecord) + 8 * n), id, static_cast<uint16_t>(native),
                          static_cast<uint16_t>(python), static_cast<uint32_t>(hash)};
    std::memcpy(rec, &head, sizeof head);
    std::memcpy(rec + sizeof head, frames, 8 * static_cast<std::size_t>(n));
    segment_->append(live::Log::sites, rec, head.size);
  }
  return id;
}

void CallSites::note_modules_locked(const uint64_t* pcs, int n) noexcept {
  uint64_t missing[kMaxNative];
  int m = 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t pc = pcs[i];
    auto it = std::upper_bound(modules_.begin(), modules_.end(), std::make_pair(pc, ~uint64_t{0}));
    const bool known = it != modules_.begin() && pc < std::prev(it)->second;
    if (!known) missing[m++] = pc;
  }
  if (m == 0) return;
  std::vector<Found> found;
  try {
    Scan s{missing, m, &modules_, &found};
    dl_iterate_phdr(scan_one, &s);
    for (const Found& f : found) {
      const std::size_t path_len = strnlen(f.path, sizeof f.path);
      const std::size_t padded = (path_len + 7) & ~std::size_t{7};
      std::vector<unsigned char> rec(sizeof(live::ModuleRecord) + padded, 0);
      live::ModuleRecord head{};
      head.size = static_cast<uint32_t>(rec.size());
      head.path_len = static_cast<uint32_t>(path_len);
      head.start = f.start;
      head.end = f.end;
      head.bias = f.bias;
      std::memcpy(head.build_id, f.build_id, sizeof head.build_id);
      std::memcpy(rec.data(), &head, sizeof head);
      std::memcpy(rec.data() + sizeof head, f.path, path_len);
      segment_->append(live::Log::modules, rec.data(), rec.size());
      modules_.insert(std::upper_bound(modules_.begin(), modules_.end(), std::make_pair(f.start, f.end)),
                      std::make_pair(f.start, f.end));
    }
  } catch (...) {
    segment_->mark_incomplete();
  }
}

void CallSites::publish_codes_locked() noexcept {
  const uint32_t count = pyframes::count();
  for (; codes_published_ < count; ++codes_published_) {
    const pyframes::Code* c = pyframes::code(codes_published_);
    if (!c) continue;
    const std::size_t fl = std::min<std::size_t>(std::strlen(c->file), 4096);
    const std::size_t nl = std::min<std::size_t>(std::strlen(c->function), 1024);
    const std::size_t padded = (fl + nl + 7) & ~std::size_t{7};
    unsigned char rec[sizeof(live::CodeRecord) + 4096 + 1024 + 8] = {};
    live::CodeRecord head{static_cast<uint32_t>(sizeof head + padded), codes_published_, c->first_line,
                          static_cast<uint16_t>(fl), static_cast<uint16_t>(nl)};
    std::memcpy(rec, &head, sizeof head);
    std::memcpy(rec + sizeof head, c->file, fl);
    std::memcpy(rec + sizeof head + fl, c->function, nl);
    segment_->append(live::Log::codes, rec, head.size);
  }
}

void CallSites::log_stats() const noexcept {
  // At exit, where another thread may still hold the table's lock: not taken for nothing.
  if (native_ <= 0 || !log::debug_enabled()) return;
  uint32_t stored = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    stored = count_;
  }
  const unwind::Stats s = unwind::stats();
  using ull = unsigned long long;
  log::debug("cuwarden: call sites: %u stored; %llu return addresses looked up in .eh_frame, rule table emptied "
             "%llu times by an unload and %llu full, %llu rules not kept (%llu no free slot, %llu lock busy); walks "
             "left to backtrace(): %llu by a frame's rule, %llu by code outside every object, %llu by another stack, "
             "%llu by a thread's stack not found, %llu by a frame leaving the stack; %llu walks ended before the "
             "outermost frame (at code without unwind info or a return address that cannot be read)",
             stored, static_cast<ull>(s.cold), static_cast<ull>(s.invalidations), static_cast<ull>(s.resets),
             static_cast<ull>(s.not_stored_probes + s.not_stored_busy), static_cast<ull>(s.not_stored_probes),
             static_cast<ull>(s.not_stored_busy), static_cast<ull>(s.fallback_rule),
             static_cast<ull>(s.fallback_code), static_cast<ull>(s.fallback_stack),
             static_cast<ull>(s.fallback_bounds), static_cast<ull>(s.fallback_frame),
             static_cast<ull>(s.ended_early));
}

bool CallSites::frames(uint32_t id, std::vector<uint64_t>* native, std::vector<uint64_t>* python) const {
  std::lock_guard<std::mutex> g(mu_);
  if (id == 0 || id > count_) return false;
  const std::vector<uint64_t>& s = stacks_[id - 1];
  const uint16_t n = native_counts_[id - 1];
  native->assign(s.begin(), s.begin() + n);
  python->assign(s.begin() + n, s.end());
  return true;
}

std::vector<frames::Frame> CallSites::present(uint32_t id) const {
  std::vector<uint64_t> native, python;
  std::vector<frames::Frame> out;
  if (!frames(id, &native, &python)) return out;
  const frames::Rules& rules = frames::Rules::builtin();
  char buf[512];
  for (uint64_t pc : native) {
    frames::Frame f;
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(pc - 1), &info)) {
      std::snprintf(buf, sizeof buf, "0x%" PRIx64, pc);
      f.text = buf;
      out.push_back(std::move(f));
      continue;
    }
    const std::string path = info.dli_fname ? info.dli_fname : "";
    f.where = frames::where_of(false, path);
    f.cls = rules.native(path);
    if (info.dli_sname) {
      int status = -1;
      char* plain = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
      f.function = status == 0 && plain ? plain : info.dli_sname;
      std::free(plain);
      std::snprintf(buf, sizeof buf, "+0x%" PRIxPTR " (", static_cast<uintptr_t>(pc - reinterpret_cast<uintptr_t>(info.dli_saddr)));
      f.text = f.function + buf + f.where + ")";
    } else {
      std::snprintf(buf, sizeof buf, "+0x%" PRIxPTR ")", static_cast<uintptr_t>(pc - reinterpret_cast<uintptr_t>(info.dli_fbase)));
      f.text = "?? (" + f.where + buf;
    }
    out.push_back(std::move(f));
  }
  for (uint64_t py : python) {
    frames::Frame f;
    f.python = true;
    const pyframes::Code* c = pyframes::code(static_cast<uint32_t>(py >> 32));
    const std::string file = c ? c->file : "?";
    f.function = c ? c->function : "?";
    f.cls = rules.python(file);
    f.where = frames::where_of(true, file);
    f.text = f.function + " (" + file + ":" + std::to_string(py & 0xffffffffU) + ")";
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace cuw::core
