// cuwarden CLI: `cuwarden run --tensors` — the per-tensor mode. It sets each framework's
// switch that sends every buffer to the driver (the table: common/include/cuw/tensors.hpp),
// picks a pool, and says what that changes for the program, before it starts.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cuw::cli {

/// Looks a variable up in the environment `cuwarden run` inherits: its value, or nullptr
/// when unset (getenv's contract; "" is a value that is set).
using EnvLookup = std::function<const char*(const char*)>;

/// Whether the per-tensor mode is on: `flag` (--tensors), else CUWARDEN_TENSORS from `env`
/// ("1": on; "0", empty or unset: off). Any other value of CUWARDEN_TENSORS is refused,
/// whatever the flag says: nullopt, with *why a sentence naming the variable and its values.
/// Pure apart from `env`.
std::optional<bool> tensors_mode(bool flag, const EnvLookup& env, std::string* why);

/// What a run does to its environment for the mode, and what it says about it.
struct TensorsPlan {
  /// Variables to set, in order: each framework's switch the environment does not hold,
  /// then CUWARDEN_TENSORS=1 and CUWARDEN_POOL (when neither --pool nor the environment
  /// chooses a pool). Empty when the mode is off.
  std::vector<std::pair<std::string, std::string>> set;
  /// Lines for standard error, one thing each, without the "cuwarden run: " prefix: what was
  /// set and what was kept, warnings, then (mode on) what the mode changes for the program.
  std::vector<std::string> lines;
};

/// Decides a run's TensorsPlan. `on`: the mode (tensors_mode()); `pool_flag`: --pool as
/// given ("" when not); `label`: how the lines name what turned the mode on ("--tensors" or
/// "CUWARDEN_TENSORS=1"); `env`: the inherited environment. A variable `env` holds is kept,
/// and a line says so. With the mode off, `set` is empty and `lines` holds only warnings
/// that apply to any run (PYTORCH_NO_CUDA_MEMORY_CACHING at a value other than 1).
/// Pure apart from `env`; thread-safe if `env` is.
TensorsPlan plan_tensors(bool on, const std::string& pool_flag, const std::string& label, const EnvLookup& env);

/// `cuwarden run --help`'s paragraph on the mode: each switch of the table (framework,
/// variable=value, effect), the pool it picks, CUWARDEN_TENSORS. Pure.
std::string tensors_help();

}  // namespace cuw::cli
