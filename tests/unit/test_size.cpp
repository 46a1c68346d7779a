// Unit tests: size and cap-spec parsing as users type them (CUWARDEN_LIMIT, --limit).
#include <catch2/catch.hpp>

#include "cuw/size.hpp"

using cuw::parse_limit;
using cuw::parse_size;

namespace {
uint64_t bytes_of(const char* s) {
  std::string err;
  auto v = parse_size(s, true, &err);
  INFO(s << ": " << err);
  REQUIRE(v);
  REQUIRE_FALSE(v->percent);
  return v->bytes;
}
std::string error_of(const char* s, bool allow_percent = true) {
  std::string err;
  auto v = parse_size(s, allow_percent, &err);
  INFO(s);
  REQUIRE_FALSE(v);
  REQUIRE_FALSE(err.empty());
  return err;
}
}  // namespace

TEST_CASE("sizes: bare numbers are bytes, binary and decimal units", "[size]") {
  CHECK(bytes_of("0") == 0);
  CHECK(bytes_of("4096") == 4096);
  CHECK(bytes_of("1K") == 1024);
  CHECK(bytes_of("8G") == 8ULL << 30);
  CHECK(bytes_of("512MiB") == 512ULL << 20);
  CHECK(bytes_of("2TiB") == 2ULL << 40);
  CHECK(bytes_of("1kB") == 1000);
  CHECK(bytes_of("3MB") == 3'000'000);
  CHECK(bytes_of("1GB") == 1'000'000'000);
  CHECK(bytes_of("1.5G") == 3ULL << 29);
  CHECK(bytes_of(" 7 GiB ") == 7ULL << 30);
  CHECK(bytes_of("0.5KiB") == 512);
}

TEST_CASE("sizes: units in any case, decimal ones SI, bytes whole", "[size]") {
  CHECK(bytes_of("8g") == 8ULL << 30);
  CHECK(bytes_of("8gib") == 8ULL << 30);
  CHECK(bytes_of("512mib") == 512ULL << 20);
  CHECK(bytes_of("512MIB") == 512ULL << 20);
  CHECK(bytes_of("8gb") == 8'000'000'000ULL);
  CHECK(bytes_of("8KB") == 8000);
  CHECK(bytes_of("2tb") == 2'000'000'000'000ULL);
  CHECK(bytes_of("64b") == 64);
  CHECK_THAT(error_of("0.5"), Catch::Contains("not a whole number of bytes"));
  CHECK_THAT(error_of("1.5B"), Catch::Contains("not a whole number of bytes"));
}

TEST_CASE("caps: under 1 MiB is a mistyped unit, refused with what was probably meant", "[size]") {
  std::string err;
  for (const char* tiny : {"75", "0", "1023K", "512kB"}) {
    INFO(tiny);
    CHECK_FALSE(cuw::parse_cap(tiny, true, &err));
    CHECK_THAT(err, Catch::Contains("smaller than any real allocation"));
  }
  CHECK_FALSE(cuw::parse_cap("75", true, &err));
  CHECK_THAT(err, Catch::Contains("75G") && Catch::Contains("75%"));
  CHECK_FALSE(cuw::parse_cap("75", false, &err));
  CHECK_THAT(err, !Catch::Contains("75%"));
  auto ok = cuw::parse_cap("1M", true, &err);
  REQUIRE(ok);
  CHECK(ok->bytes == cuw::kMinCap);
  CHECK(cuw::parse_cap("0.5%", true, &err));  // a share is checked by parse_size alone
  CHECK_FALSE(parse_limit("75", &err));
  CHECK_FALSE(parse_limit("0=8G,1=100", &err));
  CHECK_THAT(err, Catch::Contains("'100'"));
}

TEST_CASE("caps: the hint suggests only units that make sense for the number typed", "[size]") {
  std::string err;
  // A number with a unit was meant as written: no unit is appended to it.
  for (const char* with_unit : {"0G", "0MiB", "512K", "1023KiB"}) {
    INFO(with_unit);
    CHECK_FALSE(cuw::parse_cap(with_unit, true, &err));
    CHECK_THAT(err, Catch::Contains("smaller than any real allocation; the smallest cap is 1 MiB") &&
                        !Catch::Contains("give a unit") && !Catch::Contains("%)"));
  }
  // The bytes are exact (not "1024.00 KiB"), and n G is not offered where it is a petabyte.
  CHECK_FALSE(cuw::parse_cap("1048575", true, &err));
  CHECK_THAT(err, Catch::StartsWith("a cap of 1048575 B ('1048575')") && Catch::Contains("(1048575MiB)") &&
                      !Catch::Contains("1048575G") && !Catch::Contains("1048575%"));
  CHECK_FALSE(cuw::parse_cap("40", true, &err));
  CHECK_THAT(err, Catch::Contains("give a unit (40G, 40MiB) or a share (40%)"));
  CHECK_FALSE(cuw::parse_cap("0", true, &err));
  CHECK_THAT(err, !Catch::Contains("0G"));
}

TEST_CASE("caps: 2^64-1 bytes, the value that means no cap, is refused rather than read as none", "[size]") {
  std::string err;
  CHECK_FALSE(cuw::parse_cap("18446744073709551615", true, &err));
  CHECK_THAT(err, Catch::Contains("means no cap") && Catch::Contains("say none"));
  CHECK_FALSE(parse_limit("0=18446744073709551615", &err));
  CHECK(cuw::parse_cap("18446744073709551614", true, &err));
}

TEST_CASE("sizes: bad input gets a clear error", "[size]") {
  CHECK_THAT(error_of("8X"), Catch::Contains("unknown unit 'X'"));
  CHECK_THAT(error_of(""), Catch::Contains("empty"));
  CHECK_THAT(error_of("-1G"), Catch::Contains("negative"));
  CHECK_THAT(error_of("G"), Catch::Contains("does not start with a number"));
  CHECK_THAT(error_of("99999999999999999999"), Catch::Contains("too large"));
  CHECK_THAT(error_of("17179869184T"), Catch::Contains("too large"));
  CHECK_THAT(error_of("50%", false), Catch::Contains("percentage is not allowed"));
  CHECK_THAT(error_of("0%"), Catch::Contains("(0, 100]"));
  CHECK_THAT(error_of("101%"), Catch::Contains("(0, 100]"));
}

TEST_CASE("sizes: percentages resolve against physical memory", "[size]") {
  std::string err;
  auto v = parse_size("75%", true, &err);
  REQUIRE(v);
  REQUIRE(v->percent);
  CHECK(v->resolve(16ULL << 30) == 12ULL << 30);
  CHECK(v->resolve(0) == 0);
  auto full = parse_size("100%", true, &err);
  REQUIRE(full);
  CHECK(full->resolve(1000) == 1000);
}

TEST_CASE("caps: one for all devices, per-ordinal overrides", "[size]") {
  std::string err;
  auto all = parse_limit("8G", &err);
  REQUIRE(all);
  REQUIRE(all->for_device(0));
  CHECK(all->for_device(5)->bytes == 8ULL << 30);

  auto per = parse_limit("0=8G,1=4G", &err);
  REQUIRE(per);
  CHECK(per->for_device(0)->bytes == 8ULL << 30);
  CHECK(per->for_device(1)->bytes == 4ULL << 30);
  CHECK_FALSE(per->for_device(2));

  auto mixed = parse_limit("2G, 1=50%", &err);
  REQUIRE(mixed);
  CHECK(mixed->for_device(0)->bytes == 2ULL << 30);
  CHECK(mixed->for_device(1)->percent);
}

TEST_CASE("caps: malformed specs are rejected with the reason", "[size]") {
  std::string err;
  CHECK_FALSE(parse_limit("", &err));
  CHECK_FALSE(parse_limit("0=8G,0=4G", &err));
  CHECK_THAT(err, Catch::Contains("given twice"));
  CHECK_FALSE(parse_limit("x=8G", &err));
  CHECK_THAT(err, Catch::Contains("bad device ordinal"));
  CHECK_FALSE(parse_limit("64=1G", &err));
  // Found by tests/fuzz/fuzz_size: a long ordinal overflowed an int (UB) before being refused.
  CHECK_FALSE(parse_limit("18446744073709551616=1G", &err));
  CHECK_THAT(err, Catch::Contains("bad device ordinal"));
  CHECK_FALSE(parse_limit("8G,4G", &err));
  CHECK_THAT(err, Catch::Contains("more than one"));
  CHECK_FALSE(parse_limit("0=8G,,1=2G", &err));
  CHECK_FALSE(parse_limit("0=", &err));
  CHECK_FALSE(parse_limit("8Q", &err));
  CHECK_THAT(err, Catch::Contains("unknown unit"));
}

TEST_CASE("sizes: formatting", "[size]") {
  CHECK(cuw::format_bytes(0) == "0 B");
  CHECK(cuw::format_bytes(1023) == "1023 B");
  CHECK(cuw::format_bytes(1536) == "1.50 KiB");
  CHECK(cuw::format_bytes(8ULL << 30) == "8.00 GiB");
  CHECK(cuw::format_mib(4ULL << 30) == "4096MiB");
}
