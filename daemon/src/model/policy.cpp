// cuwarden daemon: parsing the policy file and resolving it per user (see policy.hpp).
#include "model/policy.hpp"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <fmt/format.h>
#include <fstream>
#include <sstream>
#include <toml++/toml.h>

#include "base/toml_guard.hpp"
#include "cuw/ring.hpp"

namespace cuw::daemon {

uint64_t PolicyValue::resolve(uint64_t physical_total) const noexcept {
  if (unlimited) return ring::kNoLimit;
  // A percentage of a device whose size is unknown cannot be resolved: no cap from it.
  if (size.percent && physical_total == 0) return ring::kNoLimit;
  // A share of a small device can come out under the floor every other cap keeps.
  return std::max(size.resolve(physical_total), kMinCap);
}

std::string PolicyValue::str() const { return unlimited ? "none" : size.str(); }

bool Policy::empty() const noexcept {
  auto none = [](const PolicyCaps& c) {
#define CUW_POLICY_UNSET_(key, type) &&!c.key
    return true CUW_POLICY_KEYS(CUW_POLICY_UNSET_);
#undef CUW_POLICY_UNSET_
  };
  if (!none(defaults)) return false;
  for (const auto& [n, c] : users)
    if (!none(c)) return false;
  for (const auto& [n, c] : groups)
    if (!none(c)) return false;
  for (const auto& [n, j] : jobs)
    if (j.never_suspend || j.max_suspended_ms || j.end_claim) return false;
  return true;
}

PolicyPriority EffectivePolicy::priority_for(std::optional<PolicyPriority> asked) const noexcept {
  const PolicyPriority base = priority.value_or(0);
  const PolicyPriority most = max_priority.value_or(base);  // sections may set the two apart
  return std::clamp(std::min(asked.value_or(base), most), kMinPriority, kMaxPriority);
}

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 10 && s.find_first_not_of("0123456789") == std::string::npos;
}

/// The user's login name and every group (primary and supplementary) as names and numbers.
void identity(uint32_t uid, std::string* user, std::vector<std::string>* group_keys) {
  *user = std::to_string(uid);
  passwd pw{};
  passwd* pres = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &pres) != 0 || !pres) return;
  *user = pres->pw_name;
  const gid_t primary = pres->pw_gid;
  std::vector<gid_t> gids(64);
  int n = static_cast<int>(gids.size());
  if (getgrouplist(pres->pw_name, primary, gids.data(), &n) < 0) {
    gids.resize(static_cast<std::size_t>(std::clamp(n, 1, 65536)));
    n = static_cast<int>(gids.size());
    if (getgrouplist(pres->pw_name, primary, gids.data(), &n) < 0) n = 0;
  }
  gids.resize(static_cast<std::size_t>(std::max(n, 0)));
  if (gids.empty()) gids.push_back(primary);
  for (gid_t g : gids) {
    group_keys->push_back(std::to_string(g));
    group gr{};
    group* gres = nullptr;
    std::vector<char> gbuf(65536);
    if (getgrgid_r(g, &gr, gbuf.data(), gbuf.size(), &gres) == 0 && gres) group_keys->push_back(gres->gr_name);
  }
}

/// Whether `a` is tighter than `b`, for combining several groups: the lower of two sizes
/// (unlimited is the highest; percentages compare as-is only with percentages, otherwise
/// the absolute one is taken as the tighter: it does not depend on the device), the stricter
/// enforcement, the lower priority, the shorter duration.
bool tighter(const PolicyValue& a, const PolicyValue& b) {
  if (a.unlimited) return false;
  if (b.unlimited) return true;
  if (a.size.percent != b.size.percent) return !a.size.percent;
  if (a.size.percent) return a.size.share < b.size.share;
  return a.size.bytes < b.size.bytes;
}
bool tighter(Enforce a, Enforce b) { return a > b; }
bool tighter(PolicyPriority a, PolicyPriority b) { return a < b; }
bool tighter(const PolicyDuration& a, const PolicyDuration& b) { return a < b; }

}  // namespace

