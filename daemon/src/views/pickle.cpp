// cuwarden daemon view: the minimal pickle writer (see pickle.hpp). Opcodes and encodings are
// those of CPython's Lib/pickle.py for protocol 4.
#include "views/pickle.hpp"

#include <cstring>
#include <stdexcept>

namespace cuw::daemon::pickle {

namespace {

constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kNone = 'N';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kBinInt = 'J';
constexpr char kBinInt1 = 'K';
constexpr char kBinInt2 = 'M';
constexpr char kLong1 = '\x8a';
constexpr char kBinFloat = 'G';
constexpr char kShortBinUnicode = '\x8c';
constexpr char kBinUnicode = 'X';
constexpr char kEmptyDict = '}';
constexpr char kEmptyList = ']';
constexpr char kSetItems = 'u';
constexpr char kAppends = 'e';
constexpr char kTuple2 = '\x86';

/// CPython's pickler batches 1000 items per APPENDS / SETITEMS (pickle.py _BATCHSIZE).
constexpr std::size_t kBatch = 1000;

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07, min = 0x10000;
    bool ok = len != 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) ok = false;
      else cp = cp << 6 | (p[i + k] & 0x3f);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are invalid UTF-8.
    if (ok && (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))) ok = false;
    if (!ok) {
      out += "\xef\xbf\xbd";  // U+FFFD, one per bad lead byte: resynchronises on the next
      ++i;
      continue;
    }
    out.append(s.substr(i, len));
    i += len;
  }
  return out;
}

Writer::Writer() {
  out_.push_back(kProto);
  out_.push_back('\x04');
}

void Writer::before_value() {
  if (open_.empty()) return;
  Open& o = open_.back();
  if (o.batch == 0) out_.push_back(kMark);
}

void Writer::after_value() {
  if (open_.empty()) return;
  Open& o = open_.back();
  ++o.batch;
  // A dict's batch counts keys and values: 1000 pairs, like CPython.
  if (o.batch == (o.dict ? 2 * kBatch : kBatch)) flush(o);
}

void Writer::flush(Open& o) {
  if (o.batch == 0) return;
  if (o.dict && o.batch % 2 != 0) throw std::logic_error("pickle: a dict key without its value");
  out_.push_back(o.dict ? kSetItems : kAppends);
  o.batch = 0;
}

void Writer::none() {
  before_value();
  out_.push_back(kNone);
  after_value();
}

void Writer::boolean(bool v) {
  before_value();
  out_.push_back(v ? kNewTrue : kNewFalse);
  after_value();
}

void Writer::integer(int64_t v) {
  if (v >= 0) {
    uinteger(static_cast<uint64_t>(v));
    return;
  }
  before_value();
  if (v >= INT32_MIN) {
    out_.push_back(kBinInt);
    put_le(out_, static_cast<uint64_t>(v), 4);
  } else {
    // LONG1: the fewest little-endian two's-complement bytes that keep the sign.
    int bytes = 8;
    while (bytes > 1) {
      const int64_t hi = v >> (8 * (bytes - 1) - 1);  // the top byte and the sign bit below it
      if (hi != -1) break;
      --bytes;
    }
    out_.push_back(kLong1);
    out_.push_back(static_cast<char>(bytes));
    put_le(out_, static_cast<uint64_t>(v), bytes);
  }
  after_value();
}

void Writer::uinteger(uint64_t v) {
  before_value();
  if (v <= 0xff) {
    out_.push_back(kBinInt1);
    put_le(out_, v, 1);
  } else if (v <= 0xffff) {
    out_.push_back(kBinInt2);
    put_le(out_, v, 2);
  } else if (v <= 0x7fffffff) {
    out_.push_back(kBinInt);
    put_le(out_, v, 4);
  } else {
    // LONG1, as CPython's encode_long: bit_length / 8 + 1 bytes, so the top bit is a 0 sign bit.
    const int bits = 64 - __builtin_clzll(v);
    const int bytes = bits / 8 + 1;
    out_.push_back(kLong1);
    out_.push_back(static_cast<char>(bytes));
    put_le(out_, v, bytes > 8 ? 8 : bytes);
    if (bytes > 8) out_.push_back('\0');
  }
  after_value();
}

void Writer::real(double v) {
  before_value();
  out_.push_back(kBinFloat);
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));  // big-endian
  after_value();
}

void Writer::str(std::string_view v) {
  const std::string text = valid_utf8(v);
  before_value();
  if (text.size() < 256) {
    out_.push_back(kShortBinUnicode);
    out_.push_back(static_cast<char>(text.size()));
  } else {
    if (text.size() > 0xffffffffULL) throw std::length_error("pickle: a string over 4 GiB");
    out_.push_back(kBinUnicode);
    put_le(out_, text.size(), 4);
  }
  out_ += text;
  after_value();
}

void Writer::pair(int64_t a, int64_t b) {
  before_value();
  // The two items go on the stack outside any batch: TUPLE2 takes them straight back.
  std::vector<Open> saved;
  saved.swap(open_);
  integer(a);
  integer(b);
  saved.swap(open_);
  out_.push_back(kTuple2);
  after_value();
}

void Writer::begin_dict() {
  before_value();
  out_.push_back(kEmptyDict);
  open_.push_back({true, 0});
}

void Writer::end_dict() {
  if (open_.empty() || !open_.back().dict) throw std::logic_error("pickle: end_dict without a dict open");
  flush(open_.back());
  open_.pop_back();
  after_value();
}

void Writer::begin_list() {
  before_value();
  out_.push_back(kEmptyList);
  open_.push_back({false, 0});
}

void Writer::end_list() {
  if (open_.empty() || open_.back().dict) throw std::logic_error("pickle: end_list without a list open");
  flush(open_.back());
  open_.pop_back();
  after_value();
}

std::string Writer::finish() {
  if (!open_.empty()) throw std::logic_error("pickle: finish with a container open");
  out_.push_back(kStop);
  return std::move(out_);
}

}  // namespace cuw::daemon::pickle
