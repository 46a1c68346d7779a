// Unit tests for the daemon's policy file (daemon/src/model/policy.cpp): what parses, what each
// mistake says (with file:line:column), and precedence user > group > default.
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include "cuw/ring.hpp"
#include "model/policy.hpp"

using cuw::daemon::parse_policy;
using cuw::daemon::Policy;

namespace {

constexpr uint64_t kGiB = 1ULL << 30;

/// The errors joined by newlines.
std::string fmt_errors(const std::vector<std::string>& errors) {
  std::string all;
  for (const auto& e : errors) all += e + "\n";
  return all;
}

/// Parse `text`; on failure return the errors joined by newlines.
std::string errors_of(const std::string& text, std::vector<std::string>* warnings = nullptr) {
  std::vector<std::string> errors, w;
  auto p = parse_policy(text, "p.toml", &errors, warnings ? warnings : &w);
  const std::string all = fmt_errors(errors);
  if (p && !all.empty()) return "parsed despite errors: " + all;
  return all;
}

/// Parse `text`, which must be a valid policy (the test fails with its errors otherwise).
Policy parsed(const std::string& text) {
  std::vector<std::string> errors, warnings;
  auto p = parse_policy(text, "p.toml", &errors, &warnings);
  INFO(fmt_errors(errors));
  REQUIRE(p);
  return std::move(*p);
}

}  // namespace

TEST_CASE("policy: the documented example parses") {
  std::vector<std::string> errors, warnings;
  auto p = parse_policy(R"(# cuwarden policy
[default]
limit = "40G"
max_limit = "80G"
job_limit = "160G"
max_job_limit = 343597383680   # bytes as an integer
[user.root]
max_limit = "none"
[group.0]
max_limit = "75%"
)",
                        "p.toml", &errors, &warnings);
  REQUIRE(errors.empty());
  REQUIRE(p);
  CHECK(p->defaults.limit->resolve(0) == 40 * kGiB);
  CHECK(p->defaults.max_limit->resolve(0) == 80 * kGiB);
  CHECK(p->defaults.job_limit->resolve(0) == 160 * kGiB);
  CHECK(p->defaults.max_job_limit->resolve(0) == 320 * kGiB);
  CHECK(p->users.at("root").max_limit->unlimited);
  CHECK(p->users.at("root").max_limit->resolve(100) == cuw::ring::kNoLimit);
  CHECK(p->groups.at("0").max_limit->resolve(100 * kGiB) == 75 * kGiB);
  CHECK(!p->empty());
  CHECK(parse_policy("", "p.toml", &errors, &warnings)->empty());
}

TEST_CASE("policy: every mistake is reported with file:line:column") {
  // TOML syntax.
  CHECK_THAT(errors_of("[default]\nlimit = \"40G\nmax_limit = \"80G\"\n"), Catch::StartsWith("p.toml:2:"));
  CHECK_THAT(errors_of("[default\n"), Catch::StartsWith("p.toml:1:"));
  // Unknown key, section, misplaced key.
  CHECK_THAT(errors_of("[default]\nlimit = \"40G\"\nmaxlimit = \"80G\"\n"),
             Catch::Contains("p.toml:3:1: unknown key 'maxlimit' in [default]"));
  CHECK_THAT(errors_of("[defaults]\nlimit = \"40G\"\n"), Catch::Contains("p.toml:1:2: unknown section or key 'defaults'"));
  CHECK_THAT(errors_of("limit = \"40G\"\n"), Catch::Contains("p.toml:1:1: 'limit' outside a section"));
  CHECK_THAT(errors_of("[user]\nalice = \"40G\"\n"), Catch::Contains("p.toml:2:1: 'user.alice' must be a section"));
  // Bad sizes and types.
  CHECK_THAT(errors_of("[default]\nlimit = \"40X\"\n"), Catch::Contains("p.toml:2:9: limit = \"40X\": "));
  CHECK_THAT(errors_of("[default]\n\n\n  max_limit = -5\n"), Catch::Contains("p.toml:4:15: max_limit must not be negative"));
  CHECK_THAT(errors_of("[default]\nlimit = true\n"), Catch::Contains("p.toml:2:9: limit must be a size"));
  CHECK_THAT(errors_of("[group.0]\njob_limit = \"50%\"\n"),
             Catch::Contains("p.toml:2:13: job_limit = \"50%\"") && Catch::Contains("one size for all its GPUs"));
  // A default above the max of the same section.
  CHECK_THAT(errors_of("[default]\nlimit = \"40G\"\nmax_limit = \"20G\"\n"),
             Catch::Contains("p.toml:1:1: [default]: limit 40.00 GiB is above max_limit 20.00 GiB"));
  // Several mistakes: all of them, in one go.
  const std::string many = errors_of("[default]\nlimit = \"1Q\"\nfoo = 1\n[user.root]\nmax_job_limit = \"x\"\n");
  CHECK(std::count(many.begin(), many.end(), '\n') == 3);
  CHECK_THAT(many, Catch::Contains("p.toml:2:") && Catch::Contains("p.toml:3:") && Catch::Contains("p.toml:5:"));
}

