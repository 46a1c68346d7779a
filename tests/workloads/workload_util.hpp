// cuwarden test workloads: small helpers shared by the probe and the demo workload.
//
// Kept separate from cuw_common on purpose: a workload stands for a foreign application,
// so it shares no code with the product.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cuw::workload {

/// Parse a size as users type it: bare bytes, K M G T / KiB..TiB (1024), kB MB GB TB (1000),
/// optionally fractional ("1.5G"). nullopt on anything else or on overflow.
std::optional<uint64_t> parse_size(std::string_view text);

/// Parse a non-negative decimal integer; nullopt on anything else.
std::optional<uint64_t> parse_uint(std::string_view text);

/// Bytes for people, binary units, short: "512 MiB", "1.5 GiB", "2.0 GiB", "768 KiB", "17 B".
std::string human(uint64_t bytes);

/// True if libcuwarden.so is mapped into this process (preloaded, whatever the path).
bool cuwarden_loaded();

/// Sleep for `ms` milliseconds (0: return at once).
void sleep_ms(uint64_t ms);

}  // namespace cuw::workload
