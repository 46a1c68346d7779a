// cuwarden daemon model: a site's own frame classes from a TOML file (see frame_rules.hpp).
#include "model/frame_rules.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <toml++/toml.h>

#include "base/toml_guard.hpp"

namespace cuw::daemon {

bool load_frame_rules(const std::string& path, bool must_exist, frames::Rules* rules, std::string* error) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT && !must_exist) return true;
    *error = path + ": " + std::strerror(errno);
    return false;
  }
  std::ifstream f(path, std::ios::binary);
  std::ostringstream text;
  if (!f || !(text << f.rdbuf())) {
    *error = path + ": cannot read it";
    return false;
  }
  if (text.str().size() > (1u << 20)) {
    *error = path + ": larger than 1 MiB; refused";
    return false;
  }
  if (std::string bad = toml_unsafe_message(text.str(), path, "frames file"); !bad.empty()) {
    *error = std::move(bad);
    return false;
  }
  toml::table doc;
  try {
    doc = toml::parse(text.str(), path);
  } catch (const toml::parse_error& e) {
    *error = path + ": line " + std::to_string(e.source().begin.line) + ": " + std::string(e.description());
    return false;
  }
  frames::Rules out = *rules;
  for (const auto& [key, node] : doc) {
    if (key.str() != "rule") {
      *error = path + ": unknown key '" + std::string(key.str()) + "' (only [[rule]] tables)";
      return false;
    }
  }
  const toml::array* list = doc["rule"].as_array();
  if (doc.contains("rule") && !list) {
    *error = path + ": 'rule' must be an array of tables ([[rule]])";
    return false;
  }
  std::size_t n = 0;
  if (list)
    for (const toml::node& item : *list) {
      ++n;
      const toml::table* t = item.as_table();
      const std::string where = path + ": rule " + std::to_string(n);
      if (!t) {
        *error = where + ": not a table";
        return false;
      }
      for (const auto& [key, v] : *t)
        if (key.str() != "path" && key.str() != "class") {
          *error = where + ": unknown key '" + std::string(key.str()) + "'";
          return false;
        }
      const auto part = (*t)["path"].value<std::string>();
      const auto cls_name = (*t)["class"].value<std::string>();
      frames::Class cls{};
      if (!part || part->empty()) {
        *error = where + ": needs a non-empty path";
        return false;
      }
      if (!cls_name || !frames::class_from_name(*cls_name, &cls)) {
        *error = where + ": class must be user, framework, cuda, interpreter, libc or cuwarden";
        return false;
      }
      out.add(*part, cls);
    }
  *rules = std::move(out);
  return true;
}

}  // namespace cuw::daemon
