// cuwarden daemon model: the symbolizer (symbolizer.hpp): one offline libdw handle per ELF file,
// every read of a file under the fault guard, a two-generation result cache.
#include "model/symbolizer.hpp"

#include <cxxabi.h>
#include <dwarf.h>
#include <elf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "model/fault_guard.hpp"

namespace cuw::daemon {

namespace {

// ---- where debug info may come from ------------------------------------------------------

// libdw's default path, ":.debug:/usr/lib/debug", also searches the module's own directory
// and its .debug/ subdirectory: places the module's owner controls, where a FIFO would block
// the daemon's open() for good. An absolute entry only: /usr/lib/debug/<module's dir>/<link>.
char g_debuginfo_dir[] = "/usr/lib/debug";
char* g_debuginfo_path = g_debuginfo_dir;

bool debuginfod_configured() {
  static const bool set = [] {
    const char* urls = std::getenv("DEBUGINFOD_URLS");
    return urls != nullptr && *urls != '\0';
  }();
  return set;
}

/// libdw's find_debuginfo callback: the standard search, restricted to root's debug tree and
/// the local disk.
int find_debuginfo(Dwfl_Module* mod, void** userdata, const char* modname, Dwarf_Addr base,
                   const char* file_name, const char* debuglink_file, GElf_Word debuglink_crc,
                   char** debuginfo_file_name) {
  // /usr/lib/debug/.build-id/xx/yyyy.debug first: named by hex digits only, and where
  // Debian's -dbgsym packages (and dwz's shared .dwz files) put theirs.
  const int fd = dwfl_build_id_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file,
                                              debuglink_crc, debuginfo_file_name);
  if (fd >= 0) return fd;
  // When DEBUGINFOD_URLS is set, the standard search ends with a debuginfod server: seconds of
  // network inside resolve(), with the symbolizer's lock held. Local files only, then.
  if (debuginfod_configured()) return -1;
  // The debuglink is a name the module's owner wrote: with "..", /usr/lib/debug/<dir>/<link>
  // could lead anywhere. Without it libdw tries <basename>.debug under the same tree.
  if (debuglink_file != nullptr && std::strstr(debuglink_file, "..") != nullptr) debuglink_file = nullptr;
  return dwfl_standard_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file,
                                      debuglink_crc, debuginfo_file_name);
}

const Dwfl_Callbacks kCallbacks = {
    // Never called: dwfl_report_elf hands libdw the module's file itself.
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &g_debuginfo_path,
};

// ---- what a lookup copies out of libdw, without allocating ---------------------------------

// Strings libdw returns point into the mapped file (.debug_str, .strtab), which its owner may
// truncate: they are copied while the fault guard is up, into storage made beforehand, so that
// nothing of ours allocates under the guard (libdw itself does, but a fault comes from a read
// of the mapped file, never from inside malloc). Longer names are cut (a cut mangled name is
// shown as is: the demangler refuses it).
constexpr std::size_t kMaxName = 4096;
constexpr std::size_t kTextBytes = Symbolizer::kMaxInlineFrames * 2 * 1024 + 2 * kMaxName;

struct RawFrame {
  uint32_t function = 0, function_len = 0;  // into RawFrames::text
  uint32_t file = 0, file_len = 0;
  uint32_t line = 0;
};

struct RawFrames {
  std::array<RawFrame, Symbolizer::kMaxInlineFrames> frames{};
  std::size_t count = 0;
  std::array<char, kTextBytes> text{};
  std::size_t used = 0;

  void copy(const char* s, uint32_t& at, uint32_t& len) noexcept {
    at = static_cast<uint32_t>(used);
    len = 0;
    if (s == nullptr) return;
    const std::size_t n = strnlen(s, std::min(kMaxName, text.size() - used));
    std::memcpy(text.data() + used, s, n);
    used += n;
    len = static_cast<uint32_t>(n);
  }
  void add(const char* function, const char* file, int line) noexcept {
    if (count == frames.size()) return;
    RawFrame& f = frames[count++];
    copy(function, f.function, f.function_len);
    copy(file, f.file, f.file_len);
    f.line = line > 0 ? static_cast<uint32_t>(line) : 0;
  }
  std::string_view str(uint32_t at, uint32_t len) const { return {text.data() + at, len}; }
};

