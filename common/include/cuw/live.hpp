// cuwarden: the live segment, a process's live allocations and call sites where the daemon
// can read them without ever blocking the program. One file per interposed process beside
// its ring ("live-<pid>-<starttime>.cwl"), written by the interposer only, read by the
// daemon (snapshots, out-of-memory reports) and by the interposer itself (its OOM paragraph
// and leak report).
//
// Why beside the ring and not in it: the ring's events are best effort (a full ring drops
// them), so a table rebuilt from events is wrong as soon as one is lost; these records are
// the interposer's own live tables, exact whatever was dropped.
//
// File layout (little-endian, fixed-width), grown with ftruncate as needed:
//   [0, kHeaderBytes)   LiveHeader
//   then regions, each page-aligned, allocated upwards and never reused:
//     a table's slot array (LiveSlot[capacity]); when a table grows, the writer fills a new
//     region, publishes it in the header (under `layout`, a sequence lock) and punches the
//     old one out of the file;
//     a log's bytes (append-only records, below); when one fills, the writer copies it into
//     a region twice the size and publishes that the same way.
//
// Writer protocol (one writer at a time per table or log: the interposer's locks):
//   a slot is written fields first, key last (release); removed by storing kTomb; a key
//   overwritten in place (rare) first goes to kTomb. A log record is written whole before
//   `used` (release) covers it.
// Reader protocol: read `layout` (acquire; odd: a move in progress, retry), the descriptors,
//   copy, read `layout` again: equal means the copy came from regions still published. A
//   slot is taken when its key reads the same (not empty, not tomb) before and after its
//   fields. Every byte is untrusted: bounds come from the reader's own mapping size.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace cuw::live {

inline constexpr uint64_t kMagic = 0x31455649'4c575543ULL;  // "CUWLIVE1"
/// Version of this layout. Same rules as the ring's (ring.hpp kAbiVersion). Version 2:
/// Table::pooled holds device 0's pooled blocks only, devices 1-15's are in device_pooled
/// (version 1 kept every device's there), so a reader of version 1 alone refuses the file
/// rather than miss blocks. Readers read both.
inline constexpr uint32_t kAbiVersion = 2;
inline constexpr uint32_t kOldestAbiVersion = 1;  ///< the oldest version a reader reads
inline constexpr uint32_t kHeaderBytes = 4096;
inline constexpr uint64_t kPage = 4096;
/// The most a writer lets the file grow to (the reader refuses larger offsets).
inline constexpr uint64_t kMaxFileBytes = 4ULL << 30;
inline constexpr const char* kFilePrefix = "live-";
inline constexpr const char* kFileSuffix = ".cwl";

/// The live tables, one per kind of memory the interposer tracks.
enum class Table : uint32_t {
  device = 0,    ///< device memory from the driver's allocation calls (passthrough), graph memory
  handles = 1,   ///< cuMemCreate handles and CUDA arrays (LiveSlot::rec's api tells which)
  host = 2,      ///< pinned host memory
  pooled = 3,    ///< blocks a pooling backend handed the program
  segments = 4,  ///< driver memory a pooling backend holds (cache: allocations; vmm: granules)
  count_ = 5,
};
inline constexpr uint32_t kTables = static_cast<uint32_t>(Table::count_);
/// Devices with a pooled table of their own (ring::kMaxDevices), and every table slot:
/// the kTables, then device_pooled's (LiveHeader).
inline constexpr uint32_t kPooledDevices = 16;
inline constexpr uint32_t kTableSlots = kTables + kPooledDevices - 1;

/// Append-only logs.
enum class Log : uint32_t {
  sites = 0,    ///< SiteRecord: each distinct call site once
  modules = 1,  ///< ModuleRecord: each ELF module loaded in the process that a site's pc lay in
  codes = 2,    ///< CodeRecord: each Python code object a site named
  count_ = 3,
};
inline constexpr uint32_t kLogs = static_cast<uint32_t>(Log::count_);

/// One live record, 32 bytes. `key` the address (or handle); `rec` the interposer's packed
/// record: bytes (bits 0..50), device ordinal + 1 (bits 51..55), ring::Api (bits 56..63);
/// `stream` the stream of a stream-ordered allocation, else 0; `tag` the time (low 32 bits:
/// CLOCK_REALTIME ns >> 20, about 1 ms a unit, modulo 2^32: 52 days; read back against
/// LiveHeader::created_ns) and the call site id (high 32 bits).
struct LiveSlot {
  uint64_t key;
  uint64_t rec;
  uint64_t stream;
  uint64_t tag;
};
static_assert(sizeof(LiveSlot) == 32);
inline constexpr uint64_t kEmpty = 0, kTomb = ~0ULL;

