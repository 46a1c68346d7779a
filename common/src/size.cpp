// cuwarden: size and cap-spec parsing ("8G", "512MiB", "1.5GB", "75%", "0=8G,1=4G").
#include "cuw/size.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

namespace cuw {

namespace {

__extension__ typedef unsigned __int128 u128;  // exact overflow checks for sizes

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

struct Unit {
  const char* name;
  uint64_t factor;
};

// Units, matched without regard to case (8g, 8G, 8GiB, 8gib): binary K M G T and KiB MiB GiB
// TiB; decimal kB MB GB TB (the SI prefixes: "8KB" is 8000 bytes, as "8MB" is 8,000,000).
constexpr Unit kUnits[] = {
    {"", 1},           {"b", 1},
    {"k", 1ULL << 10}, {"kib", 1ULL << 10}, {"m", 1ULL << 20}, {"mib", 1ULL << 20},
    {"g", 1ULL << 30}, {"gib", 1ULL << 30}, {"t", 1ULL << 40}, {"tib", 1ULL << 40},
    {"kb", 1000ULL},   {"mb", 1000ULL * 1000}, {"gb", 1000ULL * 1000 * 1000}, {"tb", 1000ULL * 1000 * 1000 * 1000},
};

}  // namespace

uint64_t SizeSpec::resolve(uint64_t physical_total) const noexcept {
  if (!percent) return bytes;
  long double v = static_cast<long double>(physical_total) * static_cast<long double>(share);
  if (v <= 0) return 0;
  if (v >= static_cast<long double>(physical_total)) return physical_total;
  return static_cast<uint64_t>(v);
}

std::string SizeSpec::str() const {
  if (percent) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g%%", share * 100.0);
    return buf;
  }
  return format_bytes(bytes);
}

std::optional<SizeSpec> parse_size(std::string_view text, bool allow_percent, std::string* error) {
  auto fail = [&](std::string why) -> std::optional<SizeSpec> {
    if (error) *error = std::move(why);
    return std::nullopt;
  };
  const std::string original(text);
  std::string_view s = trim(text);
  if (s.empty()) return fail("empty size");
  if (s.front() == '-') return fail("negative size '" + original + "'");
  if (s.front() == '+') s.remove_prefix(1);

  // Integer part, then an optional fraction of up to 18 digits.
  size_t i = 0;
  u128 whole = 0;
  bool any_digit = false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    whole = whole * 10 + static_cast<unsigned>(s[i] - '0');
    if (whole > std::numeric_limits<uint64_t>::max()) return fail("size '" + original + "' is too large");
    any_digit = true;
    ++i;
  }
  u128 frac_num = 0, frac_den = 1;
  if (i < s.size() && s[i] == '.') {
    ++i;
    int digits = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      if (digits < 18) {
        frac_num = frac_num * 10 + static_cast<unsigned>(s[i] - '0');
        frac_den *= 10;
        ++digits;
      }
      any_digit = true;
      ++i;
    }
  }
  if (!any_digit) return fail("size '" + original + "' does not start with a number");
  std::string_view unit = trim(s.substr(i));

  if (unit == "%") {
    if (!allow_percent) return fail("a percentage is not allowed here: '" + original + "'");
    long double pct = static_cast<long double>(whole) +
                      static_cast<long double>(frac_num) / static_cast<long double>(frac_den);
    if (!(pct > 0) || pct > 100) return fail("percentage '" + original + "' must be in (0, 100]");
    SizeSpec out;
    out.percent = true;
    out.share = static_cast<double>(pct / 100.0L);
    return out;
  }
  std::string lower(unit);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if ((lower.empty() || lower == "b") && frac_num != 0)
    return fail("'" + original + "' is not a whole number of bytes (give a unit: " + original + "G, " + original +
                "MiB)");
  for (const Unit& u : kUnits) {
    if (lower == u.name) {
      u128 v = whole * u.factor + (frac_num * u.factor) / frac_den;
      if (v > std::numeric_limits<uint64_t>::max()) return fail("size '" + original + "' is too large");
      SizeSpec out;
      out.bytes = static_cast<uint64_t>(v);
      return out;
    }
  }
  return fail("unknown unit '" + std::string(unit) + "' in size '" + original +
              "' (use bytes, K M G T, KiB MiB GiB TiB, kB MB GB TB" + (allow_percent ? ", or N%)" : ")"));
}

