// Unit tests for the daemon's symbolizer (daemon/src/model/symbolizer.cpp): return addresses of
// this very program (built with -g) to function and file:line, inlined calls expanded, ELF
// symbols of a library without debug info, and the files it must not trust or cannot read
// (wrong build-id, deleted, truncated under libdw's mapping, a FIFO). Prints what a resolve
// costs, cold and cached.
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <malloc.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/fault_guard.hpp"
#include "model/symbolize_worker.hpp"
#include "model/symbolizer.hpp"

using cuw::daemon::ModuleInfo;
using cuw::daemon::SnapFrame;
using cuw::daemon::Symbolizer;

namespace cuw_symtest {

// The call sites under test. noinline, and work after each call, so that the calls stay calls
// (no inlining, no tail call) at every optimisation level of the presets.
[[gnu::noinline]] uint64_t caller_pc() {
  const auto pc = reinterpret_cast<uint64_t>(__builtin_extract_return_addr(__builtin_return_address(0)));
  asm volatile("" ::: "memory");
  return pc;
}

[[gnu::noinline]] uint64_t direct_call(int* line) {
  *line = __LINE__; const uint64_t pc = caller_pc();  // the call under test: one line
  asm volatile("" ::: "memory");
  return pc;
}

[[gnu::always_inline]] inline uint64_t inlined_helper(int* line) {
  *line = __LINE__; const uint64_t pc = caller_pc();
  asm volatile("" ::: "memory");
  return pc;
}

[[gnu::noinline]] uint64_t calls_inlined(int* inner_line, int* outer_line) {
  *outer_line = __LINE__; const uint64_t pc = inlined_helper(inner_line);
  asm volatile("" ::: "memory");
  return pc;
}

}  // namespace cuw_symtest

namespace {

namespace fs = std::filesystem;

std::string hex(const unsigned char* p, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

/// The modules of this process as the interposer records them: dl_iterate_phdr's bias, the
/// span of the PT_LOAD segments, the GNU build-id note, the main program's path from /proc.
std::vector<ModuleInfo> loaded_modules() {
  std::vector<ModuleInfo> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* arg) -> int {
        auto& modules = *static_cast<std::vector<ModuleInfo>*>(arg);
        ModuleInfo m;
        m.bias = info->dlpi_addr;
        uint64_t lo = UINT64_MAX, hi = 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_LOAD) {
            lo = std::min<uint64_t>(lo, m.bias + ph.p_vaddr);
            hi = std::max<uint64_t>(hi, m.bias + ph.p_vaddr + ph.p_memsz);
          } else if (ph.p_type == PT_NOTE && m.build_id.empty()) {
            const auto* p = reinterpret_cast<const unsigned char*>(m.bias + ph.p_vaddr);
            const unsigned char* const end = p + ph.p_memsz;
            while (p + sizeof(ElfW(Nhdr)) <= end) {
              const auto* nh = reinterpret_cast<const ElfW(Nhdr)*>(p);
              const unsigned char* name = p + sizeof *nh;
              const unsigned char* desc = name + ((nh->n_namesz + 3) & ~3u);
              if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0)
                m.build_id = hex(desc, nh->n_descsz);
              p = desc + ((nh->n_descsz + 3) & ~3u);
            }
          }
        }
        m.start = lo;
        m.end = hi;
        m.path = info->dlpi_name != nullptr ? info->dlpi_name : "";
        if (m.path.empty() && modules.empty()) m.path = fs::read_symlink("/proc/self/exe").string();
        if (lo < hi) modules.push_back(std::move(m));
        return 0;
      },
      &out);
  return out;
}

template <class Modules>
auto* module_of(Modules& modules, uint64_t pc) {
  decltype(&modules[0]) found = nullptr;
  for (auto& m : modules)
    if (pc >= m.start && pc < m.end) found = &m;
  return found;
}

std::string basename_of(const std::string& path) { return fs::path(path).filename().string(); }