TEST_CASE("policy: a bare integer is bytes, and a cap under 1 MiB is an error with a hint") {
  // `limit = 5` would cap every process at 5 bytes: an error at its line, with the unit to add.
  CHECK_THAT(errors_of("[default]\nlimit = 5\n"),
             Catch::Contains("p.toml:2:9: limit = 5 is 5 bytes, under the smallest cap (1.00 MiB)") &&
                 Catch::Contains("limit = \"5G\""));
  CHECK_THAT(errors_of("[group.0]\nmax_job_limit = 1024\n"), Catch::Contains("p.toml:2:17: max_job_limit = 1024 is"));
  CHECK_THAT(errors_of("[default]\nmax_limit = 0\n"), Catch::Contains("p.toml:2:13: max_limit = 0 is 0 bytes"));
  CHECK_THAT(errors_of("[default]\njob_limit = \"5\"\n"), Catch::Contains("p.toml:2:13: job_limit = \"5\": a cap of 5 B"));
  // From 1 MiB up a bare integer keeps its documented meaning: bytes.
  std::vector<std::string> errors, warnings;
  auto p = parse_policy("[default]\nlimit = 1048576\nmax_limit = 42949672960\n", "p.toml", &errors, &warnings);
  REQUIRE(p);
  CHECK(p->defaults.limit->resolve(0) == 1048576);
  CHECK(p->defaults.max_limit->resolve(0) == 40 * kGiB);
  // A share that comes out under the floor on a small device gives the floor, not less.
  p = parse_policy("[default]\nlimit = \"0.001%\"\n", "p.toml", &errors, &warnings);
  REQUIRE(p);
  CHECK(p->defaults.limit->resolve(16 * kGiB) == cuw::kMinCap);
}

TEST_CASE("policy: unknown user and group names are warnings, not errors") {
  std::vector<std::string> warnings;
  CHECK(errors_of("[user.no-such-user-cuwt]\nmax_limit = \"1G\"\n[group.no-such-group-cuwt]\nlimit = \"1G\"\n",
                  &warnings) == "");
  REQUIRE(warnings.size() == 2);
  std::sort(warnings.begin(), warnings.end());
  CHECK_THAT(warnings[0], Catch::StartsWith("p.toml:1:7: no user named 'no-such-user-cuwt'"));
  CHECK_THAT(warnings[1], Catch::StartsWith("p.toml:3:8: no group named 'no-such-group-cuwt'"));
}