/// A DIE's name for people: a C++ linkage name (demangled later: qualified, with parameters),
/// else DW_AT_name; looked up through DW_AT_abstract_origin and DW_AT_specification. Other
/// linkage names are asm labels, like glibc's "__GI_qsort" for qsort: DW_AT_name is the
/// name in the source.
const char* die_name(Dwarf_Die* die) noexcept {
  Dwarf_Attribute attr;
  const char* linkage = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_linkage_name, &attr));
  if (linkage == nullptr) linkage = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr));
  if (linkage != nullptr && linkage[0] == '_' && linkage[1] == 'Z') return linkage;
  const char* name = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_name, &attr));
  return name != nullptr ? name : linkage;
}

/// Where an inlined call was made: its DW_AT_call_file (an index into its unit's file table).
const char* call_file(Dwarf_Die* inlined) noexcept {
  Dwarf_Attribute attr;
  Dwarf_Word index = 0;
  if (dwarf_formudata(dwarf_attr(inlined, DW_AT_call_file, &attr), &index) != 0) return nullptr;
  Dwarf_Die cu;
  Dwarf_Files* files = nullptr;
  std::size_t nfiles = 0;
  if (dwarf_diecu(inlined, &cu, nullptr, nullptr) == nullptr || dwarf_getsrcfiles(&cu, &files, &nfiles) != 0 ||
      index >= nfiles)
    return nullptr;
  return dwarf_filesrc(files, index, nullptr, nullptr);
}

int call_line(Dwarf_Die* inlined) noexcept {
  Dwarf_Attribute attr;
  Dwarf_Word line = 0;
  if (dwarf_formudata(dwarf_attr(inlined, DW_AT_call_line, &attr), &line) != 0) return 0;
  return line > 0x7fffffff ? 0 : static_cast<int>(line);
}

constexpr std::size_t kMaxScopeDepth = 64;

/// Scopes that can hold code, the only DIEs worth a look at their address ranges.
bool is_code_scope(int tag) noexcept {
  switch (tag) {
    case DW_TAG_subprogram:
    case DW_TAG_inlined_subroutine:
    case DW_TAG_entry_point:
    case DW_TAG_lexical_block:
    case DW_TAG_try_block:
    case DW_TAG_catch_block:
    case DW_TAG_with_stmt:
      return true;
    default:
      return false;
  }
}

/// The chain of scopes containing `addr` in the unit, outermost first; returns its length.
/// One descent: at each level the children are scanned for the code scope that contains
/// addr, and only that one is entered. dwarf_getscopes visits about the same DIEs but follows
/// an inlined instance into its abstract definition rather than to its caller, which is why
/// eu-addr2line -i adds dwarf_getscopes_die, a walk of the whole unit. That pair cost 16 ms
/// per new pc in this repository's test program (a unit that includes Catch2), this 0.27 ms.
/// Like dwarf_getscopes, it does not enter namespaces: GCC puts every function definition at
/// the unit's top level; clang's definitions inside a namespace are then named by their ELF
/// symbol, with the line table's file:line but without their inlined frames.
std::size_t scopes_at(Dwarf_Die* cudie, Dwarf_Addr addr, std::array<Dwarf_Die, kMaxScopeDepth>& chain) noexcept {
  std::size_t depth = 0;
  Dwarf_Die parent = *cudie;
  while (depth < chain.size()) {
    Dwarf_Die child;
    if (dwarf_child(&parent, &child) != 0) break;
    bool found = false;
    for (;;) {
      found = is_code_scope(dwarf_tag(&child)) && dwarf_haspc(&child, addr) > 0;
      const auto* at = static_cast<const char*>(child.addr);
      // A hostile DW_AT_sibling could point backwards: every step must move forward.
      if (found || dwarf_siblingof(&child, &child) != 0 || static_cast<const char*>(child.addr) <= at) break;
    }
    if (!found) break;
    chain[depth++] = child;
    parent = child;
  }
  return depth;
}