std::string describe(const std::vector<SnapFrame>& frames) {
  std::string s;
  for (const SnapFrame& f : frames)
    s += "  " + (f.function.empty() ? std::string("?") : f.function) + " at " + f.file + ":" + std::to_string(f.line) +
         " in " + f.module + " +0x" + [&] {
           char b[32];
           std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(f.offset));
           return std::string(b);
         }() + "\n";
  return s;
}

/// A fresh directory for copies of the test library, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "cuwt-symbolizer.XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

uintptr_t lib_symbol(void* handle, const char* getter) {
  auto* fn = reinterpret_cast<uintptr_t (*)()>(dlsym(handle, getter));
  REQUIRE(fn != nullptr);
  return fn();
}

/// libc's own qsort (&qsort is ASan's interceptor in the sanitizer builds).
uint64_t libc_qsort() {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(libc != nullptr);
  const auto addr = reinterpret_cast<uint64_t>(dlsym(libc, "qsort"));
  dlclose(libc);
  REQUIRE(addr != 0);
  return addr;
}

}  // namespace

TEST_CASE("a return address in this program resolves to its function, file and line", "[symbolizer]") {
  int line = 0;
  const uint64_t pc = cuw_symtest::direct_call(&line);
  const auto modules = loaded_modules();
  const ModuleInfo* m = module_of(modules, pc);
  REQUIRE(m != nullptr);
  CHECK(m->path == fs::read_symlink("/proc/self/exe").string());
  CHECK_FALSE(m->build_id.empty());

  Symbolizer sym;
  const auto frames = sym.resolve(modules, pc);
  INFO(describe(frames));
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].function == "cuw_symtest::direct_call(int*)");
  CHECK(basename_of(frames[0].file) == "test_symbolizer.cpp");
  CHECK(frames[0].line == static_cast<uint32_t>(line));
  CHECK(frames[0].pc == pc);  // reported as captured, looked up at pc - 1
  CHECK(frames[0].module == m->path);
  CHECK(frames[0].offset == pc - m->bias);
  CHECK_FALSE(frames[0].python);

  // An empty recorded build-id is not checked; either case of hex is accepted.
  auto unchecked = modules;
  for (ModuleInfo& u : unchecked) u.build_id.clear();
  CHECK(Symbolizer().resolve(unchecked, pc)[0].line == static_cast<uint32_t>(line));
  auto upper = modules;
  for (ModuleInfo& u : upper) std::transform(u.build_id.begin(), u.build_id.end(), u.build_id.begin(),
                                                 [](char c) { return static_cast<char>(std::toupper(c)); });
  CHECK(Symbolizer().resolve(upper, pc)[0].line == static_cast<uint32_t>(line));
}

TEST_CASE("an inlined call expands into one frame per call, innermost first", "[symbolizer]") {
  int inner = 0, outer = 0;
  const uint64_t pc = cuw_symtest::calls_inlined(&inner, &outer);
  const auto modules = loaded_modules();
  Symbolizer sym;
  const auto frames = sym.resolve(modules, pc);
  INFO(describe(frames));
  REQUIRE(frames.size() == 2);
  CHECK(frames[0].function == "cuw_symtest::inlined_helper(int*)");
  CHECK(basename_of(frames[0].file) == "test_symbolizer.cpp");
  CHECK(frames[0].line == static_cast<uint32_t>(inner));
  CHECK(frames[1].function == "cuw_symtest::calls_inlined(int*, int*)");
  CHECK(basename_of(frames[1].file) == "test_symbolizer.cpp");
  CHECK(frames[1].line == static_cast<uint32_t>(outer));
  for (const SnapFrame& f : frames) {
    CHECK(f.pc == pc);
    CHECK(f.offset == frames[0].offset);
    CHECK(f.module == frames[0].module);
  }
}

