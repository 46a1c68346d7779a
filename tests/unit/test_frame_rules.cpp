// Unit tests for the site's frame classes file (daemon/src/model/frame_rules.hpp): rules read
// in order before the built-in ones, the default file optional, and every malformed file
// refused with the reason, leaving the rules as they were.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

#include "model/frame_rules.hpp"

using cuw::daemon::load_frame_rules;
using cuw::frames::Class;
using cuw::frames::Rules;

namespace {

std::string write_temp(const std::string& text) {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir && *dir ? dir : "/tmp") + "/cuw_frames_" + std::to_string(getpid()) + "_" +
                     std::to_string(std::rand()) + ".toml";
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("frame rules: a site names its own framework, checked before the built-in rules") {
  const std::string path = write_temp(
      "# the lab's allocator\n"
      "[[rule]]\npath = \"/opt/lab/lib/libslab\"\nclass = \"framework\"\n"
      "[[rule]]\npath = \"/opt/lab/\"\nclass = \"user\"\n"
      "[[rule]]\npath = \"libcudart\"\nclass = \"user\"\n");
  Rules r;
  std::string why;
  REQUIRE(load_frame_rules(path, true, &r, &why));
  CHECK(r.site_rules() == 3);
  CHECK(r.native("/opt/lab/lib/libslab.so.2") == Class::framework);  // the first match wins
  CHECK(r.native("/opt/lab/bin/train") == Class::user);
  CHECK(r.native("/usr/lib/libcudart.so.13") == Class::user);  // before the built-in rules
  CHECK(r.native("/usr/lib/libcuda.so.1") == Class::cuda);
  unlink(path.c_str());
}

TEST_CASE("frame rules: the default file may be missing, a named one may not") {
  Rules r;
  std::string why;
  CHECK(load_frame_rules("/nonexistent/frames.toml", false, &r, &why));
  CHECK(r.site_rules() == 0);
  CHECK_FALSE(load_frame_rules("/nonexistent/frames.toml", true, &r, &why));
  CHECK(why.find("/nonexistent/frames.toml") != std::string::npos);
}

TEST_CASE("frame rules: a malformed file is refused with its reason and changes nothing") {
  const char* bad[][2] = {
      {"[[rule]]\npath = \"x\"\nclass = \"kernel\"\n", "class must be"},
      {"[[rule]]\nclass = \"user\"\n", "needs a non-empty path"},
      {"[[rule]]\npath = \"\"\nclass = \"user\"\n", "needs a non-empty path"},
      {"[[rule]]\npath = \"x\"\nclass = \"user\"\nweight = 3\n", "unknown key 'weight'"},
      {"framework = [\"x\"]\n", "unknown key 'framework'"},
      {"rule = 3\n", "array of tables"},
      {"[[rule]\n", "line 1"},
  };
  for (const auto& [text, reason] : bad) {
    const std::string path = write_temp(text);
    Rules r;
    r.add("/keep/", Class::framework);
    std::string why;
    INFO(text);
    CHECK_FALSE(load_frame_rules(path, true, &r, &why));
    CHECK(why.find(reason) != std::string::npos);
    CHECK(r.site_rules() == 1);
    unlink(path.c_str());
  }
}
