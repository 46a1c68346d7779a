// cuwarden interposer: find a symbol of the loaded libc by reading its ELF dynamic symbol
// table. Needed for dlsym and dlvsym themselves: this library exports both, so any
// reference to them from here would bind back to our own hooks.
#pragma once

namespace cuw::libc_elf {

/// Address of libc's definition of `name` at symbol version `version` ("GLIBC_2.34"), or of
/// its default definition when `version` is nullptr. nullptr when libc is not found or has
/// no such definition. Reads only memory already mapped by the dynamic linker; opens no
/// file and allocates nothing. Thread-safe.
void* find(const char* name, const char* version) noexcept;

/// The same in the first loaded object whose file name starts with `file_prefix`
/// ("libcuda.so": the driver's own entry point, whatever dlsym would answer).
void* find_in(const char* file_prefix, const char* name, const char* version) noexcept;

}  // namespace cuw::libc_elf
