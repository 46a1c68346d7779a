// cuwarden: parsing and printing sizes ("8G", "512MiB", "1.5GB", "75%") and cap specs
// ("8G", "0=8G,1=4G"), as users type them in CUWARDEN_LIMIT and on the command line.
//
// Units, in any case: a bare (whole) number is bytes; K M G T and KiB MiB GiB TiB are powers
// of 1024; kB MB GB TB are powers of 1000; N% is a share of the device's physical memory. A
// cap is at least 1 MiB (parse_cap): "--limit 75" is a mistake, not a 75-byte cap.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cuw {

/// A size as typed: absolute bytes, or a percentage of the device's memory.
struct SizeSpec {
  bool percent = false;
  uint64_t bytes = 0;        ///< when !percent
  double share = 0.0;        ///< when percent: 0 < share <= 1
  /// Resolve against a device's physical memory (bytes). Percent rounds down to bytes.
  uint64_t resolve(uint64_t physical_total) const noexcept;
  std::string str() const;   ///< as a user would type it back ("8GiB", "75%")
  /// Field by field (a percent compares its share exactly: parsing the same text gives the same).
  friend bool operator==(const SizeSpec&, const SizeSpec&) = default;
};

/// Parse one size. On error returns nullopt and sets *error to a one-line reason.
/// `allow_percent` = false rejects "N%". Thread-safe; no allocation on success paths
/// beyond the optional's.
std::optional<SizeSpec> parse_size(std::string_view text, bool allow_percent, std::string* error);

/// The smallest cap accepted, in bytes: below it no real allocation fits (the driver's
/// granularity is 2 MiB), so a smaller one is a mistyped unit.
inline constexpr uint64_t kMinCap = 1ULL << 20;

/// parse_size() for a cap: also refuses an absolute size under kMinCap, saying which units
/// were probably meant. Percentages are checked by parse_size alone.
std::optional<SizeSpec> parse_cap(std::string_view text, bool allow_percent, std::string* error);

/// A per-device cap specification: a default for every device and per-ordinal overrides.
struct LimitSpec {
  std::optional<SizeSpec> all;                ///< applies to devices without an override
  std::map<int, SizeSpec> per_device;         ///< CUDA ordinal -> cap
  bool empty() const noexcept { return !all && per_device.empty(); }
  /// Cap for `ordinal`, if any.
  std::optional<SizeSpec> for_device(int ordinal) const;
  friend bool operator==(const LimitSpec&, const LimitSpec&) = default;
};

/// Parse "8G", "75%", "0=8G,1=4G", or "8G,1=4G" (plain entry = default), each a cap
/// (parse_cap). Ordinals 0..63.
std::optional<LimitSpec> parse_limit(std::string_view text, std::string* error);

/// Several cap specifications that all apply, separated by ';' ("1G;0=75%"): what enclosing
/// `cuwarden run`s set (CUWARDEN_OUTER_LIMIT). Each is parse_limit's; an empty entry is an error.
std::optional<std::vector<LimitSpec>> parse_limits(std::string_view text, std::string* error);

/// The cap on device `ordinal` (of `physical` bytes) under every one of `specs`: the lowest
/// that applies; ~0 (ring::kNoLimit) when none does. A share of a device whose size is
/// unknown (physical 0) cannot be resolved and does not apply.
uint64_t lowest_cap(const std::vector<LimitSpec>& specs, int ordinal, uint64_t physical) noexcept;

/// Human-readable bytes with binary units: "0 B", "512 B", "1.50 KiB", "8.00 GiB".
std::string format_bytes(uint64_t bytes);

/// Bytes as MiB, rounded down, the way nvidia-smi prints memory ("4096MiB").
std::string format_mib(uint64_t bytes);

}  // namespace cuw
