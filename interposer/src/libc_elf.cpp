// cuwarden interposer: libc symbol lookup through its GNU hash table (see libc_elf.hpp).
// ELF references: System V ABI, "Dynamic Section", "Symbol Versioning"; the GNU hash
// section layout as implemented by glibc's ld.so (_dl_setup_hash / do_lookup_x).
#include "libc_elf.hpp"

#include <elf.h>
#include <link.h>

#include <cstdint>
#include <cstring>

namespace cuw::libc_elf {

namespace {

struct Query {
  const char* name;
  const char* version;
  void* result;
};

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

int visit(struct dl_phdr_info* info, size_t, void* data) {
  auto* q = static_cast<Query*>(data);
  const char* n = info->dlpi_name;
  if (!n || !std::strstr(n, "libc.so")) return 0;
  const ElfW(Addr) base = info->dlpi_addr;
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = reinterpret_cast<const ElfW(Dyn)*>(base + info->dlpi_phdr[i].p_vaddr);
  if (!dyn) return 0;
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const uint32_t* gnuhash = nullptr;
  const ElfW(Half)* versym = nullptr;
  const ElfW(Verdef)* verdef = nullptr;
  for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB: symtab = at<ElfW(Sym)>(base, d->d_un.d_ptr); break;
      case DT_STRTAB: strtab = at<char>(base, d->d_un.d_ptr); break;
      case DT_GNU_HASH: gnuhash = at<uint32_t>(base, d->d_un.d_ptr); break;
      case DT_VERSYM: versym = at<ElfW(Half)>(base, d->d_un.d_ptr); break;
      case DT_VERDEF: verdef = at<ElfW(Verdef)>(base, d->d_un.d_ptr); break;
      default: break;
    }
  }
  if (!symtab || !strtab || !gnuhash) return 0;
  const uint32_t nbuckets = gnuhash[0], symoffset = gnuhash[1], bloom_size = gnuhash[2];
  const auto* bloom = reinterpret_cast<const ElfW(Addr)*>(gnuhash + 4);
  const uint32_t* buckets = reinterpret_cast<const uint32_t*>(bloom + bloom_size);
  const uint32_t* chain = buckets + nbuckets;
  if (nbuckets == 0) return 0;
  const uint32_t h = gnu_hash(q->name);
  for (uint32_t idx = buckets[h % nbuckets]; idx >= symoffset; ++idx) {
    const uint32_t ch = chain[idx - symoffset];
    const ElfW(Sym)& s = symtab[idx];
    if ((ch | 1) == (h | 1) && s.st_shndx != SHN_UNDEF && !std::strcmp(strtab + s.st_name, q->name)) {
      const ElfW(Half) vs = versym ? versym[idx] : 0;
      bool match;
      if (!q->version) {
        match = !(vs & 0x8000);  // the default (non-hidden) definition
      } else {
        const char* vn = versym && verdef ? version_name(verdef, vs & 0x7fff, strtab) : nullptr;
        match = vn && !std::strcmp(vn, q->version);
      }
      if (match) {
        q->result = reinterpret_cast<void*>(base + s.st_value);
        return 1;
      }
    }
    if (ch & 1) break;
  }
  return 1;  // libc found; stop iterating either way
}

}  // namespace

void* find(const char* name, const char* version) noexcept {
  Query q{name, version, nullptr};
  dl_iterate_phdr(visit, &q);
  return q.result;
}

}  // namespace cuw::libc_elf
