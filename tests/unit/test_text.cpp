// cuwarden unit tests: cuw::printable (common/include/cuw/text.hpp), the one filter every text
// view puts another user's text through, and the daemon's field_text that uses it.
#include <catch2/catch.hpp>
#include <string>

#include "base/util.hpp"
#include "cuw/text.hpp"

using cuw::printable;

TEST_CASE("text.printable_replaces_c0_del_and_c1_controls") {
  CHECK(printable("train\x1b[2Jx") == "train?[2Jx");
  CHECK(printable(std::string("a\0b", 3)) == "a?b");
  CHECK(printable("tab\tnl\n\x7f") == "tab?nl??");
  // U+009B (CSI), U+0080 and U+009F in UTF-8: one '?' each.
  CHECK(printable("x\xc2\x9b" "31mred") == "x?31mred");
  CHECK(printable("\xc2\x80\xc2\x9f") == "??");
  // Raw C1 bytes (a Latin-1 terminal's CSI) and other invalid UTF-8: one '?' per byte.
  CHECK(printable("\x9b" "31m") == "?31m");
  CHECK(printable("\xc0\x80") == "??");          // overlong NUL
  CHECK(printable("\xe0\x80\x80") == "???");     // overlong
  CHECK(printable("\xed\xa0\x80") == "???");     // a surrogate
  CHECK(printable("\xf4\x90\x80\x80") == "????");  // past U+10FFFF
  CHECK(printable("cut\xe6\xbc") == "cut??");
}

TEST_CASE("text.printable_keeps_printable_text_byte_for_byte") {
  const std::string ok = "resnet50 caf\xc3\xa9 \xc2\xa0nbsp \xe6\xbc\xa2\xe5\xad\x97 \xf0\x9f\x9a\x80 ~";
  CHECK(printable(ok) == ok);
  CHECK(printable("") == "");
}

TEST_CASE("text.field_text_filters_like_printable_within_its_field") {
  const char field[8] = {'j', 'o', 'b', '\xc2', '\x9b', '\x1b', 'z', 'z'};  // no NUL: cap ends it
  CHECK(cuw::daemon::field_text(field, sizeof field) == "job??zz");
  const char nul[8] = {'a', 'b', '\0', '\x1b', 0, 0, 0, 0};
  CHECK(cuw::daemon::field_text(nul, sizeof nul) == "ab");
}
