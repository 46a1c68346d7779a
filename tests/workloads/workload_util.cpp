// cuwarden test workloads: size parsing, human-readable sizes, "is cuwarden loaded?".
#include "workload_util.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

namespace cuw::workload {

std::optional<uint64_t> parse_uint(std::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

std::optional<uint64_t> parse_size(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && ((text[i] >= '0' && text[i] <= '9') || text[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  const std::string number(text.substr(0, i));
  const std::string_view unit = text.substr(i);
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !(value >= 0)) return std::nullopt;

  struct Unit {
    std::string_view name;
    double factor;
  };
  static constexpr Unit kUnits[] = {
      {"", 1.0},          {"B", 1.0},
      {"K", 0x1p10},      {"k", 0x1p10},      {"KiB", 0x1p10},
      {"M", 0x1p20},      {"m", 0x1p20},      {"MiB", 0x1p20},
      {"G", 0x1p30},      {"g", 0x1p30},      {"GiB", 0x1p30},
      {"T", 0x1p40},      {"t", 0x1p40},      {"TiB", 0x1p40},
      {"kB", 1e3},        {"KB", 1e3},        {"MB", 1e6},
      {"GB", 1e9},        {"TB", 1e12},
  };
  for (const Unit& u : kUnits) {
    if (u.name != unit) continue;
    const double bytes = std::floor(value * u.factor);
    if (bytes >= 0x1p64) return std::nullopt;
    return static_cast<uint64_t>(bytes);
  }
  return std::nullopt;
}

std::string human(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024.0 && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  char buf[48];
  // Below 1 GiB whole numbers read best ("512 MiB"); from GiB on one decimal ("1.5 GiB").
  std::snprintf(buf, sizeof buf, unit >= 3 ? "%.1f %s" : "%.0f %s", v, kNames[unit]);
  return buf;
}

bool cuwarden_loaded() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("libcuwarden") != std::string::npos) return true;
  }
  return false;
}

void sleep_ms(uint64_t ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace cuw::workload