TEST_CASE("policy: precedence is user, then the lowest of the user's groups, then default") {
  const uid_t uid = getuid();
  passwd* pw = getpwuid(uid);
  REQUIRE(pw);
  const std::string gid = std::to_string(pw->pw_gid);
  const auto parse = parsed;
  {
    auto p = parse("[default]\nlimit = \"4G\"\nmax_limit = \"80G\"\njob_limit = \"100G\"\n");
    const auto& e = p.for_user(uid);
    CHECK(e.limit->resolve(0) == 4 * kGiB);
    CHECK(e.max_limit->resolve(0) == 80 * kGiB);
    CHECK(e.job_limit->resolve(0) == 100 * kGiB);
    CHECK(!e.max_job_limit);
    CHECK(e.source == "default");
  }
  {
    // The user's primary group (by number) lowers the max; the default limit still applies.
    auto p = parse("[default]\nlimit = \"4G\"\nmax_limit = \"80G\"\n[group." + gid + "]\nmax_limit = \"10G\"\n");
    const auto& e = p.for_user(uid);
    CHECK(e.max_limit->resolve(0) == 10 * kGiB);
    CHECK(e.limit->resolve(0) == 4 * kGiB);
    CHECK_THAT(e.source, Catch::Contains("group " + gid) && Catch::Contains("default"));
  }
  {
    // The user's section wins over the group, key by key; by name.
    auto p = parse("[default]\nmax_limit = \"80G\"\n[group." + gid + "]\nmax_limit = \"10G\"\nlimit = \"2G\"\n[user." +
                   pw->pw_name + "]\nmax_limit = \"20G\"\n");
    const auto& e = p.for_user(uid);
    CHECK(e.max_limit->resolve(0) == 20 * kGiB);
    CHECK(e.limit->resolve(0) == 2 * kGiB);
  }
  {
    // Several groups: the lowest. The primary group by number and by name are two
    // sections for the same group here, standing in for two groups.
    group* gr = getgrgid(pw->pw_gid);
    if (gr) {
      auto p = parse("[group." + gid + "]\nmax_limit = \"30G\"\n[group." + std::string(gr->gr_name) +
                     "]\nmax_limit = \"12G\"\n");
      CHECK(p.for_user(uid).max_limit->resolve(0) == 12 * kGiB);
    }
  }
  {
    // Another user's sections do not apply.
    auto p = parse("[user.4000000]\nmax_limit = \"1G\"\n");
    CHECK(!p.for_user(uid).max_limit);
    CHECK(p.for_user(4000000).max_limit->resolve(0) == kGiB);
  }
}

TEST_CASE("policy: enforce is report unless a section says kill and the user's own section wins") {
  using cuw::daemon::Enforce;
  const uid_t uid = getuid();
  passwd* pw = getpwuid(uid);
  REQUIRE(pw);
  const std::string gid = std::to_string(pw->pw_gid);
  const auto parse = parsed;
  CHECK(parse("[default]\nmax_limit = \"8G\"\n").for_user(uid).enforce_or() == Enforce::report);
  CHECK(parse("[default]\nenforce = \"kill\"\n").for_user(uid).enforce_or() == Enforce::kill);
  CHECK_FALSE(parse("[default]\nenforce = \"report\"\n").empty());
  // A group's kill over the default's report; the user's own report over both.
  CHECK(parse("[default]\nenforce = \"report\"\n[group." + gid + "]\nenforce = \"kill\"\n").for_user(uid).enforce_or() ==
        Enforce::kill);
  CHECK(parse("[group." + gid + "]\nenforce = \"kill\"\n[user." + pw->pw_name + "]\nenforce = \"report\"\n")
            .for_user(uid)
            .enforce_or() == Enforce::report);
  // Of two groups, the stricter.
  if (group* gr = getgrgid(pw->pw_gid))
    CHECK(parse("[group." + gid + "]\nenforce = \"report\"\n[group." + std::string(gr->gr_name) +
                "]\nenforce = \"kill\"\n")
              .for_user(uid)
              .enforce_or() == Enforce::kill);
  // Anything else is an error with its place.
  CHECK_THAT(errors_of("[default]\nenforce = \"terminate\"\n"),
             Catch::StartsWith("p.toml:2:11: enforce must be \"report\" or \"kill\""));
  CHECK_THAT(errors_of("[default]\nenforce = true\n"), Catch::Contains("enforce must be"));
  CHECK_THAT(errors_of("enforce = \"kill\"\n"), Catch::Contains("outside a section"));
}