/// The frames at `addr` (an address in the file's own layout), innermost first, into `raw`.
/// Runs under the fault guard: libdw reads the mapped file.
void lookup(Dwfl_Module* mod, Dwarf_Addr addr, RawFrames& raw) noexcept {
  raw.count = 0;
  raw.used = 0;
  GElf_Off sym_offset = 0;
  GElf_Sym sym;
  // The ELF symbol names the outermost frame when DWARF does not (no DWARF, or a subprogram
  // without a name); .symtab when present (also from a separate debug file), else .dynsym.
  const char* elf_name = dwfl_module_addrinfo(mod, addr, &sym_offset, &sym, nullptr, nullptr, nullptr);

  const char* file = nullptr;
  int line = 0;
  if (Dwfl_Line* l = dwfl_module_getsrc(mod, addr)) {
    Dwarf_Addr line_addr = 0;
    int column = 0;
    Dwarf_Word mtime = 0, length = 0;
    file = dwfl_lineinfo(l, &line_addr, &line, &column, &mtime, &length);
    if (file == nullptr) line = 0;
  }

  Dwarf_Addr bias = 0;
  if (Dwarf_Die* cudie = dwfl_module_addrdie(mod, addr, &bias)) {
    std::array<Dwarf_Die, kMaxScopeDepth> chain;
    const std::size_t depth = scopes_at(cudie, addr - bias, chain);
    for (std::size_t i = depth; i-- > 0;) {
      Dwarf_Die* die = &chain[i];
      const int tag = dwarf_tag(die);
      if (tag != DW_TAG_inlined_subroutine && tag != DW_TAG_subprogram && tag != DW_TAG_entry_point) continue;
      const bool outermost = tag != DW_TAG_inlined_subroutine;
      const char* name = die_name(die);
      raw.add(name == nullptr && outermost ? elf_name : name, file, line);
      if (outermost) break;
      // The frame that contains this inlined body is at the line of the inlined call.
      file = call_file(die);
      line = call_line(die);
    }
  }
  if (raw.count == 0) raw.add(elf_name, file, line);
}

std::string demangle(std::string_view name) {
  std::string s(name);
  if (s.size() < 2 || s[0] != '_' || s[1] != 'Z') return s;  // C names, DW_AT_name
  int status = 0;
  char* out = abi::__cxa_demangle(s.c_str(), nullptr, nullptr, &status);
  if (out == nullptr) return s;
  std::string demangled(out);
  std::free(out);
  return demangled;
}

bool same_build_id(std::string_view recorded, const unsigned char* bits, int len) {
  if (len <= 0 || recorded.size() != static_cast<std::size_t>(len) * 2) return false;
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < len; ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'F' ? static_cast<char>(c - 'A' + 'a') : c; };
    if (lower(recorded[2 * i]) != kHex[bits[i] >> 4] || lower(recorded[2 * i + 1]) != kHex[bits[i] & 15]) return false;
  }
  return true;
}

/// Keeps a handle abandoned after a fault reachable for good: nothing may free it (its state
/// is whatever the fault left), and LeakSanitizer would report what hangs off it. One per
/// fault; faults come from files truncated while open, which only their owner can do.
void keep_abandoned(Dwfl* dwfl) {
  static std::mutex mu;
  static auto* kept = new std::vector<Dwfl*>;
  std::lock_guard lock(mu);
  kept->push_back(dwfl);
}

// ---- caches --------------------------------------------------------------------------------