const EffectivePolicy& Policy::for_user(uint32_t uid) const {
  if (auto it = cache_.find(uid); it != cache_.end()) return it->second;
  if (cache_.size() > 4096) cache_.clear();
  EffectivePolicy e;
  std::string user;
  std::vector<std::string> gkeys;
  identity(uid, &user, &gkeys);
  const PolicyCaps* u = nullptr;
  if (auto it = users.find(user); it != users.end()) u = &it->second;
  else if (auto it2 = users.find(std::to_string(uid)); it2 != users.end()) u = &it2->second;
  std::vector<std::pair<std::string, const PolicyCaps*>> gs;
  for (const auto& k : gkeys)
    if (auto it = groups.find(k); it != groups.end()) gs.emplace_back(k, &it->second);
  std::vector<std::string> sources;
  // Each key: the user's own section, else the tightest of the groups', else [default].
  auto pick = [&]<class T>(std::optional<T> PolicyCaps::*key, std::optional<T>& out) {
    if (u && (u->*key)) {
      out = u->*key;
      sources.push_back("user " + user);
      return;
    }
    std::string from;
    for (const auto& [name, caps] : gs)
      if (caps->*key && (!out || tighter(*(caps->*key), *out))) {
        out = caps->*key;
        from = "group " + name;
      }
    if (out) {
      sources.push_back(from);
      return;
    }
    if (defaults.*key) {
      out = defaults.*key;
      sources.push_back("default");
    }
  };
#define CUW_POLICY_PICK_(key, type) pick(&PolicyCaps::key, e.key);
  CUW_POLICY_KEYS(CUW_POLICY_PICK_)
#undef CUW_POLICY_PICK_
  std::sort(sources.begin(), sources.end());
  sources.erase(std::unique(sources.begin(), sources.end()), sources.end());
  for (const auto& s : sources) e.source += (e.source.empty() ? "" : ", ") + s;
  if (e.source.empty()) e.source = "no policy";
  return cache_.emplace(uid, std::move(e)).first->second;
}

namespace {

std::string where(const std::string& source, const toml::source_region& r) {
  return fmt::format("{}:{}:{}", source, r.begin.line, r.begin.column);
}

/// Every key of a section, for messages: "limit, max_limit, ...".
std::string key_list() {
  std::string out;
#define CUW_POLICY_NAME_(key, type) out += (out.empty() ? "" : ", ") + std::string(#key);
  CUW_POLICY_KEYS(CUW_POLICY_NAME_)
#undef CUW_POLICY_NAME_
  return out;
}

bool is_key(const std::string& key) {
#define CUW_POLICY_IS_(name, type) || key == #name
  return false CUW_POLICY_KEYS(CUW_POLICY_IS_);
#undef CUW_POLICY_IS_
}

struct Parser {
  const std::string& source;
  std::vector<std::string>* errors;
  std::vector<std::string>* warnings;

  void error(const toml::source_region& r, const std::string& msg) { errors->push_back(where(source, r) + ": " + msg); }
  void warn(const toml::source_region& r, const std::string& msg) {
    if (warnings) warnings->push_back(where(source, r) + ": " + msg);
  }

  std::optional<PolicyValue> value(const std::string& key, const toml::node& v) {
    const bool percent_ok = key == "limit" || key == "max_limit";
    PolicyValue pv;
    if (auto i = v.as_integer()) {
      if (i->get() < 0) {
        error(v.source(), fmt::format("{} must not be negative (got {})", key, i->get()));
        return std::nullopt;
      }
      pv.size.bytes = static_cast<uint64_t>(i->get());
      // A bare integer is bytes (files that wrote one keep their meaning), but one under the
      // floor is a unit left out: `limit = 40` would give every process a 40-byte cap.
      if (pv.size.bytes < kMinCap) {
        error(v.source(), fmt::format("{} = {} is {} bytes, under the smallest cap ({}): a bare integer is bytes; "
                                      "give a unit as a string, e.g. {} = \"{}G\" or \"{}MiB\"",
                                      key, i->get(), i->get(), format_bytes(kMinCap), key, i->get(), i->get()));
        return std::nullopt;
      }
      return pv;
    }
    auto s = v.as_string();
    if (!s) {
      std::ostringstream type;
      type << v.type();
      error(v.source(), fmt::format("{} must be a size such as \"40G\" or \"none\" (got a {})", key, type.str()));
      return std::nullopt;
    }
    const std::string text = s->get();
    if (text == "none" || text == "unlimited") {
      pv.unlimited = true;
      return pv;
    }
    std::string why;
    auto spec = parse_cap(text, percent_ok, &why);
    if (!spec) {
      error(v.source(), fmt::format("{} = \"{}\": {}{}", key, text, why,
                                    !percent_ok && text.find('%') != std::string::npos
                                        ? " (a job's cap is one size for all its GPUs; use bytes)"
                                        : ""));
      return std::nullopt;
    }
    pv.size = *spec;
    return pv;
  }

