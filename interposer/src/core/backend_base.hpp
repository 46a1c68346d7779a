// cuwarden interposer core: what the core asks of the allocation backend.
//
// The backend chosen at start (CUWARDEN_POOL) sits above the core (backends/backend.hpp
// derives the seam the hooks call from this class); the core knows only this much of it. A
// pooling backend keeps memory for reuse, and the caps count it (it is the program's as far
// as the driver knows): before an allocation the backend does not serve is refused by a cap,
// or after the driver ran out of memory for one, the core asks for that memory back.
#pragma once

#include <cstdint>

namespace cuw::core {

class backend_base {
 public:
  backend_base(const backend_base&) = delete;
  backend_base& operator=(const backend_base&) = delete;

  /// Whether this backend keeps memory the caps count (release() can give some back). Fixed
  /// at construction.
  bool pools() const noexcept { return pools_; }

  /// Give back to the driver everything kept for reuse, waiting for frees still pending
  /// (except during a stream capture); returns the bytes given back. Thread-safe; called
  /// without the tracker's lock held.
  virtual uint64_t release() = 0;

 protected:
  constexpr explicit backend_base(bool pools) noexcept : pools_(pools) {}
  ~backend_base() = default;  // never destroyed through this class

 private:
  const bool pools_;
};

}  // namespace cuw::core
