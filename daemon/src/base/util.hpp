// cuwarden daemon: small helpers — clocks, UUID spelling, turning hostile bytes into text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cuw::daemon {

/// CLOCK_REALTIME in ns since the Unix epoch (the ring's timestamps' clock; the interposer
/// reads its coarse variant by default, a tick or two behind this).
uint64_t now_ns() noexcept;
/// CLOCK_MONOTONIC in ns: for the daemon's own timers.
uint64_t mono_ns() noexcept;

/// `s` with ASCII letters lowered (HTTP header names, GPU UUIDs as people type them).
std::string ascii_lower(std::string_view s);

/// nvidia-smi's spelling of a 16-byte CUuuid: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
std::string format_uuid(const uint8_t (&uuid)[16]);

/// Text from a fixed-size char field of a ring: stops at the first NUL or at `cap`, never
/// reads past `cap`; control characters (C0, DEL, C1) and bytes of invalid UTF-8 become '?'
/// (cuw::printable).
std::string field_text(const char* data, std::size_t cap);

/// The name people know a process by: argv[0]'s base name when the kernel's 15-character
/// comm is a cut of it ("train_resnet50_" of train_resnet50_with_attention), else the comm.
/// `cmdline`: the command line, arguments separated by spaces.
std::string process_name(const std::string& comm, const std::string& cmdline);

/// Login name of `uid`, or the number as text when it has none. Cached; thread-safe (the
/// loop and the socket thread both ask).
std::string user_name(uint32_t uid);

/// The uid of login name `name`, if there is such a user.
std::optional<uint32_t> uid_of(const std::string& name);

/// A cap as a log line says it: "none" for no cap (the ring's all-ones), else its size.
std::string cap_text(uint64_t bytes);

/// A decimal number of at most 20 digits and nothing else (no sign, no space), as a query
/// string or a header carries it; nullopt otherwise or past 2^64-1. Pure.
std::optional<uint64_t> parse_u64(std::string_view s);
/// A process id: parse_u64's number in 1..2^31-1. Pure.
std::optional<uint32_t> parse_pid(std::string_view s);

/// The host name, "" if unknown.
std::string host_name();

}  // namespace cuw::daemon
