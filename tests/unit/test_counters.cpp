// cuwarden: the device counters are declared once (counters.hpp). A test copy of the list
// with one more row must reach the ring slot (in a reserved word, nothing moved), the
// daemon's snapshot and state JSON, and the CLI's query fields, with no other change.
#include <catch2/catch.hpp>

#include <cstddef>
#include <regex>
#include <set>
#include <string>
#include <string_view>

#include "cuw/counters.hpp"
#include "cuw/ring.hpp"
#include "fields.hpp"
#include "model/ring_view.hpp"
#include "views/counters_json.hpp"

namespace {

namespace counters = cuw::counters;
namespace ring = cuw::ring;
using ojson = nlohmann::ordered_json;

// The real list plus one row: all it takes to add a counter.
#define TEST_COUNTERS(X, D) \
  CUW_DEVICE_COUNTERS(X, D) \
  X(spilled, "spilled_bytes", "spilled_memory", "Spilled", "spilled_bytes", gauge, bytes, plain, "Bytes spilled to host")

struct alignas(64) TestSlot {
  CUW_DEVICE_SLOT_BODY(TEST_COUNTERS)
};
struct TestSnapshot {
  CUW_SNAPSHOT_COUNTERS(TEST_COUNTERS)
  uint64_t derive_in_use() const noexcept { return cached >= used ? 0 : used - cached; }
};
constexpr counters::Info kTestRows[] = {TEST_COUNTERS(CUW_COUNTER_INFO_X, CUW_COUNTER_INFO_D)};

// A list of exactly kDeviceCounterWords stored rows: the slot filled to its last word.
#define FULL_ROW_(X, n) X(w##n, "w" #n, "", "W", "w" #n, gauge, count, plain, "a word")
#define FULL_ROWS_4_(X, a, b, c, d) FULL_ROW_(X, a) FULL_ROW_(X, b) FULL_ROW_(X, c) FULL_ROW_(X, d)
#define FULL_COUNTERS(X, D)                                                                         \
  FULL_ROWS_4_(X, 0, 1, 2, 3) FULL_ROWS_4_(X, 4, 5, 6, 7) FULL_ROWS_4_(X, 8, 9, 10, 11)              \
  FULL_ROWS_4_(X, 12, 13, 14, 15) FULL_ROWS_4_(X, 16, 17, 18, 19) FULL_ROWS_4_(X, 20, 21, 22, 23)
struct alignas(64) FullSlot {
  CUW_DEVICE_SLOT_BODY(FULL_COUNTERS)
};
constexpr counters::Info kFullRows[] = {FULL_COUNTERS(CUW_COUNTER_INFO_X, CUW_COUNTER_INFO_D)};

/// Whether a row's metric name follows the Prometheus conventions counters.hpp states:
/// counters end in _total (one in bytes in _bytes_total), gauges in bytes in _bytes.
bool metric_name_follows_conventions(const counters::Info& r) {
  if (r.type == counters::Type::counter)
    return r.metric.ends_with(r.unit == counters::Unit::bytes ? "_bytes_total" : "_total");
  return r.unit != counters::Unit::bytes || r.metric.ends_with("_bytes");
}

}  // namespace

TEST_CASE("counters.adding_a_counter_is_one_row") {
  // The ring slot: same size, every field where it was, the new one in the first reserved word.
  STATIC_REQUIRE(sizeof(TestSlot) == sizeof(ring::DeviceSlot));
  CHECK(offsetof(TestSlot, spilled) == offsetof(ring::DeviceSlot, used) + counters::kDeviceStored * 8);
  CHECK(offsetof(TestSlot, used) == offsetof(ring::DeviceSlot, used));
  CHECK(offsetof(TestSlot, context_bytes) == offsetof(ring::DeviceSlot, context_bytes));
  CHECK(decltype(TestSlot::reserved_words)::count + 1 == decltype(ring::DeviceSlot::reserved_words)::count);

  // The daemon's snapshot copies it, and the state JSON shows it after the others.
  TestSlot slot{};
  slot.used.store(5000);
  slot.cached.store(1000);
  slot.limit.store(ring::kNoLimit);
  slot.spilled.store(123456);
  TestSnapshot o;
  const TestSlot& s = slot;
  CUW_COPY_DEVICE_COUNTERS(TEST_COUNTERS)
  CHECK(o.spilled == 123456);
  ojson dev = ojson::object();
  cuw::daemon::put_counters(dev, kTestRows, o.values(), false);
  REQUIRE(dev.size() == counters::kDeviceCount + 1);
  CHECK(dev.items().begin().key() == "used_bytes");
  CHECK(dev["spilled_bytes"] == 123456);
  CHECK(dev["in_use_bytes"] == 4000);
  CHECK(dev["limit_bytes"].is_null());
  ojson real = ojson::object();
  cuw::daemon::DeviceSnapshot ds;
  cuw::daemon::put_counters(real, counters::kDevice, ds.values(), false);
  std::size_t i = 0;
  for (const auto& [key, value] : real.items()) CHECK(std::next(dev.items().begin(), static_cast<long>(i++)).key() == key);

  // The CLI can query it, as bytes, from that key.
  const auto fields = cuw::cli::query_fields(kTestRows);
  const cuw::cli::QueryField* f = cuw::cli::find_query_field(fields, "spilled_memory");
  REQUIRE(f);
  CHECK(f->kind == cuw::cli::CellKind::bytes);
  CHECK(f->header == "spilled_memory");
  const ojson state = {{"time_ns", 0}};
  const ojson proc = {{"pid", 7}};
  const cuw::cli::Cell cell = cuw::cli::query_cell(*f, state, proc, dev, {});
  CHECK(cell.kind == cuw::cli::CellKind::bytes);
  CHECK(cell.value == 123456);
  CHECK(cuw::cli::query_fields_help(kTestRows).find("spilled_memory") != std::string::npos);
  CHECK(cuw::cli::find_query_field(cuw::cli::query_fields(), "spilled_memory") == nullptr);
}

