// cuwarden interposer: the context each tracked CUDA array was created in.
//
// The driver frees a context's arrays with the context (CUDA driver API: cuCtxDestroy,
// cuDevicePrimaryCtxReset), and an array's handle cannot be asked about once it is gone, so
// the hooks remember each array's context here and, when a context is destroyed, count its
// arrays freed. A context handle is not an identity over time: a primary context keeps its
// handle when it is destroyed and made active again, and the driver may hand a destroyed
// context's handle to a new one. So every entry carries a serial (when it was remembered),
// and a destruction sweeps only the entries it saw *before* its driver call (snapshot()),
// matched by key and serial: an array created after that, in the context that took the
// handle over, is never swept with the old one.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cuw::core {

/// One remembered array: its context, when it was remembered (a serial, never 0), and
/// whether a destruction of that context found its record taken by a destroy in flight
/// (the destroy, should the driver refuse it, then counts the array freed itself).
struct ArrayOwner {
  CUcontext ctx = nullptr;
  uint64_t serial = 0;
  bool ctx_gone = false;
};

/// Array handle -> ArrayOwner. Not thread-safe: the interposer calls it under the
/// tracker's lock (Tracker::lock()). An array's create and destroy allocate and free
/// outside the lock: a node is made before it (make_node) and a removed one is handed back
/// to be freed after it (forget's `dead`). Under the lock, rarely: the map's bucket array
/// grows in remember(), and forget() without `dead` frees a node (a destruction's sweep; a
/// VMM handle handed out at an array's old value). Memory: one heap node (about 48 bytes)
/// per live array.
class ArrayOwners {
 public:
  using Map = std::unordered_map<uint64_t, ArrayOwner>;
  using Node = Map::node_type;
  /// (key, serial) of the entries a context destruction is about to free.
  using Snapshot = std::vector<std::pair<uint64_t, uint64_t>>;

  /// A node for remember(), holding `ctx`; made without the lock. Empty when memory ran out
  /// (the array is then not remembered: it stays counted until destroyed, an over-count).
  static Node make_node(CUcontext ctx) noexcept {
    try {
      Map one;
      one.emplace(0, ArrayOwner{ctx, 0, false});
      return one.extract(one.begin());
    } catch (...) {
      return {};
    }
  }

  /// Lock held. Remember array `key` in the context `node` holds, under a fresh serial
  /// (returned; 0 when the array could not be remembered: `node` empty, or the map could
  /// not grow). An entry already at `key` (a handle the driver handed out again) is
  /// overwritten, and `node` left unused, for the caller to free after unlocking. When the
  /// array cannot be remembered, such an entry still gets a fresh serial and no context, so
  /// that no snapshot taken before matches it: a destruction of the old context must not
  /// count the new array freed.
  uint64_t remember(uint64_t key, Node& node) noexcept {
    const uint64_t serial = ++serial_;
    auto it = map_.find(key);
    if (it != map_.end()) {
      it->second = ArrayOwner{node.empty() ? nullptr : node.mapped().ctx, serial, false};
      return node.empty() ? 0 : serial;
    }
    if (node.empty()) return 0;
    node.key() = key;
    node.mapped().serial = serial;
    try {
      map_.insert(std::move(node));  // may rehash (allocates, rarely); no effect if it throws
    } catch (...) {
      return 0;
    }
    return serial;
  }

  /// Lock held. The entry for `key`, or nullptr. Valid until the map next changes.
  ArrayOwner* find(uint64_t key) noexcept {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }

  /// Lock held. Remove `key`'s entry if its serial is `serial` (any entry if `serial` is 0);
  /// its node goes to `*dead` (freed by the caller after unlocking), or is freed here when
  /// `dead` is nullptr. Returns whether an entry was removed.
  bool forget(uint64_t key, uint64_t serial, Node* dead = nullptr) noexcept {
    auto it = map_.find(key);
    if (it == map_.end() || (serial != 0 && it->second.serial != serial)) return false;
    if (dead) {
      *dead = map_.extract(it);
    } else {
      map_.erase(it);
    }
    return true;
  }

  /// Lock held. Appends (key, serial) of every entry remembered in `ctx` (not nullptr) and
  /// not marked ctx_gone. Returns false, with nothing appended, if `out` has no room for
  /// them all (its capacity is not grown here: reserve size() more without the lock, then
  /// call again). Walks every entry.
  bool snapshot(CUcontext ctx, Snapshot& out) const noexcept {
    const size_t at = out.size();
    for (const auto& [key, owner] : map_) {
      if (owner.ctx != ctx || ctx == nullptr || owner.ctx_gone) continue;
      if (out.size() == out.capacity()) {
        out.resize(at);
        return false;
      }
      out.emplace_back(key, owner.serial);
    }
    return true;
  }

  /// Lock held. How many entries there are: a capacity for snapshot() (relaxed: the map may
  /// grow before the lock is taken again, which snapshot() reports).
  size_t size() const noexcept { return map_.size(); }

 private:
  Map map_;
  uint64_t serial_ = 0;
};

}  // namespace cuw::core