TEST_CASE("a library without debug info gives its ELF symbol, demangled", "[symbolizer]") {
  void* lib = dlopen(CUW_SYMTEST_LIB_NODEBUG, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  const uint64_t fn = lib_symbol(lib, "cuw_symtest_lib_fn");
  const auto modules = loaded_modules();
  const ModuleInfo* m = module_of(modules, fn);
  REQUIRE(m != nullptr);
  Symbolizer sym;
  const auto frames = sym.resolve(modules, fn + 1, false);  // an exact pc: no pc - 1
  INFO(describe(frames));
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].function == "cuw_symtest::lib_fn(int)");
  CHECK(frames[0].file.empty());
  CHECK(frames[0].line == 0);
  CHECK(frames[0].module == m->path);
  CHECK(basename_of(frames[0].module) == basename_of(CUW_SYMTEST_LIB_NODEBUG));
  CHECK(frames[0].offset == fn + 1 - m->bias);
  dlclose(lib);
}

TEST_CASE("a pc in libc gives its symbol and libc's path", "[symbolizer]") {
  // libc's .dynsym, or its DWARF where libc6-dbg is installed (/usr/lib/debug/.build-id):
  // either way "qsort", exported under that name and not an alias of another function.
  const uint64_t pc = libc_qsort() + 1;
  const auto modules = loaded_modules();
  const ModuleInfo* m = module_of(modules, pc);
  REQUIRE(m != nullptr);
  CHECK_THAT(m->path, Catch::Contains("libc.so"));
  Symbolizer sym;
  const auto frames = sym.resolve(modules, pc, false);
  INFO(describe(frames));
  REQUIRE_FALSE(frames.empty());
  CHECK(frames.back().function == "qsort");
  CHECK(frames.back().module == m->path);
  std::printf("symbolizer: libc %s: %s", frames.back().file.empty() ? "without debug info" : "with debug info",
              describe(frames).c_str());
}

TEST_CASE("a library with DWARF gives file and line", "[symbolizer]") {
  void* lib = dlopen(CUW_SYMTEST_LIB_G, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  const uint64_t fn = lib_symbol(lib, "cuw_symtest_lib_fn");
  Symbolizer sym;
  const auto frames = sym.resolve(loaded_modules(), fn, false);
  INFO(describe(frames));
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].function == "cuw_symtest::lib_fn(int)");
  CHECK(basename_of(frames[0].file) == "symbolizer_testlib.cpp");
  CHECK(frames[0].line > 0);
  dlclose(lib);
}

TEST_CASE("a pc outside every module has no module", "[symbolizer]") {
  int on_stack = 0;
  const auto pc = reinterpret_cast<uint64_t>(&on_stack);
  const auto modules = loaded_modules();
  REQUIRE(module_of(modules, pc) == nullptr);
  Symbolizer sym;
  const auto frames = sym.resolve(modules, pc);
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].pc == pc);
  CHECK(frames[0].function.empty());
  CHECK(frames[0].module.empty());
  CHECK(frames[0].offset == 0);
  CHECK(sym.resolve({}, 0x1000)[0].module.empty());
}

TEST_CASE("a module whose file is not the one loaded gives module + offset only", "[symbolizer]") {
  int line = 0;
  const uint64_t pc = cuw_symtest::direct_call(&line);
  auto modules = loaded_modules();
  ModuleInfo* m = module_of(modules, pc);
  REQUIRE(m != nullptr);
  REQUIRE(m->build_id.size() >= 2);
  m->build_id[0] = m->build_id[0] == '0' ? '1' : '0';  // as after a rebuild
  Symbolizer sym;
  const auto frames = sym.resolve(modules, pc);
  INFO(describe(frames));
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].function.empty());
  CHECK(frames[0].file.empty());
  CHECK(frames[0].line == 0);
  CHECK(frames[0].module == m->path);
  CHECK(frames[0].offset == pc - m->bias);
  CHECK(sym.stats().build_id_mismatches == 1);
  sym.resolve(modules, pc + 1);
  CHECK(sym.stats().build_id_mismatches == 1);  // the verdict is remembered

  // A recorded build-id that the file on disk lacks altogether (a shorter one, here): the same.
  m->build_id.resize(m->build_id.size() - 2);
  CHECK(Symbolizer().resolve(modules, pc)[0].function.empty());
}