inline constexpr int kBytesBits = 51;
constexpr uint64_t rec_bytes(uint64_t rec) noexcept { return rec & ((uint64_t{1} << kBytesBits) - 1); }
constexpr int rec_device(uint64_t rec) noexcept { return static_cast<int>((rec >> kBytesBits) & 31) - 1; }
constexpr uint16_t rec_api(uint64_t rec) noexcept { return static_cast<uint16_t>(rec >> 56); }
inline constexpr int kTagShift = 20;  ///< a tag's time unit: 2^20 ns
constexpr uint32_t tag_site(uint64_t tag) noexcept { return static_cast<uint32_t>(tag >> 32); }
/// A tag for an allocation made at `time_ns` (CLOCK_REALTIME) at call site `site`.
constexpr uint64_t make_tag(uint64_t time_ns, uint32_t site) noexcept {
  return (time_ns >> kTagShift & 0xffffffffULL) | uint64_t{site} << 32;
}
/// How long before the segment's creation time a tag may have been taken, in tag units
/// (about 4.3 s): allocations read a coarse clock, which runs a few ms behind the precise one
/// the creation time comes from, so the process's first allocations can predate it.
inline constexpr uint64_t kTagSlack = uint64_t{1} << 12;
/// The time a tag holds, in ns, for a segment created at `created_ns` (the tag's 32 bits
/// wrap every 52 days: the first such time at or after creation, less kTagSlack).
constexpr uint64_t tag_time_ns(uint64_t tag, uint64_t created_ns) noexcept {
  constexpr uint64_t kWrap = uint64_t{1} << 32;
  const uint64_t base = created_ns >> kTagShift;
  uint64_t t = (base & ~(kWrap - 1)) | (tag & (kWrap - 1));
  if (t + kTagSlack < base) t += kWrap;                                    // wrapped since creation
  else if (t >= kWrap && t > base + kWrap - kTagSlack) t -= kWrap;         // just before, across a wrap
  return t << kTagShift;
}
static_assert(tag_time_ns(make_tag(1'700'000'123'456'789ULL, 7), 1'700'000'000'000'000ULL) >> kTagShift ==
              1'700'000'123'456'789ULL >> kTagShift);
// Taken 3 ms before the creation time: that time, not 52 days later.
static_assert(tag_time_ns(make_tag(1'700'000'000'000'000ULL - 3'000'000, 1), 1'700'000'000'000'000ULL) >>
                  kTagShift ==
              (1'700'000'000'000'000ULL - 3'000'000) >> kTagShift);
// Taken 3 ms before a creation time just past a wrap of the 32 bits.
static_assert(tag_time_ns(make_tag((uint64_t{5} << 52) - 3'000'000, 1), (uint64_t{5} << 52) + 1'000'000) >>
                  kTagShift ==
              ((uint64_t{5} << 52) - 3'000'000) >> kTagShift);
static_assert(tag_site(make_tag(1, 7)) == 7);

/// Where a table's slots are: `offset` bytes into the file, `capacity` slots (0: none yet).
struct TableDesc {
  uint64_t offset;
  uint64_t capacity;
};
/// Where a log is: `offset` bytes into the file, `capacity` bytes, `used` bytes published.
struct LogDesc {
  uint64_t offset;
  uint64_t capacity;
  std::atomic<uint64_t> used;
  uint64_t records;  ///< records published (informational)
};

/// Log record: a call site. Frames innermost first: `native` return addresses, then
/// `python` frames (code id << 32 | line). Size: 16 + 8 * (native + python), a multiple of 8.
struct SiteRecord {
  uint32_t size;    ///< bytes of this record
  uint32_t id;      ///< >= 1, in log order
  uint16_t native;  ///< native frame count
  uint16_t python;  ///< Python frame count
  uint32_t hash;
  // uint64_t frames[native + python];
};
static_assert(sizeof(SiteRecord) == 16);

/// Log record: an ELF module. [start, end) its PT_LOAD extent in the process, `bias` its
/// load bias; then `path_len` bytes of path (no NUL), padded to 8.
struct ModuleRecord {
  uint32_t size;
  uint32_t path_len;
  uint64_t start, end, bias;
  char build_id[48];  ///< hex, NUL-terminated, empty when the module has none
};
static_assert(sizeof(ModuleRecord) == 80);

/// Log record: a Python code object's names; then file and function bytes (no NULs), padded to 8.
struct CodeRecord {
  uint32_t size;
  uint32_t id;
  uint32_t first_line;
  uint16_t file_len;
  uint16_t function_len;
};
static_assert(sizeof(CodeRecord) == 16);

/// The file header.
struct LiveHeader {
  uint64_t magic;              ///< kMagic, stored last (release) by the writer
  uint32_t abi_version;
  uint32_t header_size;        ///< sizeof(LiveHeader) as the writer compiled it
  uint32_t pid;
  uint32_t uid;
  uint64_t start_time;         ///< as the ring's: the pid-reuse guard
  uint64_t created_ns;         ///< CLOCK_REALTIME ns at creation (LiveSlot tags read against it)
  uint32_t callsite_frames;    ///< CUWARDEN_CALLSITES
  uint32_t pyframes;           ///< 1: Python frames are captured
  std::atomic<uint32_t> incomplete;  ///< 1: a record could not be stored (file limit, memory):
                                     ///< the tables are no longer exact
  uint32_t reserved_word;
  std::atomic<uint64_t> layout;  ///< sequence lock over the descriptors: tables[], logs[], device_pooled[]
  uint64_t reserved_words[8];
  TableDesc tables[kTables];
  LogDesc logs[kLogs];
  /// The blocks the pools of devices 1 .. kPooledDevices - 1 handed out, one table each (a
  /// pool's hit takes its device's lock only, not one shared by every device); `tables`'s
  /// Table::pooled holds device 0's. A writer of version 1 (its header_size ends before
  /// them) keeps every device's there. Readers return their records as Table::pooled.
  TableDesc device_pooled[kPooledDevices - 1];
};
static_assert(sizeof(LiveHeader) <= kHeaderBytes);
/// The smallest header a reader accepts: a writer's from before device_pooled.
inline constexpr uint32_t kMinHeaderSize = offsetof(LiveHeader, device_pooled);

/// Where the slots of table slot `slot` are described, in a header whose writer filled
/// `header_size` bytes: `tables[slot]` for slot < kTables, then device_pooled; nullptr past
/// what the writer filled or kTableSlots.
template <class Header>
constexpr auto* table_desc(Header& h, uint32_t slot, uint32_t header_size) noexcept {
  using Desc = std::conditional_t<std::is_const_v<Header>, const TableDesc, TableDesc>;
  if (slot < kTables) return static_cast<Desc*>(&h.tables[slot]);
  const uint32_t k = slot - kTables;
  if (k >= kPooledDevices - 1 || offsetof(LiveHeader, device_pooled) + (k + 1) * sizeof(TableDesc) > header_size)
    return static_cast<Desc*>(nullptr);
  return static_cast<Desc*>(&h.device_pooled[k]);
}
/// What table slot `slot`'s records are: its Table, or Table::pooled for device_pooled's.
constexpr Table table_of_slot(uint32_t slot) noexcept {
  return slot < kTables ? static_cast<Table>(slot) : Table::pooled;
}
/// The table slot of the blocks the pools of device `ordinal` (0 .. kPooledDevices - 1) hand out.
constexpr uint32_t pooled_slot(int ordinal) noexcept {
  return ordinal <= 0 ? static_cast<uint32_t>(Table::pooled) : kTables + static_cast<uint32_t>(ordinal) - 1;
}

/// File name (no directory): "live-<pid>-<start_time>.cwl".
std::string file_name(uint32_t pid, uint64_t start_time);

/// One record as a reader returns it.
struct Record {
  Table table;
  uint64_t key, bytes, stream;
  int device;
  uint16_t api;
  uint64_t time_ns;  ///< absolute (created_ns + the tag's ms)
  uint32_t site;
};
struct Site {
  uint32_t id = 0;
  std::vector<uint64_t> native;  ///< return addresses, innermost first
  std::vector<uint64_t> python;  ///< code id << 32 | line, innermost first
};
struct Module {
  uint64_t start = 0, end = 0, bias = 0;
  std::string path, build_id;
};
struct Code {
  uint32_t id = 0, first_line = 0;
  std::string file, function;
};

/// What read() copied.
struct Contents {
  uint32_t pid = 0, uid = 0, callsite_frames = 0;
  bool pyframes = false;
  bool incomplete = false;  ///< the writer said a record was lost
  uint64_t start_time = 0, created_ns = 0;
  std::vector<Record> records;
  std::vector<Site> sites;  ///< by id
  std::vector<Module> modules;
  std::vector<Code> codes;
};

/// Why read() failed.
enum class ReadError : uint8_t { none, too_small, bad_magic, bad_abi, bad_layout, busy };
const char* read_error_name(ReadError e) noexcept;

/// Copy a live segment mapped read-only at `base` (`mapped` bytes: the file's size when it
/// was mapped). Retries a move in progress up to `attempts` times (then ReadError::busy).
/// `want_logs`: also copy sites, modules and codes. Never reads outside [base, base+mapped);
/// a region that lies past the mapping (the file grew since) is ReadError::bad_layout, which
/// the caller answers by mapping again. Allocates; thread-safe (reads only).
ReadError read(const void* base, uint64_t mapped, Contents* out, bool want_logs = true, int attempts = 64);

/// read() on the file at `path`: opens it read-only (O_NOFOLLOW), copies its header and the
/// regions the header publishes with pread (a writer that truncates it cannot fault the
/// reader), and reads the copy, copying again when a table moved meanwhile. `expect_uid`:
/// refuse a file another user owns (-1: any). Refuses a file whose published regions pass
/// `max_bytes` (the writer chooses its size). Returns false with *why set when it cannot.
/// Allocates what it copies and the records; thread-safe.
inline constexpr uint64_t kReadLimit = 64ULL << 20;  ///< 2 Mi slots: far past any real program
bool read_file(const std::string& path, long expect_uid, Contents* out, std::string* why, bool want_logs = true,
               uint64_t max_bytes = kReadLimit);

}  // namespace cuw::live
