// cuwarden unit tests: out-of-memory reports on disk (daemon/src/model/oom_store.hpp): the
// reader refuses what is not a whole report (cut files, deep nesting, wrong types), a report
// written is read back the same, and the store keeps the newest 64.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <ftw.h>
#include <sstream>
#include <string>

#include "model/oom_store.hpp"

namespace d = cuw::daemon;

namespace {

std::string seed() {
  std::ifstream f(CUW_OOM_SEED);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

d::OomReport report(uint32_t pid, uint64_t time_ns) {
  auto r = d::parse_oom_report_file(seed(), nullptr);
  REQUIRE(r);
  r->pid = pid;
  r->event.e.time_ns = time_ns;
  return *r;
}

struct Dir {
  std::string path;
  Dir() {
    char t[] = "/tmp/cuwt-oom-XXXXXX";
    REQUIRE(mkdtemp(t));
    path = t;
  }
  ~Dir() {
    nftw(path.c_str(), [](const char* p, const struct stat*, int, FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
};

}  // namespace

TEST_CASE("oom_store.a_report_reads_back_as_written") {
  std::string why;
  const auto r = d::parse_oom_report_file(seed(), &why);
  INFO(why);
  REQUIRE(r);
  CHECK(r->pid == 4242);
  CHECK(r->snapshot.symbolized);
  REQUIRE(r->snapshot.snap.sites.size() == 1);
  CHECK(r->snapshot.snap.sites[0].frames[0].function == "train_step(int)");
  CHECK(r->snapshot.snap.sites[0].frames[1].python);
  const auto again = d::parse_oom_report_file(d::oom_report_file_text(*r), &why);
  REQUIRE(again);
  CHECK(d::oom_report_file_text(*again) == d::oom_report_file_text(*r));
}

TEST_CASE("oom_store.what_is_not_a_whole_report_is_refused_with_a_reason") {
  const std::string s = seed();
  std::string why;
  // Every cut of the file (a full disk, a crash before the rename) is refused.
  for (std::size_t n = 0; n + 2 < s.size(); n += 7) {
    why.clear();
    CHECK_FALSE(d::parse_oom_report_file(s.substr(0, n), &why));
    CHECK_FALSE(why.empty());
  }
  CHECK_FALSE(d::parse_oom_report_file(std::string(100000, '['), &why));
  CHECK(why == "nested too deeply");
  CHECK_FALSE(d::parse_oom_report_file(std::string(d::OomStore::kMaxFileBytes + 1, ' '), &why));
  std::string wrong = s;
  wrong.replace(wrong.find("\"pid\":4242"), 10, "\"pid\":-1  ");
  CHECK_FALSE(d::parse_oom_report_file(wrong, &why));
  std::string big_device = s;
  big_device.replace(big_device.find("\"ordinal\":0"), 11, "\"ordinal\":9999999");
  CHECK_FALSE(d::parse_oom_report_file(big_device, &why));
}

TEST_CASE("oom_store.keeps_the_newest_64_skips_what_is_not_a_report_and_has_one_daemon") {
  Dir dir;
  const std::string state = dir.path + "/state";
  std::string error;
  {
    d::OomStore store(state);
    REQUIRE(store.open(&error));
    for (uint32_t i = 1; i <= 70; ++i) REQUIRE(store.save(report(i, 1'000'000'000ULL * i), &error));
  }
  struct stat st{};
  REQUIRE(::stat(state.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  std::ofstream(state + "/oom/oom-99999999999999999999-1.json") << "{\"cuwarden_oom_report\": 1";
  REQUIRE(::symlink("/etc/passwd", (state + "/oom/oom-99999999999999999999-2.json").c_str()) == 0);
  d::OomStore store(state);
  REQUIRE(store.open(&error));
  d::OomStore second(state);  // one daemon per state directory
  CHECK_FALSE(second.open(&error));
  CHECK(error.find("another cuwardend") != std::string::npos);
  std::vector<std::string> skipped;
  const auto reports = store.load(&skipped);
  CHECK(skipped.size() == 2);
  REQUIRE(reports.size() == 62);  // the newest 64 files, less the two that are not reports
  CHECK(reports.front()->pid == 9);
  CHECK(reports.back()->pid == 70);
}