TEST_CASE("a library deleted after it was loaded gives module + offset", "[symbolizer]") {
  TempDir dir;
  const fs::path copy = dir.path / "libcuwt_deleted.so";
  fs::copy_file(CUW_SYMTEST_LIB_G, copy);
  void* lib = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  fs::remove(copy);
  const uint64_t fn = lib_symbol(lib, "cuw_symtest_lib_fn");
  const auto modules = loaded_modules();
  const ModuleInfo* m = module_of(modules, fn);
  REQUIRE(m != nullptr);
  CHECK(m->path == copy.string());
  Symbolizer sym;
  const auto frames = sym.resolve(modules, fn, false);
  INFO(describe(frames));
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].function.empty());
  CHECK(frames[0].module == copy.string());
  CHECK(frames[0].offset == fn - m->bias);
  CHECK(sym.stats().files_refused == 1);
  dlclose(lib);
}

TEST_CASE("paths that are no regular ELF file are refused without blocking", "[symbolizer]") {
  TempDir dir;
  const fs::path fifo = dir.path / "fifo.so";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);  // open() without O_NONBLOCK would wait for a writer
  const fs::path text = dir.path / "text.so";
  { std::FILE* f = std::fopen(text.c_str(), "w"); REQUIRE(f != nullptr); std::fputs("not an ELF file\n", f); std::fclose(f); }
  std::vector<ModuleInfo> modules = {
      {0x10000, 0x20000, 0x10000, fifo.string(), ""},
      {0x20000, 0x30000, 0x20000, text.string(), ""},
      {0x30000, 0x40000, 0x30000, "linux-vdso.so.1", ""},  // not a file: relative paths are never opened
      {0x40000, 0x50000, 0x40000, dir.path.string(), ""},  // a directory
  };
  Symbolizer sym;
  for (uint64_t pc : {0x10010ULL, 0x20010ULL, 0x30010ULL, 0x40010ULL}) {
    const auto frames = sym.resolve(modules, pc);
    REQUIRE(frames.size() == 1);
    CHECK(frames[0].function.empty());
    CHECK_FALSE(frames[0].module.empty());
    CHECK(frames[0].offset == 0x10);
  }
  CHECK(sym.stats().files_refused == 4);
  CHECK(sym.stats().files_opened == 0);
}

TEST_CASE("a file truncated under libdw's mapping costs its symbols, not the daemon", "[symbolizer]") {
  cuw::daemon::install_fault_guard();  // as the daemon's main does
  // Offsets of two functions in the -g library, from a loaded copy of it.
  void* lib = dlopen(CUW_SYMTEST_LIB_G, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  const uint64_t fn = lib_symbol(lib, "cuw_symtest_lib_fn"), other = lib_symbol(lib, "cuw_symtest_lib_other");
  const auto loaded = loaded_modules();
  const ModuleInfo* real = module_of(loaded, fn);
  REQUIRE(real != nullptr);

  // A copy that no process maps, described at an address of our choosing.
  TempDir dir;
  const fs::path copy = dir.path / "libcuwt_truncated.so";
  fs::copy_file(CUW_SYMTEST_LIB_G, copy);
  const uint64_t base = 0x7e0000000000ULL;
  const std::vector<ModuleInfo> modules = {
      {base, base + (real->end - real->start), base, copy.string(), real->build_id}};
  Symbolizer sym;
  auto frames = sym.resolve(modules, base + (fn - real->bias), false);
  INFO(describe(frames));
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].function == "cuw_symtest::lib_fn(int)");

  REQUIRE(truncate(copy.c_str(), 0) == 0);
  frames = sym.resolve(modules, base + (other - real->bias), false);
  INFO(describe(frames));
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].function.empty());
  CHECK(frames[0].module == copy.string());
  CHECK(frames[0].offset == other - real->bias);
  CHECK(sym.stats().faults == 1);
  // What was resolved before the fault stays known; the file is not read again.
  CHECK(sym.resolve(modules, base + (fn - real->bias), false)[0].function == "cuw_symtest::lib_fn(int)");
  CHECK(sym.resolve(modules, base + (other - real->bias) + 1, false)[0].function.empty());
  CHECK(sym.stats().faults == 1);
  dlclose(lib);
}