struct FileKey {
  std::string path, build_id;
};
struct FileKeyView {
  std::string_view path, build_id;
};
struct FileKeyHash {
  using is_transparent = void;
  std::size_t operator()(const FileKeyView& k) const noexcept {
    const std::size_t h = std::hash<std::string_view>{}(k.path);
    return h ^ (std::hash<std::string_view>{}(k.build_id) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  }
  std::size_t operator()(const FileKey& k) const noexcept { return (*this)(FileKeyView{k.path, k.build_id}); }
};
struct FileKeyEq {
  using is_transparent = void;
  static FileKeyView v(const FileKey& k) noexcept { return {k.path, k.build_id}; }
  static FileKeyView v(const FileKeyView& k) noexcept { return k; }
  template <class A, class B>
  bool operator()(const A& a, const B& b) const noexcept {
    return v(a).path == v(b).path && v(a).build_id == v(b).build_id;
  }
};

enum class FileState : uint8_t { unopened, open, unusable };

struct FileEntry {
  uint64_t serial = 0;    // names this entry's results in the result cache
  uint64_t last_use = 0;  // LRU tick
  FileState state = FileState::unopened;
  Dwfl* dwfl = nullptr;
  Dwfl_Module* module = nullptr;
  int fd = -1;            // the module's file, owned by dwfl (closed by dwfl_end)
};

struct ResultKey {
  uint64_t serial = 0, offset = 0;
  bool return_address = false;
  bool operator==(const ResultKey&) const = default;
};
struct ResultKeyHash {
  std::size_t operator()(const ResultKey& k) const noexcept {
    uint64_t h = k.serial * 0x9e3779b97f4a7c15ULL ^ (k.offset + (k.return_address ? 0x632be59bd9b4e019ULL : 0));
    h ^= h >> 31;
    return static_cast<std::size_t>(h * 0xbf58476d1ce4e5b9ULL);
  }
};

struct CachedFrame {
  std::string function, file;
  uint32_t line = 0;
};
using CachedFrames = std::vector<CachedFrame>;  // empty: module + offset only

}  // namespace

struct Symbolizer::Impl {
  mutable std::mutex mu;
  SymbolizerStats stats;
  uint64_t tick = 0, next_serial = 1;
  std::size_t open_files = 0;
  std::unordered_map<FileKey, FileEntry, FileKeyHash, FileKeyEq> files;
  std::unordered_map<ResultKey, CachedFrames, ResultKeyHash> results, older_results;
  std::unique_ptr<RawFrames> raw = std::make_unique<RawFrames>();

  ~Impl() {
    for (auto& [key, e] : files) close(e);
  }

  FileEntry& entry(const ModuleInfo& m) {
    const auto it = files.find(FileKeyView{m.path, m.build_id});
    if (it != files.end()) {
      it->second.last_use = ++tick;
      return it->second;
    }
    if (files.size() >= kMaxModules) {
      auto victim = files.begin();
      for (auto i = files.begin(); i != files.end(); ++i)
        if (i->second.last_use < victim->second.last_use) victim = i;
      close(victim->second);
      files.erase(victim);  // its results age out of the result cache with their generation
    }
    FileEntry& e = files[FileKey{m.path, m.build_id}];
    e.serial = next_serial++;
    e.last_use = ++tick;
    return e;
  }

  void close(FileEntry& e) {
    if (e.state != FileState::open) return;
    Dwfl* dwfl = e.dwfl;
    auto end = [dwfl] { dwfl_end(dwfl); };
    guarded_call(end);  // unmapping touches no page, but libdw's teardown is not ours to vouch for
    e.dwfl = nullptr;
    e.module = nullptr;
    e.fd = -1;
    e.state = FileState::unopened;
    --open_files;
  }

  /// A fault while libdw read e's file: its handle may be half-updated, so it is abandoned
  /// (a leak of libdw's heap for this file) rather than ended; the file descriptor, which
  /// libdw will now never touch again, is closed.
  void abandon(FileEntry& e) {
    ++stats.faults;
    if (e.state == FileState::open) --open_files;
    if (e.dwfl != nullptr) keep_abandoned(e.dwfl);
    if (e.fd >= 0) ::close(e.fd);
    e.dwfl = nullptr;
    e.module = nullptr;
    e.fd = -1;
    e.state = FileState::unusable;
  }