std::optional<SizeSpec> parse_cap(std::string_view text, bool allow_percent, std::string* error) {
  auto spec = parse_size(text, allow_percent, error);
  if (!spec || spec->percent) return spec;
  const std::string t(trim(text));
  if (spec->bytes == std::numeric_limits<uint64_t>::max()) {
    // The ring and the protocol write "no cap" as this value: taken as a size, it would
    // remove the cap without saying so.
    if (error) *error = "'" + t + "' is the number that means no cap; to remove a cap, say none";
    return std::nullopt;
  }
  if (spec->bytes >= kMinCap) return spec;
  if (error) {
    // A bare number under the floor is a unit left out: suggest the units that give a
    // plausible cap for it (n G up to 16 TiB, n% up to 100). A number with a unit was
    // meant as written and is simply too small.
    const std::string digits = t.front() == '+' ? t.substr(1) : t;
    std::string hint;
    if (digits.find_first_not_of("0123456789") == std::string::npos && spec->bytes > 0) {
      if (spec->bytes <= 16384) hint += t + "G, ";
      hint += t + "MiB";
      hint = "give a unit (" + hint + ")";
      if (allow_percent && spec->bytes <= 100) hint += " or a share (" + t + "%)";
      hint = ": " + hint + ";";
    }
    *error = "a cap of " + std::to_string(spec->bytes) + " B ('" + t + "') is smaller than any real allocation" +
             (hint.empty() ? ";" : hint) + " the smallest cap is 1 MiB";
  }
  return std::nullopt;
}

std::optional<SizeSpec> LimitSpec::for_device(int ordinal) const {
  auto it = per_device.find(ordinal);
  if (it != per_device.end()) return it->second;
  return all;
}

std::optional<LimitSpec> parse_limit(std::string_view text, std::string* error) {
  LimitSpec spec;
  std::string_view rest = text;
  if (trim(rest).empty()) {
    if (error) *error = "empty cap";
    return std::nullopt;
  }
  while (true) {
    size_t comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    if (item.empty()) {
      if (error) *error = "empty entry in '" + std::string(text) + "'";
      return std::nullopt;
    }
    size_t eq = item.find('=');
    std::string why;
    if (eq == std::string_view::npos) {
      if (spec.all) {
        if (error) *error = "more than one cap for all devices in '" + std::string(text) + "'";
        return std::nullopt;
      }
      auto sz = parse_cap(item, true, &why);
      if (!sz) {
        if (error) *error = why;
        return std::nullopt;
      }
      spec.all = *sz;
    } else {
      std::string_view ord = trim(item.substr(0, eq));
      int o = 0;
      // At most two digits: longer ordinals are refused before they can overflow `o`.
      if (ord.empty() || ord.size() > 2) o = -1;
      for (char c : ord) {
        if (o < 0) break;
        if (!std::isdigit(static_cast<unsigned char>(c))) { o = -1; break; }
        o = o * 10 + (c - '0');
      }
      if (o < 0 || o > 63) {
        if (error) *error = "bad device ordinal '" + std::string(ord) + "' in '" + std::string(text) + "' (expected 0..63)";
        return std::nullopt;
      }
      if (spec.per_device.count(o)) {
        if (error) *error = "device " + std::to_string(o) + " given twice in '" + std::string(text) + "'";
        return std::nullopt;
      }
      auto sz = parse_cap(item.substr(eq + 1), true, &why);
      if (!sz) {
        if (error) *error = why;
        return std::nullopt;
      }
      spec.per_device[o] = *sz;
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return spec;
}

std::optional<std::vector<LimitSpec>> parse_limits(std::string_view text, std::string* error) {
  std::vector<LimitSpec> out;
  for (std::string_view rest = text;;) {
    const std::size_t semi = rest.find(';');
    auto one = parse_limit(rest.substr(0, semi), error);
    if (!one) return std::nullopt;
    out.push_back(std::move(*one));
    if (semi == std::string_view::npos) return out;
    rest = rest.substr(semi + 1);
  }
}

uint64_t lowest_cap(const std::vector<LimitSpec>& specs, int ordinal, uint64_t physical) noexcept {
  uint64_t cap = ~0ULL;
  for (const LimitSpec& l : specs)
    if (const auto s = l.for_device(ordinal); s && !(s->percent && physical == 0))
      cap = std::min(cap, s->resolve(physical));
  return cap;
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  long double v = static_cast<long double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2Lf %s", v, kNames[u]);
  return buf;
}

std::string format_mib(uint64_t bytes) { return std::to_string(bytes >> 20) + "MiB"; }

}  // namespace cuw
