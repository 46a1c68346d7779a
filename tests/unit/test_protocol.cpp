// Unit tests: the daemon socket framing (bounded, validated, never trusts a length).
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "cuw/protocol.hpp"

namespace proto = cuw::proto;

namespace {
struct Pair {
  Pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fd) == 0); }
  ~Pair() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
  int fd[2];
};
}  // namespace

TEST_CASE("protocol: a message round-trips", "[protocol]") {
  Pair p;
  REQUIRE(proto::send_message(p.fd[0], proto::Command::get_state, 7, R"({"x":1})", 1000));
  std::string why;
  auto m = proto::recv_message(p.fd[1], 1000, &why);
  REQUIRE(m);
  CHECK(m->header.command == static_cast<uint16_t>(proto::Command::get_state));
  CHECK(m->header.seq == 7);
  CHECK(m->body == R"({"x":1})");
}

TEST_CASE("protocol: bad magic, version, oversized length and half messages are refused", "[protocol][hostile]") {
  std::string why;
  {
    Pair p;
    proto::Header h{0xdeadbeef, proto::kVersion, 1, 1, 0};
    REQUIRE(::write(p.fd[0], &h, sizeof h) == sizeof h);
    CHECK_FALSE(proto::recv_message(p.fd[1], 200, &why));
    CHECK_THAT(why, Catch::Contains("magic"));
  }
  {
    Pair p;
    proto::Header h{proto::kMagic, 42, 1, 1, 0};
    REQUIRE(::write(p.fd[0], &h, sizeof h) == sizeof h);
    CHECK_FALSE(proto::recv_message(p.fd[1], 200, &why));
    CHECK_THAT(why, Catch::Contains("version"));
  }
  {
    Pair p;
    proto::Header h{proto::kMagic, proto::kVersion, 1, 1, 0xffffffffu};
    REQUIRE(::write(p.fd[0], &h, sizeof h) == sizeof h);
    CHECK_FALSE(proto::recv_message(p.fd[1], 200, &why));
    CHECK_THAT(why, Catch::Contains("too large"));
  }
  {
    Pair p;  // a header promising 100 bytes, then only 10 and silence
    proto::Header h{proto::kMagic, proto::kVersion, 1, 1, 100};
    REQUIRE(::write(p.fd[0], &h, sizeof h) == sizeof h);
    REQUIRE(::write(p.fd[0], "0123456789", 10) == 10);
    CHECK_FALSE(proto::recv_message(p.fd[1], 200, &why));
    CHECK_THAT(why, Catch::Contains("short body"));
  }
  {
    Pair p;  // half a header, then EOF
    REQUIRE(::write(p.fd[0], "CUWP", 4) == 4);
    ::shutdown(p.fd[0], SHUT_WR);
    CHECK_FALSE(proto::recv_message(p.fd[1], 200, &why));
  }
}

TEST_CASE("protocol: request() explains a missing daemon", "[protocol]") {
  std::string why;
  auto m = proto::request("/nonexistent-dir-cuw/cuwardend.sock", proto::Command::get_state, "{}", 200, &why);
  CHECK_FALSE(m);
  CHECK_THAT(why, Catch::Contains("No such file"));
}