  void open(FileEntry& e, const ModuleInfo& m) {
    e.state = FileState::unusable;  // until proven otherwise; remembered while the entry lives
    if (m.path.empty() || m.path[0] != '/') {  // "linux-vdso.so.1", or a name relative to nothing
      ++stats.files_refused;
      return;
    }
    // A module is named by the path its loader used, often a soname link
    // (libstdc++.so.6 -> libstdc++.so.6.0.30): the link is resolved first, with the rights of
    // whoever runs this (in the daemon, a worker holding only the process owner's rights:
    // symbolize_worker.hpp), and only a regular file is opened, so a FIFO or a device is never
    // opened at all. O_NOFOLLOW: a link put in the file's place after that check is refused;
    // O_NONBLOCK and O_NOCTTY: whatever replaces it between the check and the open neither
    // blocks open() nor becomes a terminal; the fstat below checks what was opened.
    char real[PATH_MAX];
    struct stat st{};
    if (::realpath(m.path.c_str(), real) == nullptr || ::lstat(real, &st) != 0 || !S_ISREG(st.st_mode)) {
      ++stats.files_refused;
      return;
    }
    const int fd = ::open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
      ++stats.files_refused;
      return;
    }
    unsigned char magic[SELFMAG];
    // Only ELF files: libdw would also unpack a gzip/xz/bzip2 image, as large as it says.
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || pread(fd, magic, SELFMAG, 0) != SELFMAG ||
        std::memcmp(magic, ELFMAG, SELFMAG) != 0) {
      ::close(fd);
      ++stats.files_refused;
      return;
    }
    if (open_files >= kMaxOpenFiles) {
      FileEntry* victim = nullptr;
      for (auto& [key, other] : files)
        if (other.state == FileState::open && &other != &e && (victim == nullptr || other.last_use < victim->last_use))
          victim = &other;
      if (victim != nullptr) {
        close(*victim);
        ++stats.evictions;
      }
    }

    struct Job {
      const char* path;
      int fd;
      Dwfl* dwfl = nullptr;
      Dwfl_Module* module = nullptr;
      bool fd_taken = false;
      int id_len = 0;
      unsigned char id[64] = {};
    } job{m.path.c_str(), fd};
    auto report = [&job] {
      job.dwfl = dwfl_begin(&kCallbacks);
      if (job.dwfl == nullptr) return;
      dwfl_report_begin(job.dwfl);
      // At base 0 the module's addresses are the file's own (pc - bias), so one handle
      // serves every process that loaded the file, wherever it was loaded.
      job.module = dwfl_report_elf(job.dwfl, job.path, job.path, job.fd, 0, false);
      job.fd_taken = job.module != nullptr;  // on success dwfl_end closes it; on failure we do
      dwfl_report_end(job.dwfl, nullptr, nullptr);
      if (job.module == nullptr) return;
      const unsigned char* bits = nullptr;
      GElf_Addr vaddr = 0;
      const int n = dwfl_module_build_id(job.module, &bits, &vaddr);
      if (n > 0 && bits != nullptr) {
        job.id_len = std::min(n, static_cast<int>(sizeof job.id));
        std::memcpy(job.id, bits, static_cast<std::size_t>(job.id_len));
      }
    };
    const bool ok = guarded_call(report);
    if (!ok) {  // the file changed under libdw's mapping while it read the headers
      e.dwfl = job.dwfl;
      e.fd = fd;
      e.state = FileState::open;  // so that abandon() accounts for it
      ++open_files;
      abandon(e);
      return;
    }
    if (job.module == nullptr) {
      if (!job.fd_taken) ::close(fd);
      if (job.dwfl != nullptr) {
        Dwfl* dwfl = job.dwfl;
        auto end = [dwfl] { dwfl_end(dwfl); };
        guarded_call(end);
      }
      ++stats.files_refused;
      return;
    }
    ++stats.files_opened;
    e.dwfl = job.dwfl;
    e.module = job.module;
    e.fd = fd;
    e.state = FileState::open;
    ++open_files;
    // A recorded build-id that the file lacks or contradicts: the file on disk is not what
    // the process loaded (rebuilt, upgraded), and its symbols would name the wrong code.
    if (!m.build_id.empty() && !same_build_id(m.build_id, job.id, job.id_len)) {
      ++stats.build_id_mismatches;
      close(e);
      e.state = FileState::unusable;
    }
  }

  const CachedFrames* find_result(const ResultKey& key) {
    if (const auto it = results.find(key); it != results.end()) return &it->second;
    const auto old = older_results.find(key);
    if (old == older_results.end()) return nullptr;
    CachedFrames frames = std::move(old->second);
    older_results.erase(old);
    return &store(key, std::move(frames));
  }

  const CachedFrames& store(const ResultKey& key, CachedFrames frames) {
    if (results.size() >= kResultsPerGeneration) {
      older_results = std::move(results);
      results = {};
    }
    return results.insert_or_assign(key, std::move(frames)).first->second;
  }

  CachedFrames cook(const RawFrames& r) const {
    CachedFrames out;
    out.reserve(r.count);
    for (std::size_t i = 0; i < r.count; ++i) {
      const RawFrame& f = r.frames[i];
      out.push_back({demangle(r.str(f.function, f.function_len)), std::string(r.str(f.file, f.file_len)), f.line});
    }
    // Nothing known at all: cache as "module + offset only".
    if (out.size() == 1 && out[0].function.empty() && out[0].file.empty()) out.clear();
    return out;
  }
};