TEST_CASE("open files and remembered modules stay within their bounds", "[symbolizer]") {
  // Offsets of lib_fn in the library without debug info, from a loaded copy of it.
  void* lib = dlopen(CUW_SYMTEST_LIB_NODEBUG, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  const uint64_t fn = lib_symbol(lib, "cuw_symtest_lib_fn");
  const auto loaded = loaded_modules();
  const ModuleInfo* real = module_of(loaded, fn);
  REQUIRE(real != nullptr);
  const uint64_t span = real->end - real->start, fn_offset = fn - real->bias;

  // One more copy than may be open at once, each at its own address.
  TempDir dir;
  constexpr std::size_t kCopies = Symbolizer::kMaxOpenFiles + 1;
  std::vector<ModuleInfo> modules;
  for (std::size_t i = 0; i < kCopies; ++i) {
    const fs::path copy = dir.path / ("libcuwt_copy" + std::to_string(i) + ".so");
    fs::copy_file(CUW_SYMTEST_LIB_NODEBUG, copy);
    const uint64_t base = 0x7e0000000000ULL + i * (span + 0x100000);
    modules.push_back({base, base + span, base, copy.string(), real->build_id});
  }
  const double heap0 = static_cast<double>(mallinfo2().uordblks);
  Symbolizer sym;
  for (const ModuleInfo& m : modules) CHECK(sym.resolve(modules, m.bias + fn_offset, false)[0].function == "cuw_symtest::lib_fn(int)");
  const double per_file = (static_cast<double>(mallinfo2().uordblks) - heap0) / kCopies / 1024;
  CHECK(sym.stats().files_opened == kCopies);
  CHECK(sym.stats().evictions == 1);
  // The first copy was closed to open the last; a new pc there opens it again.
  CHECK(sym.resolve(modules, modules[0].bias + fn_offset + 1, false)[0].function == "cuw_symtest::lib_fn(int)");
  CHECK(sym.stats().files_opened == kCopies + 1);
  CHECK(sym.stats().evictions == 2);
  std::printf("symbolizer: heap per open file without debug info: %.0f KiB\n", per_file);

  // Remembered modules: one more than kMaxModules (relative paths: refused without a syscall);
  // the least recently used is forgotten, so asking for it again tries it again.
  std::vector<ModuleInfo> many;
  for (std::size_t i = 0; i <= Symbolizer::kMaxModules; ++i)
    many.push_back({0x1000 * (i + 1), 0x1000 * (i + 2), 0x1000 * (i + 1), "lib" + std::to_string(i) + ".so", ""});
  Symbolizer small;
  for (const ModuleInfo& m : many) small.resolve(many, m.start);
  CHECK(small.stats().files_refused == many.size());
  small.resolve(many, many.back().start);  // remembered: not tried again
  CHECK(small.stats().files_refused == many.size());
  small.resolve(many, many.front().start);  // forgotten: tried again
  CHECK(small.stats().files_refused == many.size() + 1);
  dlclose(lib);
}

TEST_CASE("resolve cost, cold and cached", "[symbolizer]") {
  using clock = std::chrono::steady_clock;
  const auto us = [](clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  int line = 0, inner = 0, outer = 0;
  const uint64_t pc1 = cuw_symtest::direct_call(&line), pc2 = cuw_symtest::calls_inlined(&inner, &outer);
  const auto modules = loaded_modules();

  // Heap held by the symbolizer (libdw's parsed units, decompressed sections), in MiB.
  const auto heap = [] { return static_cast<double>(mallinfo2().uordblks) / (1 << 20); };
  const double heap0 = heap();
  Symbolizer sym;
  auto t0 = clock::now();
  const auto first = sym.resolve(modules, pc1);  // opens the file, reads its headers, first unit
  const double cold = us(clock::now() - t0);
  t0 = clock::now();
  sym.resolve(modules, pc2);  // file open, another lookup
  const double open_file = us(clock::now() - t0);
  constexpr int kRounds = 20000;
  t0 = clock::now();
  std::size_t frames = 0;
  for (int i = 0; i < kRounds; ++i) frames += sym.resolve(modules, i % 2 ? pc1 : pc2).size();
  const double cached = us(clock::now() - t0) / kRounds;
  CHECK(frames == kRounds / 2 * 3);
  CHECK(sym.stats().cache_hits == kRounds);
  CHECK(sym.stats().files_opened == 1);
  CHECK(first[0].line == static_cast<uint32_t>(line));

  const double heap1 = heap();
  // libc: symbols (and DWARF when libc6-dbg is installed), a second file.
  const uint64_t libc_pc = libc_qsort() + 1;
  t0 = clock::now();
  sym.resolve(modules, libc_pc, false);
  const double cold_libc = us(clock::now() - t0);
  const double heap2 = heap();

  std::printf(
      "symbolizer cost: cold (open this %.1f MiB test binary, first lookup) %.0f us; another pc in the open "
      "file %.0f us; cached %.2f us per pc (%zu modules scanned); cold libc %.0f us; heap held: this binary "
      "%.1f MiB, libc %.1f MiB\n",
      static_cast<double>(fs::file_size(modules.front().path)) / (1 << 20), cold, open_file, cached, modules.size(),
      cold_libc, heap1 - heap0, heap2 - heap1);
}

TEST_CASE("the worker's request takes unsigned integers only, and a uid of 32 bits", "[symbolizer]") {
  using cuw::daemon::parse_symbolize_request;
  using cuw::daemon::SymbolizeRequest;
  SymbolizeRequest r;
  r.uid = 1000;
  r.cpu_seconds = 6;
  r.modules.push_back({0x7f0000000000, 0x7f0000200000, 0x7f0000000000, "/lib/x.so", "ab12"});
  r.pcs = {0x7f0000001000, 0x7f0000001004};
  SymbolizeRequest back;
  REQUIRE(parse_symbolize_request(cuw::daemon::symbolize_request_text(r), &back));
  CHECK(back.uid == 1000);
  CHECK(back.cpu_seconds == 6);
  CHECK(back.pcs == r.pcs);
  REQUIRE(back.modules.size() == 1);
  CHECK(back.modules[0].path == "/lib/x.so");
  CHECK(back.modules[0].build_id == "ab12");
  CHECK(back.modules[0].end == 0x7f0000200000);
  // A float out of uint64_t's range (converting it is undefined), a negative number, a uid
  // that would wrap to 0 (root), a module of the wrong shape: refused, *out untouched.
  for (const char* bad : {R"({"uid":1000,"modules":[[1e30,2,3,"/a",""]],"pcs":[1]})",
                          R"({"uid":1000,"modules":[],"pcs":[1e300]})",
                          R"({"uid":1000,"cpu_seconds":1e300,"modules":[],"pcs":[]})",
                          R"({"uid":1000,"modules":[[-1,2,3,"/a",""]],"pcs":[]})",
                          R"({"uid":4294967296,"modules":[],"pcs":[]})", R"({"uid":-1,"modules":[],"pcs":[]})",
                          R"({"uid":1000,"modules":[[1,2,3,"/a"]],"pcs":[]})", R"({"uid":1000,"pcs":[]})", "[1]", ""}) {
    INFO(bad);
    SymbolizeRequest out;
    out.uid = 77;
    CHECK(!parse_symbolize_request(bad, &out));
    CHECK(out.uid == 77);
  }
}

TEST_CASE("the worker's reply names each pc once, within bounds", "[symbolizer]") {
  std::vector<std::vector<cuw::daemon::SnapFrame>> named(2);
  std::string pending = "[0,[[\"main\",\"/src/a.cc\",42]]]\n[0,[[\"again\",\"\",1]]]\n[5,[[\"x\",\"\",1]]]\n"
                        "[1,[[\"f\",\"\",-3]]]\nnot json\n[1,[[\"" + std::string(10000, 'n') + "\",\"\",7]]]\n[0,";
  CHECK(cuw::daemon::take_symbolize_reply(pending, named) == 2);
  CHECK(pending == "[0,");
  REQUIRE(named[0].size() == 1);
  CHECK(named[0][0].function == "main");
  CHECK(named[0][0].line == 42);
  REQUIRE(named[1].size() == 1);
  CHECK(named[1][0].function.size() == 4096);
}
