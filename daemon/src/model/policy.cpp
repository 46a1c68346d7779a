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
    return !c.limit && !c.max_limit && !c.job_limit && !c.max_job_limit && !c.enforce;
  };
  if (!none(defaults)) return false;
  for (const auto& [n, c] : users)
    if (!none(c)) return false;
  for (const auto& [n, c] : groups)
    if (!none(c)) return false;
  return true;
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

/// The lower of two values (unlimited is the highest); percentages compare as-is only
/// with percentages, otherwise the absolute one is taken as the tighter (it does not
/// depend on the device). Used to combine several groups.
const PolicyValue& lower(const PolicyValue& a, const PolicyValue& b) {
  if (a.unlimited) return b;
  if (b.unlimited) return a;
  if (a.size.percent != b.size.percent) return a.size.percent ? b : a;
  if (a.size.percent) return a.size.share <= b.size.share ? a : b;
  return a.size.bytes <= b.size.bytes ? a : b;
}

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
  auto pick = [&](std::optional<PolicyValue> PolicyCaps::*key, std::optional<PolicyValue>& out) {
    if (u && (u->*key)) {
      out = u->*key;
      sources.push_back("user " + user);
      return;
    }
    std::string from;
    for (const auto& [name, caps] : gs)
      if (caps->*key) {
        if (!out || &lower(*out, *(caps->*key)) != &*out) {
          out = caps->*key;
          from = "group " + name;
        }
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
  pick(&PolicyCaps::limit, e.limit);
  pick(&PolicyCaps::max_limit, e.max_limit);
  pick(&PolicyCaps::job_limit, e.job_limit);
  pick(&PolicyCaps::max_job_limit, e.max_job_limit);
  // The user's own section, else the strictest of the groups', else [default].
  if (u && u->enforce) {
    e.enforce = *u->enforce;
  } else {
    bool from_group = false;
    for (const auto& [name, caps] : gs)
      if (caps->enforce) {
        e.enforce = from_group ? std::max(e.enforce, *caps->enforce) : *caps->enforce;
        from_group = true;
      }
    if (!from_group && defaults.enforce) e.enforce = *defaults.enforce;
  }
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

  PolicyCaps section(const std::string& what, const toml::table& t) {
    PolicyCaps c;
    for (auto&& [k, v] : t) {
      const std::string key(k.str());
      if (key == "enforce") {
        const auto* str = v.as_string();
        if (str && str->get() == "report") c.enforce = Enforce::report;
        else if (str && str->get() == "kill") c.enforce = Enforce::kill;
        else error(v.source(), "enforce must be \"report\" or \"kill\"");
        continue;
      }
      std::optional<PolicyValue>* slot = key == "limit"           ? &c.limit
                                         : key == "max_limit"     ? &c.max_limit
                                         : key == "job_limit"     ? &c.job_limit
                                         : key == "max_job_limit" ? &c.max_job_limit
                                                                  : nullptr;
      if (!slot) {
        error(k.source(), fmt::format("unknown key '{}' in [{}] (use limit, max_limit, job_limit, max_job_limit, enforce)",
                                      key, what));
        continue;
      }
      *slot = value(key, v);
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
    return c;
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
    } else if (key == "limit" || key == "max_limit" || key == "job_limit" || key == "max_job_limit" ||
               key == "enforce") {
      p.error(k.source(), fmt::format("'{}' outside a section: put it under [default] (or [user.NAME], [group.NAME])", key));
    } else {
      p.error(k.source(), fmt::format("unknown section or key '{}' (use [default], [user.NAME], [group.NAME])", key));
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
