// cuwarden CLI: reading the daemon's JSON defensively (a missing or mistyped key gives the
// fallback, never an exception) and the clock texts the views print.
#pragma once

#include <ctime>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <string>

#include "table.hpp"

namespace cuw::cli {

/// `key` of `j` as a string, or `fallback`.
inline std::string jstr(const nlohmann::ordered_json& j, const char* key, const std::string& fallback = "") {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}
/// `key` of `j` as an unsigned number, or 0.
inline uint64_t jnum(const nlohmann::ordered_json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}
/// `key` of `j` as an array, or an empty one.
inline const nlohmann::ordered_json& jarr(const nlohmann::ordered_json& j, const char* key) {
  static const nlohmann::ordered_json empty = nlohmann::ordered_json::array();
  auto it = j.find(key);
  return it != j.end() && it->is_array() ? *it : empty;
}
/// `key` of `j` as a cell of `kind`; an empty cell when missing or null.
inline Cell jcell(const nlohmann::ordered_json& j, const char* key, CellKind kind) {
  auto it = j.find(key);
  return it == j.end() ? Cell::none() : Cell::from_json(*it, kind);
}

/// `ns` (since the Unix epoch) in local time with strftime's `fmt_str`, plus ".mmm" with `millis`.
inline std::string local_time(uint64_t ns, const char* fmt_str, bool millis) {
  const time_t secs = static_cast<time_t>(ns / 1000000000ULL);
  tm tmv{};
  localtime_r(&secs, &tmv);
  char buf[64];
  strftime(buf, sizeof buf, fmt_str, &tmv);
  std::string s = buf;
  if (millis) s += fmt::format(".{:03d}", static_cast<int>((ns / 1000000ULL) % 1000));
  return s;
}

}  // namespace cuw::cli