  bool parse(const std::string& key, const toml::node& v, PolicyValue* out) {
    auto pv = value(key, v);
    if (pv) *out = *pv;
    return pv.has_value();
  }
  bool parse(const std::string& key, const toml::node& v, Enforce* out) {
    const auto* str = v.as_string();
    if (str && str->get() == "report") *out = Enforce::report;
    else if (str && str->get() == "kill") *out = Enforce::kill;
    else error(v.source(), fmt::format("{} must be \"report\" or \"kill\"", key));
    return str && (str->get() == "report" || str->get() == "kill");
  }
  bool parse(const std::string& key, const toml::node& v, PolicyPriority* out) {
    const auto* i = v.as_integer();
    if (!i || i->get() < kMinPriority || i->get() > kMaxPriority) {
      error(v.source(), fmt::format("{} must be an integer from {} to {} (higher goes first)", key, kMinPriority,
                                    kMaxPriority));
      return false;
    }
    *out = static_cast<PolicyPriority>(i->get());
    return true;
  }
  static constexpr uint64_t kHourMs = 3'600'000, kWeekMs = 7 * 24 * kHourMs;
  bool parse(const std::string& key, const toml::node& v, PolicyDuration* out, uint64_t most_ms = kHourMs) {
    double ms = -1;
    if (const auto* i = v.as_integer()) {
      ms = static_cast<double>(i->get()) * 1000;
    } else if (const auto* str = v.as_string()) {
      const std::string& text = str->get();
      std::size_t n = 0;
      double x = -1;
      try {
        x = std::stod(text, &n);
      } catch (const std::exception&) {
        n = 0;
      }
      const std::string unit = n ? text.substr(n) : "?";
      ms = unit == "ms" ? x : unit == "s" ? x * 1000 : unit == "m" || unit == "min" ? x * 60'000
         : unit == "h"                                                   ? x * 3'600'000
                                                                         : -1;
    }
    if (!(ms >= 1 && ms <= static_cast<double>(most_ms))) {
      error(v.source(), fmt::format("{} must be a duration from 1ms to {} such as \"30s\" or \"500ms\"", key,
                                    most_ms == kHourMs ? "1h" : "a week"));
      return false;
    }
    out->ms = static_cast<uint64_t>(ms);
    return true;
  }

  PolicyCaps section(const std::string& what, const toml::table& t) {
    PolicyCaps c;
    for (auto&& [k, v] : t) {
      const std::string key(k.str());
      bool known = false;
      // One branch per row of CUW_POLICY_KEYS: a value of the key's type, or an error.
#define CUW_POLICY_PARSE_(name, type)                            \
  if (key == #name) {                                            \
    known = true;                                                \
    type parsed{};                                               \
    if (parse(key, v, &parsed)) c.name = parsed;                 \
  }
      CUW_POLICY_KEYS(CUW_POLICY_PARSE_)
#undef CUW_POLICY_PARSE_
      if (!known)
        error(k.source(), fmt::format("unknown key '{}' in [{}] (use {})", key, what, key_list()));
    }
    auto above = [&](const std::optional<PolicyValue>& d, const std::optional<PolicyValue>& m, const char* dn,
                     const char* mn) {
      if (!d || !m || m->unlimited) return;
      if (d->unlimited || (!d->size.percent && !m->size.percent && d->size.bytes > m->size.bytes) ||
          (d->size.percent && m->size.percent && d->size.share > m->size.share))
        error(t.source(), fmt::format("[{}]: {} {} is above {} {}", what, dn, d->str(), mn, m->str()));
    };
    above(c.limit, c.max_limit, "limit", "max_limit");
    above(c.job_limit, c.max_job_limit, "job_limit", "max_job_limit");
    if (c.priority && c.max_priority && *c.priority > *c.max_priority)
      error(t.source(), fmt::format("[{}]: priority {} is above max_priority {}", what, *c.priority, *c.max_priority));
    return c;
  }

