// cuwarden interposer: libc symbol lookup through its GNU hash table (see libc_elf.hpp).
// ELF references: System V ABI, "Dynamic Section", "Symbol Versioning"; the GNU hash
// section layout as implemented by glibc's ld.so (_dl_setup_hash / do_lookup_x).
//
// This runs inside other tools' start-up: sanitizer runtimes resolve their interceptors
// with dlsym(RTLD_NEXT, ...) before they can serve strcmp, strstr or dl_iterate_phdr, and
// that dlsym is ours. So this file calls no libc function at all: the loaded objects come
// from the dynamic linker's own list (_r_debug), strings are compared by hand, and it is
// built with -fno-builtin (CMakeLists.txt) so no loop becomes a strcmp call.
#include "base/libc_elf.hpp"

#include <elf.h>
#include <link.h>

#include <cstdint>

namespace cuw::libc_elf {

namespace {

bool same(const char* a, const char* b) noexcept {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}

/// True when `path`'s file name starts with `want` ("libc.so" for ".../libc.so.6").
bool file_name_starts(const char* path, const char* want) noexcept {
  const char* base = path;
  for (const char* c = path; *c; ++c)
    if (*c == '/') base = c + 1;
  for (; *want; ++want, ++base)
    if (*base != *want) return false;
  return true;
}

uint32_t gnu_hash(const char* s) noexcept {
  uint32_t h = 5381;
  for (; *s; ++s) h = h * 33 + static_cast<unsigned char>(*s);
  return h;
}

// The dynamic linker relocates most d_ptr values in place; where it does not (read-only
// dynamic sections on some architectures), they are offsets from the load address.
template <class T>
const T* at(ElfW(Addr) base, ElfW(Addr) v) noexcept {
  return reinterpret_cast<const T*>(v < base ? base + v : v);
}

const char* version_name(const ElfW(Verdef) * vd, ElfW(Half) ndx, const char* strtab) noexcept {
  for (; vd; vd = vd->vd_next ? reinterpret_cast<const ElfW(Verdef)*>(reinterpret_cast<const char*>(vd) + vd->vd_next)
                              : nullptr) {
    if (vd->vd_ndx == ndx) {
      auto* aux = reinterpret_cast<const ElfW(Verdaux)*>(reinterpret_cast<const char*>(vd) + vd->vd_aux);
      return strtab + aux->vda_name;
    }
  }
  return nullptr;
}

void* lookup(const struct link_map* lm, const char* name, const char* version) noexcept {
  const ElfW(Addr) base = lm->l_addr;
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const uint32_t* gnuhash = nullptr;
  const ElfW(Half)* versym = nullptr;
  const ElfW(Verdef)* verdef = nullptr;
  for (const ElfW(Dyn)* d = lm->l_ld; d && d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB: symtab = at<ElfW(Sym)>(base, d->d_un.d_ptr); break;
      case DT_STRTAB: strtab = at<char>(base, d->d_un.d_ptr); break;
      case DT_GNU_HASH: gnuhash = at<uint32_t>(base, d->d_un.d_ptr); break;
      case DT_VERSYM: versym = at<ElfW(Half)>(base, d->d_un.d_ptr); break;
      case DT_VERDEF: verdef = at<ElfW(Verdef)>(base, d->d_un.d_ptr); break;
      default: break;
    }
  }
  if (!symtab || !strtab || !gnuhash) return nullptr;
  const uint32_t nbuckets = gnuhash[0], symoffset = gnuhash[1], bloom_size = gnuhash[2];
  const auto* bloom = reinterpret_cast<const ElfW(Addr)*>(gnuhash + 4);
  const uint32_t* buckets = reinterpret_cast<const uint32_t*>(bloom + bloom_size);
  const uint32_t* chain = buckets + nbuckets;
  if (nbuckets == 0) return nullptr;
  const uint32_t h = gnu_hash(name);
  for (uint32_t idx = buckets[h % nbuckets]; idx >= symoffset; ++idx) {
    const uint32_t ch = chain[idx - symoffset];
    const ElfW(Sym)& s = symtab[idx];
    if ((ch | 1) == (h | 1) && s.st_shndx != SHN_UNDEF && same(strtab + s.st_name, name)) {
      const ElfW(Half) vs = versym ? versym[idx] : 0;
      bool match;
      if (!version) {
        match = !(vs & 0x8000);  // the default (non-hidden) definition
      } else {
        const char* vn = versym && verdef ? version_name(verdef, vs & 0x7fff, strtab) : nullptr;
        match = vn && same(vn, version);
      }
      if (match) return reinterpret_cast<void*>(base + s.st_value);
    }
    if (ch & 1) break;
  }
  return nullptr;
}

}  // namespace

void* find_in(const char* file_prefix, const char* name, const char* version) noexcept {
  for (const struct link_map* lm = _r_debug.r_map; lm; lm = lm->l_next)
    if (lm->l_name && file_name_starts(lm->l_name, file_prefix)) return lookup(lm, name, version);
  return nullptr;
}

void* find(const char* name, const char* version) noexcept { return find_in("libc.so", name, version); }

}  // namespace cuw::libc_elf