TEST_CASE("policy: a character the TOML parser mishandles is refused with its place") {
  // toml++ 3.3.0 reaches __builtin_unreachable on U+00A1..U+0499, U+2C5E..U+2FFF,
  // U+3001..U+3057 and U+FB26..U+FEFE where it asks whether a character is whitespace (the
  // fuzzer's inputs: a table header; U+FB3B opening the file; a user name with an accent).
  CHECK_THAT(errors_of("[defFFF\xc4\xb9" "FF]\nlimit = \"1G\"\n"),
             Catch::StartsWith("p.toml:1:8: character U+0139 is not accepted"));
  CHECK_THAT(errors_of("[default]\nlimit = \"1G\"\n[user.jos\xc3\xa9]\nlimit = \"2G\"\n"),
             Catch::StartsWith("p.toml:3:10: character U+00E9"));
  CHECK_THAT(errors_of("# caf\xc3\xa9\n[default]\nlimit = \"1G\"\n"), Catch::StartsWith("p.toml:1:6: character U+00E9"));
  CHECK_THAT(errors_of("[default]\nlimit = 1\xef\xbb\xbd\n"), Catch::StartsWith("p.toml:2:10: character U+FEFD"));
  CHECK_THAT(errors_of("\xef\xac\xbb"), Catch::StartsWith("p.toml:1:1: character U+FB3B"));
  for (const char* edge : {"\xe2\xb1\x9e", "\xe2\xbf\xbf", "\xe3\x80\x81", "\xe3\x81\x97", "\xef\xac\xa6"})
    CHECK_THAT(errors_of(std::string("# ") + edge + "\n[default]\nlimit = \"1G\"\n"), Catch::Contains("is not accepted"));
  // Outside those ranges (U+3000, U+3058, U+FB25, U+FEFF are whitespace or ruled out before
  // the switch), and as an escape in a quoted key, it parses.
  for (const char* fine : {"\xe3\x80\x80", "\xe3\x81\x98", "\xef\xac\xa5", "\xe2\xb1\x9d"})
    CHECK(errors_of(std::string("# x") + fine + "\n[default]\nlimit = \"1G\"\n").empty());
  CHECK(errors_of("# \xe6\x97\xa5\xe6\x9c\xac\n[default]\nlimit = \"1G\"\n").empty());
  CHECK(errors_of("[default]\nlimit = \"1G\"\n[user.\"jos\\u00E9\"]\nlimit = \"2G\"\n").empty());
}