TEST_CASE("counters.a_list_may_fill_the_slot_to_its_last_word") {
  STATIC_REQUIRE(std::size(kFullRows) == ring::kDeviceCounterWords);
  STATIC_REQUIRE(sizeof(FullSlot) == sizeof(ring::DeviceSlot));
  STATIC_REQUIRE(decltype(FullSlot::reserved_words)::count == 0);
  CHECK(offsetof(FullSlot, w0) == offsetof(ring::DeviceSlot, used));
  CHECK(offsetof(FullSlot, w23) + 8 == sizeof(ring::DeviceSlot));
  FullSlot slot{};
  slot.w23.store(7);
  CHECK(slot.w23.load() == 7);
  CHECK(slot.w22.load() == 0);
}

TEST_CASE("counters.the_metric_naming_check_is_the_stated_rule") {
  const auto row = [](std::string_view metric, counters::Type type, counters::Unit unit) {
    return counters::Info{"f", "f", "", "F", metric, type, unit, counters::Shown::plain, true, "help"};
  };
  using counters::Type, counters::Unit;
  // A counter in bytes: a total, with its unit before the suffix, as Prometheus names them.
  CHECK(metric_name_follows_conventions(row("freed_bytes_total", Type::counter, Unit::bytes)));
  CHECK_FALSE(metric_name_follows_conventions(row("freed_total", Type::counter, Unit::bytes)));
  CHECK_FALSE(metric_name_follows_conventions(row("freed_bytes", Type::counter, Unit::bytes)));
  CHECK(metric_name_follows_conventions(row("frees_total", Type::counter, Unit::count)));
  CHECK_FALSE(metric_name_follows_conventions(row("frees", Type::counter, Unit::count)));
  CHECK(metric_name_follows_conventions(row("process_memory_used_bytes", Type::gauge, Unit::bytes)));
  CHECK_FALSE(metric_name_follows_conventions(row("process_memory_used", Type::gauge, Unit::bytes)));
  CHECK(metric_name_follows_conventions(row("process_allocations", Type::gauge, Unit::count)));
}

TEST_CASE("counters.names_are_unique_and_valid_where_they_go") {
  std::set<std::string_view> fields, keys, queries, metrics;
  const std::regex metric(R"([a-zA-Z_:][a-zA-Z0-9_:]*)");
  for (const counters::Info& r : counters::kDevice) {
    INFO(r.field);
    CHECK(fields.insert(r.field).second);
    CHECK(keys.insert(r.json).second);
    if (!r.query.empty()) CHECK(queries.insert(r.query).second);
    CHECK(metrics.insert(r.metric).second);
    CHECK(std::regex_match(std::string(counters::kMetricPrefix) + std::string(r.metric), metric));
    CHECK(metric_name_follows_conventions(r));
    CHECK_FALSE(r.help.empty());
    CHECK_FALSE(r.column.empty());
  }
  // Public names never change: the JSON key of `refusals` stays "ooms".
  CHECK(counters::kDevice[static_cast<std::size_t>(counters::Id::refusals)].json == "ooms");
  CHECK(counters::kDeviceStored + 1 == counters::kDeviceCount);  // in_use is the one derived row
  // Every CLI field name is unique, nvidia-smi's first.
  std::set<std::string> names;
  const auto all = cuw::cli::query_fields();
  for (const auto& f : all) CHECK(names.insert(f.name).second);
  CHECK(all[0].name == "pid");
  CHECK(cuw::cli::find_query_field(all, "used_gpu_memory") == cuw::cli::find_query_field(all, "used_memory"));
  CHECK(cuw::cli::find_query_field(all, "used_memory")->header == "used_gpu_memory");
}