  /// [job.NAME] sections: `suspend = "never"` (or "allowed", the default), `max_suspended`
  /// (a duration up to a week) and `on_overdue` ("wait", the default, or "end_claim"),
  /// nothing else.
  void job_sections(const toml::node& n, std::map<std::string, JobRules>* out) {
    const toml::table* t = n.as_table();
    if (!t) {
      error(n.source(), "'job' must be a table of sections such as [job.NAME]");
      return;
    }
    for (auto&& [k, v] : *t) {
      const std::string name(k.str());
      const toml::table* st = v.as_table();
      if (!st) {
        error(k.source(), fmt::format("'job.{}' must be a section [job.{}]", name, name));
        continue;
      }
      JobRules r;
      for (auto&& [jk, jv] : *st) {
        const std::string key(jk.str());
        const auto* s = jv.as_string();
        if (key == "max_suspended") {
          PolicyDuration d;
          if (parse(key, jv, &d, kWeekMs)) r.max_suspended_ms = d.ms;
        } else if (key == "on_overdue") {
          if (!s || (s->get() != "wait" && s->get() != "end_claim"))
            error(jv.source(), "on_overdue must be \"wait\" or \"end_claim\"");
          else
            r.end_claim = s->get() == "end_claim";
        } else if (key != "suspend") {
          error(jk.source(),
                fmt::format("unknown key '{}' in [job.{}] (use suspend, max_suspended, on_overdue)", key, name));
        } else if (!s || (s->get() != "never" && s->get() != "allowed")) {
          error(jv.source(), "suspend must be \"never\" or \"allowed\"");
        } else {
          r.never_suspend = s->get() == "never";
        }
      }
      (*out)[name] = r;
    }
  }

  void named_sections(const std::string& kind, const toml::node& n, std::map<std::string, PolicyCaps>* out) {
    const toml::table* t = n.as_table();
    if (!t) {
      error(n.source(), fmt::format("'{}' must be a table of sections such as [{}.NAME]", kind, kind));
      return;
    }
    for (auto&& [k, v] : *t) {
      const std::string name(k.str());
      const toml::table* st = v.as_table();
      if (!st) {
        error(k.source(), fmt::format("'{}.{}' must be a section [{}.{}] with limit keys", kind, name, kind, name));
        continue;
      }
      if (!all_digits(name)) {
        bool exists = false;
        std::vector<char> buf(65536);
        if (kind == "user") {
          passwd pw{};
          passwd* res = nullptr;
          exists = getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &res) == 0 && res;
        } else {
          group gr{};
          group* res = nullptr;
          exists = getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &res) == 0 && res;
        }
        if (!exists) warn(k.source(), fmt::format("no {} named '{}' on this system (yet); the section applies once there is", kind, name));
      }
      (*out)[name] = section(kind + "." + name, *st);
    }
  }
};

}  // namespace

std::optional<Policy> parse_policy(std::string_view text, const std::string& source, std::vector<std::string>* errors,
                                   std::vector<std::string>* warnings) {
  const std::size_t errors_before = errors->size();
  if (std::string bad = toml_unsafe_message(text, source, "policy file"); !bad.empty()) {
    errors->push_back(std::move(bad));
    return std::nullopt;
  }
  toml::table doc;
  try {
    doc = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    errors->push_back(where(source, e.source()) + ": " + std::string(e.description()));
    return std::nullopt;
  }
  Parser p{source, errors, warnings};
  Policy pol;
  pol.file = source;
  for (auto&& [k, v] : doc) {
    const std::string key(k.str());
    if (key == "default") {
      if (const toml::table* t = v.as_table()) pol.defaults = p.section("default", *t);
      else p.error(k.source(), "'default' must be a section [default]");
    } else if (key == "user") {
      p.named_sections("user", v, &pol.users);
    } else if (key == "group") {
      p.named_sections("group", v, &pol.groups);
    } else if (key == "job") {
      p.job_sections(v, &pol.jobs);
    } else if (is_key(key)) {
      p.error(k.source(), fmt::format("'{}' outside a section: put it under [default] (or [user.NAME], [group.NAME])", key));
    } else {
      p.error(k.source(),
              fmt::format("unknown section or key '{}' (use [default], [user.NAME], [group.NAME], [job.NAME])", key));
    }
  }
  if (errors->size() != errors_before) return std::nullopt;
  return pol;
}

std::optional<Policy> load_policy(const std::string& path, std::vector<std::string>* errors,
                                  std::vector<std::string>* warnings) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    errors->push_back(path + ": cannot read the policy file");
    return std::nullopt;
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  if (ss.str().size() > (1u << 20)) {
    errors->push_back(path + ": policy file larger than 1 MiB; refused");
    return std::nullopt;
  }
  return parse_policy(ss.str(), path, errors, warnings);
}

}  // namespace cuw::daemon