Symbolizer::Symbolizer() : impl_(std::make_unique<Impl>()) {}
Symbolizer::~Symbolizer() = default;

SymbolizerStats Symbolizer::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

std::vector<SnapFrame> Symbolizer::resolve(const std::vector<ModuleInfo>& modules, uint64_t pc,
                                           bool return_address) {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  ++s.stats.resolves;
  SnapFrame base;
  base.pc = pc;
  const ModuleInfo* m = nullptr;
  for (const ModuleInfo& candidate : modules)
    if (pc >= candidate.start && pc < candidate.end) {
      m = &candidate;
      break;
    }
  if (m == nullptr) return {base};
  base.module = m->path;
  if (pc < m->bias) return {base};  // a bias past its own range: hostile or broken, nothing to look up
  base.offset = pc - m->bias;

  FileEntry& e = s.entry(*m);
  const ResultKey key{e.serial, base.offset, return_address};
  const CachedFrames* frames = s.find_result(key);
  if (frames != nullptr) {
    ++s.stats.cache_hits;
  } else {
    if (e.state == FileState::unopened) s.open(e, *m);
    if (e.state != FileState::open) return {base};  // not cached: costs a hash lookup only
    // The call instruction ends just before a return address, possibly in another line or,
    // after a call that does not return, in another function.
    const Dwarf_Addr addr = return_address && base.offset > 0 ? base.offset - 1 : base.offset;
    RawFrames& raw = *s.raw;
    Dwfl_Module* module = e.module;
    auto find = [module, addr, &raw] { lookup(module, addr, raw); };
    if (!guarded_call(find)) {
      s.abandon(e);
      return {base};
    }
    frames = &s.store(key, s.cook(raw));
  }
  if (frames->empty()) return {base};
  std::vector<SnapFrame> out(frames->size(), base);
  for (std::size_t i = 0; i < frames->size(); ++i) {
    out[i].function = (*frames)[i].function;
    out[i].file = (*frames)[i].file;
    out[i].line = (*frames)[i].line;
  }
  return out;
}

}  // namespace cuw::daemon