TEST_CASE("policy: priorities default to 0, a process may only lower its own unless max_priority allows") {
  const uid_t uid = getuid();
  passwd* pw = getpwuid(uid);
  REQUIRE(pw);
  const std::string gid = std::to_string(pw->pw_gid);
  const auto parse = parsed;
  {
    auto p = parse("");
    const auto& e = p.for_user(uid);
    CHECK(e.priority_for(std::nullopt) == 0);
    CHECK(e.priority_for(5) == 0);    // no raise without max_priority
    CHECK(e.priority_for(-7) == -7);  // lowering is always allowed
    CHECK(e.room_wait_ms() == 30'000);
    CHECK(e.resume_after_ms() == 2'000);
    CHECK(e.min_run_ms() == 10'000);
  }
  {
    auto p = parse("[default]\npriority = 10\nmax_priority = 50\nroom_wait = \"5s\"\nresume_after = 500\n"
                   "min_run = \"1500ms\"\n[group." + gid + "]\nmax_priority = 20\n");
    const auto& e = p.for_user(uid);
    CHECK(e.priority_for(std::nullopt) == 10);
    CHECK(e.priority_for(100) == 20);  // the group's max, below the default's
    CHECK(e.priority_for(15) == 15);
    CHECK(e.room_wait_ms() == 5'000);
    CHECK(e.resume_after_ms() == 500'000);
    CHECK(e.min_run_ms() == 1'500);
    CHECK_FALSE(p.empty());
  }
  {
    // The user's own section wins over the groups'.
    auto p = parse("[group." + gid + "]\npriority = -5\n[user." + pw->pw_name + "]\npriority = 3\n");
    CHECK(p.for_user(uid).priority_for(std::nullopt) == 3);
  }
  CHECK_THAT(errors_of("[default]\npriority = 2000\n"),
             Catch::StartsWith("p.toml:2:12: priority must be an integer from -1000 to 1000"));
  CHECK_THAT(errors_of("[default]\npriority = \"high\"\n"), Catch::Contains("priority must be an integer"));
  CHECK_THAT(errors_of("[default]\npriority = 5\nmax_priority = 1\n"), Catch::Contains("priority 5 is above max_priority 1"));
  CHECK_THAT(errors_of("[default]\nroom_wait = \"forever\"\n"), Catch::Contains("room_wait must be a duration"));
  CHECK_THAT(errors_of("[default]\nmin_run = \"2h\"\n"), Catch::Contains("min_run must be a duration"));
  CHECK_THAT(errors_of("[default]\npriorty = 1\n"), Catch::Contains("unknown key 'priorty' in [default] (use limit, "));
  CHECK_THAT(errors_of("priority = 1\n"), Catch::Contains("'priority' outside a section"));
}

TEST_CASE("policy: a job's section says whether it may be suspended to make room") {
  std::vector<std::string> errors, warnings;
  auto p = parse_policy("[job.nightly]\nsuspend = \"never\"\n[job.batch]\nsuspend = \"allowed\"\n", "p.toml", &errors,
                        &warnings);
  REQUIRE(p);
  CHECK(p->never_suspend("nightly"));
  CHECK_FALSE(p->never_suspend("batch"));
  CHECK_FALSE(p->never_suspend("other"));
  CHECK_FALSE(p->never_suspend(""));
  CHECK_FALSE(p->empty());
  CHECK_THAT(errors_of("[job.x]\nsuspend = \"sometimes\"\n"), Catch::StartsWith("p.toml:2:11: suspend must be \"never\""));
  CHECK_THAT(errors_of("[job.x]\nlimit = \"1G\"\n"),
             Catch::Contains("unknown key 'limit' in [job.x] (use suspend, max_suspended, on_overdue)"));
  auto q = parse_policy("[job.long]\nmax_suspended = \"36h\"\n", "p.toml", &errors, &warnings);
  REQUIRE(q);
  REQUIRE(q->job_rules("long"));
  CHECK(q->job_rules("long")->max_suspended_ms == 36 * 3'600'000ULL);
  CHECK_FALSE(q->job_rules("long")->never_suspend);
  CHECK_FALSE(q->job_rules("long")->end_claim);
  auto e = parse_policy("[job.short]\nmax_suspended = \"1h\"\non_overdue = \"end_claim\"\n", "p.toml", &errors, &warnings);
  REQUIRE(e);
  REQUIRE(e->job_rules("short"));
  CHECK(e->job_rules("short")->end_claim);
  CHECK_FALSE(e->empty());
  CHECK_THAT(errors_of("[job.x]\non_overdue = \"kill\"\n"), Catch::Contains("on_overdue must be \"wait\" or \"end_claim\""));
  CHECK_THAT(errors_of("[job.x]\nmax_suspended = \"30d\"\n"), Catch::Contains("max_suspended must be a duration from 1ms to a week"));
  CHECK_THAT(errors_of("[jobs.x]\nsuspend = \"never\"\n"), Catch::Contains("[job.NAME]"));
}
