// Unit tests for `cuwarden top`'s frames without a terminal (cli/src/top_view.cpp): rows
// from a hand-made state, sorting, the client-side history and its sparklines, the GPU bar,
// text from processes made harmless, and the list and detail frames.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>

#include "commands.hpp"
#include "top_view.hpp"

using json = nlohmann::ordered_json;
using namespace cuw::cli::top;

namespace {

constexpr uint64_t kMiB = 1ULL << 20;

json device(uint64_t index, uint64_t used, uint64_t peak, json cap, const char* uuid = "GPU-0") {
  return {{"ordinal", index}, {"uuid", uuid},       {"name", "NVIDIA H200"}, {"used_bytes", used},
          {"peak_bytes", peak}, {"limit_bytes", cap}, {"reserved_bytes", used}, {"allocations", 1u},
          {"ooms", 0u},        {"gpu_index", index}};
}

json process(uint64_t pid, const char* name, json devices, const char* state = "running", const char* job = "") {
  return {{"pid", pid},     {"user", "alice"},        {"process_name", name}, {"cmdline", std::string(name) + " -x"},
          {"job", job},     {"pool", "off"},          {"state", state},       {"created_ns", 1000 + pid},
          {"devices", devices}};
}

/// Two GPUs; a capped process on GPU 0, an uncapped one on both, an exited one.
json scene() {
  return {{"version", "0.1.0"},
          {"hostname", "node"},
          {"time_ns", 1700000000000000000ULL},
          {"gpus",
           json::array({{{"index", 0u}, {"uuid", "GPU-0"}, {"name", "NVIDIA H200"}, {"memory_total_bytes", 1000 * kMiB},
                         {"used_bytes", 300 * kMiB}},
                        {{"index", 1u}, {"uuid", "GPU-1"}, {"name", "NVIDIA H200"}, {"memory_total_bytes", 1000 * kMiB},
                         {"used_bytes", 0u}}})},
          {"processes",
           json::array({process(200, "train", json::array({device(0, 100 * kMiB, 150 * kMiB, 500 * kMiB)})),
                        process(100, "etl",
                                json::array({device(0, 200 * kMiB, 200 * kMiB, nullptr),
                                             device(1, 0, 10 * kMiB, nullptr, "GPU-1")}),
                                "running", "nightly"),
                        process(300, "old", json::array({device(0, 0, 900 * kMiB, 800 * kMiB)}), "exited")})}};
}

std::vector<uint64_t> pids(const std::vector<ProcRow>& rows) {
  std::vector<uint64_t> v;
  for (const ProcRow& r : rows) v.push_back(r.pid);
  return v;
}

std::string text(const std::vector<Line>& lines) {
  std::string s;
  for (const Line& l : lines) s += l.plain() + "\n";
  return s;
}

}  // namespace

TEST_CASE("top.rows_are_the_tables_one_per_process_and_gpu") {
  const auto rows = process_rows(scene());
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].key == "200:1200:GPU-0");
  CHECK(rows[1].key == "100:1100:GPU-0");
  CHECK(rows[2].key == "100:1100:GPU-1");
  CHECK(rows[1].gpu == 0u);
  CHECK(rows[2].gpu == 1u);
  CHECK(rows[0].cap == 500 * kMiB);
  CHECK_FALSE(rows[1].cap.has_value());
  CHECK(rows[1].job == "nightly");
  CHECK(rows[3].state == "exited");

  json no_gpu = scene();
  no_gpu["processes"] = json::array({process(7, "init", json::array())});
  const auto one = process_rows(no_gpu);
  REQUIRE(one.size() == 1);
  CHECK_FALSE(one[0].gpu.has_value());
  CHECK(one[0].device.is_null());
}

TEST_CASE("top.gpu_caps_add_up_the_running_processes_caps") {
  const auto gpus = gpu_rows(scene());
  REQUIRE(gpus.size() == 2);
  CHECK(gpus[0].caps == 500 * kMiB);  // the exited process's 800 MiB cap holds nothing
  CHECK(gpus[0].capped == 1);
  CHECK(gpus[0].processes == 2);
  CHECK(gpus[1].capped == 0);
  CHECK(gpus[1].processes == 1);
}

TEST_CASE("top.sorting_by_each_key_and_reversed") {
  auto rows = process_rows(scene());
  sort_rows(rows, SortKey::used, false);
  CHECK(pids(rows) == std::vector<uint64_t>{100, 200, 100, 300});  // 200, 100, 0 (GPU 1 before the exited)
  sort_rows(rows, SortKey::used, true);
  CHECK(pids(rows) == std::vector<uint64_t>{100, 300, 200, 100});
  sort_rows(rows, SortKey::peak, false);
  CHECK(pids(rows) == std::vector<uint64_t>{300, 100, 200, 100});
  sort_rows(rows, SortKey::pid, false);
  CHECK(pids(rows) == std::vector<uint64_t>{100, 100, 200, 300});
  CHECK(rows[0].gpu == 0u);  // ties by GPU
  sort_rows(rows, SortKey::name, false);
  CHECK(pids(rows) == std::vector<uint64_t>{100, 100, 300, 200});  // etl, old, train
  sort_rows(rows, SortKey::name, true);
  CHECK(pids(rows) == std::vector<uint64_t>{200, 300, 100, 100});
  // Uncapped rows come last whichever way caps sort.
  sort_rows(rows, SortKey::cap, false);
  CHECK(pids(rows) == std::vector<uint64_t>{300, 200, 100, 100});
  sort_rows(rows, SortKey::cap, true);
  CHECK(pids(rows) == std::vector<uint64_t>{200, 300, 100, 100});

  CHECK(next_sort(SortKey::used) == SortKey::peak);
  CHECK(next_sort(SortKey::pid) == SortKey::used);
  CHECK(sort_order(SortKey::used, false) == "largest first");
  CHECK(sort_order(SortKey::name, true) == "Z to A");
}

TEST_CASE("top.history_keeps_sixty_samples_per_row_and_forgets_rows_gone") {
  json st = scene();
  History h;
  for (int i = 0; i < 70; ++i) {
    st["processes"][0]["devices"][0]["used_bytes"] = static_cast<uint64_t>(i);
    h.record(process_rows(st));
  }
  const auto& s = h.samples("200:1200:GPU-0");
  REQUIRE(s.size() == History::kSamples);
  CHECK(s.front() == 10);
  CHECK(s.back() == 69);
  st["processes"].erase(0);
  h.record(process_rows(st));
  CHECK(h.samples("200:1200:GPU-0").empty());
  CHECK(h.samples("100:1100:GPU-0").size() == History::kSamples);
}

TEST_CASE("top.sparkline_scales_to_the_largest_sample_shown") {
  const std::deque<uint64_t> s = {0, 1, 50, 100};
  CHECK(sparkline(s, 6, true) == "  ▁▂▅█");
  CHECK(sparkline(s, 6, false) == "  _.=#");
  CHECK(sparkline(s, 2, true) == "▅█");    // the newest samples
  CHECK(sparkline(s, 3, false) == ".=#");  // the newest samples
  CHECK(sparkline({0, 0}, 2, true) == "▁▁");
  CHECK(sparkline({7, 7}, 3, false) == " ##");
  CHECK(sparkline({}, 2, true) == "  ");
}

TEST_CASE("top.gpu_bar_shows_used_and_where_the_caps_end") {
  GpuRow g;
  g.total = 1000;
  g.used = 300;
  g.caps = 500;
  g.capped = 1;
  std::string plain;
  for (const Span& s : gpu_bar(g, 10, false)) plain += s.text;
  CHECK(plain == "[###..|....]");
  plain.clear();
  for (const Span& s : gpu_bar(g, 10, true)) plain += s.text;
  CHECK(plain == "[███░░│░░░░]");
  g.caps = 5000;  // more caps than memory: no mark
  g.used = 1;     // a byte used shows
  plain.clear();
  for (const Span& s : gpu_bar(g, 4, false)) plain += s.text;
  CHECK(plain == "[#...]");
  g.used = 950;
  bool high = false;
  for (const Span& s : gpu_bar(g, 4, false)) high = high || s.style == Style::bar_high;
  CHECK(high);
}

TEST_CASE("top.text_from_processes_cannot_drive_the_terminal") {
  CHECK(printable("a\x1b[31mb\x07") == "a?[31mb?");
  CHECK(printable("x\xc2\x9b" "1m") == "x?1m");  // C1 CSI
  CHECK(printable("caf\xc3\xa9 \xe2\x96\x88") == "caf\xc3\xa9 \xe2\x96\x88");
  CHECK(columns("é█x") == 3);
  const Line l{{{"ab█", Style::normal}, {"cd", Style::dim}}};
  CHECK(clip(l, 4).plain() == "ab█c");
  CHECK(clip(l, 2).spans.size() == 1);
  CHECK(clip(l, 10).plain() == "ab█cd");

  json st = scene();
  st["processes"][0]["process_name"] = "evil\x1b]0;title\x07";
  const auto rows = process_rows(st);
  CHECK(rows[0].name == "evil?]0;title?");
}

TEST_CASE("top.list_frame_once_and_interactive") {
  const json st = scene();
  auto rows = process_rows(st);
  History h;
  h.record(rows);
  sort_rows(rows, SortKey::used, false);
  ViewOptions v;
  v.utf8 = false;
  v.interactive = false;
  const std::string once = text(list_frame(st, rows, h, v, 0, 0, nullptr));
  INFO(once);
  CHECK(once.rfind("cuwarden top  ", 0) == 0);
  CHECK(once.find("2 processes running") != std::string::npos);
  CHECK(once.find("GPU 0  NVIDIA H200") != std::string::npos);
  CHECK(once.find("caps 500.00 MiB (1 of 2 processes)") != std::string::npos);
  CHECK(once.find("Usedv") != std::string::npos);
  CHECK(once.find("Used, last") == std::string::npos);
  CHECK(once.find("Sort:") == std::string::npos);
  CHECK(once.find("nightly") != std::string::npos);
  CHECK(once.find("exited") != std::string::npos);
  CHECK(once.find("200.00 MiB") < once.find("100.00 MiB"));

  // Interactive on a 4-row list area: the selection scrolls into view; the key line last.
  v.interactive = true;
  v.interval_s = 2;
  v.selected = rows.back().key;
  std::size_t first = 0;
  const auto lines = list_frame(st, rows, h, v, 160, 9, &first);
  const std::string shown = text(lines);
  INFO(shown);
  REQUIRE(lines.size() == 9);
  CHECK(first == 1);
  CHECK(shown.find("Used, last 120 s") != std::string::npos);
  CHECK(lines.back().plain().rfind("Sort: used, largest first (3 of 4 shown)", 0) == 0);
  CHECK(lines[7].spans[0].style == Style::selected);
  CHECK(lines[7].plain().find("old") != std::string::npos);
  std::size_t w = 0;
  for (const Span& s : lines[7].spans) w += columns(s.text);
  CHECK(w == 160);  // the highlight spans the screen
  v.selected = rows.front().key;
  list_frame(st, rows, h, v, 160, 9, &first);
  CHECK(first == 0);
  // Narrow: no room for the sparkline.
  CHECK(text(list_frame(st, rows, h, v, 90, 0, &first)).find("Used, last") == std::string::npos);
}

TEST_CASE("top.a_job_member_without_a_cap_of_its_own_shows_its_jobs") {
  json st = scene();
  st["jobs"] = json::array({{{"name", "nightly"}, {"limit_bytes", 700 * kMiB}, {"members", json::array({{{"pid", 100u}}})}}});
  for (const ProcRow& r : process_rows(st)) {
    INFO(r.pid);
    if (r.pid == 100) {
      CHECK(r.cap == 700 * kMiB);
      CHECK(r.job_cap);
    }
    if (r.pid == 200) {
      CHECK(r.cap == 500 * kMiB);  // its own
      CHECK_FALSE(r.job_cap);
    }
  }
}

TEST_CASE("top.an_80_column_terminal_keeps_cap_state_and_the_keys") {
  const json st = scene();
  auto rows = process_rows(st);
  History h;
  h.record(rows);
  sort_rows(rows, SortKey::used, false);
  ViewOptions v;
  v.utf8 = false;
  v.interactive = true;
  std::size_t first = 0;
  for (bool jobs : {true, false}) {
    auto rs = rows;
    if (!jobs)
      for (ProcRow& r : rs) r.job.clear();
    const auto lines = list_frame(st, rs, h, v, 80, 24, &first);
    const std::string shown = text(lines);
    INFO(shown);
    // Every line fits, but a GPU's, whose caps may run past the edge after its figures.
    for (const Line& l : lines)
      if (l.plain().rfind("GPU ", 0) != 0) CHECK(columns(l.plain()) <= 80);
    // Each GPU line has its figures within the screen; the header has Cap and State.
    for (const Line& l : lines)
      if (l.plain().rfind("GPU ", 0) == 0) CHECK(columns(l.plain().substr(0, l.plain().find('%') + 1)) <= 80);
    CHECK(shown.find("300.00 MiB / 1000.00 MiB") != std::string::npos);
    CHECK(shown.find("Cap") != std::string::npos);
    CHECK(shown.find("State") != std::string::npos);
    CHECK(shown.find("500.00 MiB running") != std::string::npos);
    CHECK(shown.find("exited") != std::string::npos);
    CHECK((shown.find(" nig") != std::string::npos) == jobs);  // the Job column, narrowed
    CHECK(lines.back().plain().find("q: quit") != std::string::npos);
  }
}

TEST_CASE("top.top_sites_from_a_snapshot") {
  const json snap = {
      {"exact", true},
      {"callsite_frames", 16u},
      {"allocations", json::array({{{"site", 0}, {"kind", "device"}, {"bytes", 3 * kMiB}},
                                   {{"site", 0}, {"kind", "host"}, {"bytes", 99 * kMiB}}})},
      {"sites", json::array({{{"id", 1}, {"live_bytes", kMiB}, {"live_allocations", 2u},
                              {"frames", json::array({{{"python", false}, {"function", "cudaMalloc"},
                                                       {"module", "/usr/lib/libcudart.so"}, {"offset", 0x10u}},
                                                      {{"python", true}, {"function", "train"},
                                                       {"file", "/home/a/train.py"}, {"line", 12u}}})}},
                             {{"id", 2}, {"live_bytes", 8 * kMiB}, {"live_allocations", 1u},
                              {"frames", json::array({{{"function", "big"}, {"file", "a.cpp"}, {"line", 3u}}})}},
                             {{"id", 3}, {"live_bytes", 0}, {"live_allocations", 0}, {"frames", json::array()}}})}};
  const auto lines = top_sites(snap, 5);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == "   8.00 MiB    1 allocation  big (a.cpp:3)");
  CHECK(lines[1] == "   3.00 MiB    1 allocation  (no call site captured)");
  // A daemon without labels: the innermost Python frame.
  CHECK(lines[2] == "   1.00 MiB   2 allocations  train (train.py:12)");
  CHECK(top_sites(snap, 1).size() == 1);
  // The daemon's label leads; a narrow view cuts the head, never the frame that tells sites apart.
  json labelled = snap;
  labelled["sites"][1]["label"] = "pool::level_12 (/src/pool.cpp:112) < load_weights (/src/model.cpp:40) (+11)";
  CHECK(top_sites(labelled, 1)[0] ==
        "   8.00 MiB    1 allocation  pool::level_12 (/src/pool.cpp:112) < load_weights (/src/model.cpp:40) (+11)");
  const std::string narrow = top_sites(labelled, 1, 80)[0];
  CHECK(narrow == "   8.00 MiB    1 allocation  pool::level_1.. < load_weights (model.cpp:40) (+11)");
  CHECK(narrow.size() <= 80);
  // Long paths: files by their base names, so that the differing frame fits at 90 columns.
  labelled["sites"][1]["label"] =
      "chain_12(unsigned long) (../tests/integration/snapshot_app.cpp:70) < load_weights "
      "(../tests/integration/snapshot_app.cpp:75) (+11)";
  const std::string ninety = top_sites(labelled, 1, 90)[0];
  CHECK(ninety.find("< load_weights (snapshot_app.cpp:75) (+11)") != std::string::npos);
  CHECK(ninety.size() <= 90);
  json off = snap;
  off["callsite_frames"] = 0u;
  off["sites"] = json::array();
  CHECK(top_sites(off, 5) == std::vector<std::string>{
                                 "   3.00 MiB    1 allocation  (call sites off: cuwarden run --callsites 16 records them)"});
  CHECK(top_sites({{"exact", false}}, 5).front().find("could not be read") != std::string::npos);
  CHECK(top_sites(json::object(), 5) == std::vector<std::string>{"(no live device allocation)"});
}

namespace {

/// A snapshot of three sites through one helper chain (helper_12 .. helper_1, called from
/// load_weights at two lines and from make_buffers), as the daemon's JSON gives them.
json chained_snapshot() {
  json sites = json::array();
  const std::pair<const char*, unsigned> callers[] = {{"load_weights", 75}, {"load_weights", 77}, {"make_buffers", 82}};
  unsigned id = 1;
  for (auto [fn, line] : callers) {
    json frames = json::array();
    const auto frame = [&](std::string f, const std::string& file, unsigned l, const char* cls) {
      frames.push_back({{"python", false}, {"function", f}, {"file", file}, {"line", l}, {"module", "/src/app"},
                        {"class", cls}, {"text", f + " (" + file + ":" + std::to_string(l) + ")"}});
    };
    frame("cuMemAlloc", "/src/cuda/alloc.c", 10, "cuda");
    for (unsigned k = 12; k >= 1; --k) frame("helper_" + std::to_string(k), "/src/pool.cpp", 100 + k, "user");
    frame(fn, "/src/model.cpp", line, "user");
    frame("main", "/src/main.cpp", 5, "user");
    frame("__libc_start_main", "/lib/libc.c", 1, "libc");
    sites.push_back({{"id", id},
                     {"live_bytes", (4 - id) * kMiB},
                     {"live_allocations", 1u},
                     {"label", fmt::format("helper_12 (/src/pool.cpp:112) < {} (/src/model.cpp:{}) (+11)", fn, line)},
                     {"label_head", "helper_12 (/src/pool.cpp:112)"},
                     {"label_folded", "1 frame in alloc.c"},
                     {"label_via", json::array({{{"frame", 13u}, {"skipped", 11u}, {"text", "x"}}})},
                     {"head_frame", 1},
                     {"frames", frames}});
    ++id;
  }
  return {{"exact", true}, {"callsite_frames", 24u}, {"sites", sites}};
}

}  // namespace

TEST_CASE("top.top_sites_unfold_every_frame_and_cut_from_the_outer_end") {
  const json snap = chained_snapshot();
  const auto folded = top_sites(snap, 5);
  REQUIRE(folded.size() == 3);
  CHECK(folded[0] == "   3.00 MiB    1 allocation  helper_12 (/src/pool.cpp:112) < load_weights (/src/model.cpp:75) (+11)");

  // Unfolded: the head on the site's line, then every frame as --full lists them.
  const auto all = top_sites(snap, 5, 0, true);
  const std::string indent(27, ' ');
  REQUIRE(all.size() == 3 * 17);
  CHECK(all[0] == "   3.00 MiB    1 allocation  helper_12 (/src/pool.cpp:112)");
  CHECK(all[1] == indent + "  cuMemAlloc (/src/cuda/alloc.c:10)  [cuda]");
  CHECK(all[2] == indent + "  outward:");
  CHECK(all[3] == indent + "  helper_11 (/src/pool.cpp:111)  [user]");
  CHECK(all[13] == indent + "  helper_1 (/src/pool.cpp:101)  [user]");
  CHECK(all[14] == indent + "< load_weights (/src/model.cpp:75)  [user]");
  CHECK(all[15] == indent + "  main (/src/main.cpp:5)  [user]");
  CHECK(all[16] == indent + "  __libc_start_main (/lib/libc.c:1)  [libc]");
  CHECK(all[17 + 14] == indent + "< load_weights (/src/model.cpp:77)  [user]");
  CHECK(all[34 + 14] == indent + "< make_buffers (/src/model.cpp:82)  [user]");

  // 60 columns: paths by base names, then the line's end cut.
  for (const std::string& l : top_sites(snap, 5, 60, true)) CHECK(columns(l) <= 60);
  CHECK(top_sites(snap, 5, 64, true)[14] == indent + "< load_weights (model.cpp:75)  [user]");

  // 24 lines for 51: the outer frames go first, then the chain, never the caller's line;
  // each run of cut frames is one line.
  const auto cut = top_sites(snap, 5, 0, true, 24);
  std::string shown;
  for (const std::string& l : cut) shown += l + "\n";
  INFO(shown);
  REQUIRE(cut.size() <= 24);
  for (const char* caller : {"< load_weights (/src/model.cpp:75)", "< load_weights (/src/model.cpp:77)",
                             "< make_buffers (/src/model.cpp:82)"})
    CHECK(std::count_if(cut.begin(), cut.end(), [&](const std::string& l) { return l.find(caller) != std::string::npos; }) == 1);
  CHECK(std::find(cut.begin(), cut.end(), indent + "  (+2 frames)") != cut.end());  // main and libc's
  CHECK(std::find(cut.begin(), cut.end(), indent + "  helper_1 (/src/pool.cpp:101)  [user]") == cut.end());
  CHECK(cut[1] == indent + "  cuMemAlloc (/src/cuda/alloc.c:10)  [cuda]");  // the inner end stays longest
  // No room at all: the heads and the callers' lines stay.
  const auto least = top_sites(snap, 5, 0, true, 1);
  CHECK(least.size() == 3 * 6);  // head, inner, "outward:", a run, the caller, a run
  // A daemon without the label's parts: one line a site, unfolded or not.
  json old = snap;
  for (json& s : old["sites"]) s.erase("head_frame");
  CHECK(top_sites(old, 5, 0, true) == folded);
}

TEST_CASE("top.detail_frame_shows_a_refusal_and_the_newest_events") {
  const json st = scene();
  const auto rows = process_rows(st);
  History h;
  h.record(rows);
  Detail d;
  d.pid = 100;
  d.start = "1100";
  d.snapshot_error = "refused: pid 100 is another user's process";
  json evs = json::array();
  for (uint64_t i = 0; i < 30; ++i)
    evs.push_back({{"seq", i}, {"pid", 100u}, {"time_ns", 1700000000000000000ULL + i}, {"api", "cuMemAlloc"},
                   {"kind", "alloc"}, {"device", 0u}, {"bytes", (i + 1) * kMiB}, {"address", 0x1000 * i},
                   {"used_after", (i + 1) * kMiB}});
  d.events = json{{"events", evs}};
  ViewOptions v;
  const auto lines = detail_frame(st, rows, h, d, v, 120, 30);
  const std::string shown = text(lines);
  INFO(shown);
  REQUIRE(lines.size() == 30);
  CHECK(lines[0].plain().find("pid 100  etl  user alice  job nightly  pool off  running") != std::string::npos);
  CHECK(shown.find("command: etl -x") != std::string::npos);
  CHECK(shown.find("refused: pid 100 is another user's process") != std::string::npos);
  CHECK(shown.find("GPU 1 Used, last 60 s") != std::string::npos);  // both of its GPUs
  CHECK(shown.find("30.00 MiB") != std::string::npos);              // the newest event shows
  CHECK(shown.find(" 1.00 MiB ") == std::string::npos);             // the oldest did not fit
  CHECK(lines.back().plain() == "Esc/Backspace: back to the list  f: unfold call sites  q: quit");

  d.pid = 999;
  d.events.reset();
  d.events_error = "no daemon is running";
  d.snapshot_error.clear();
  const std::string gone = text(detail_frame(st, rows, h, d, v, 120, 0));
  CHECK(gone.find("pid 999 is no longer known to the daemon") != std::string::npos);
  CHECK(gone.find("no daemon is running") != std::string::npos);
  CHECK(gone.find("(asking the daemon)") != std::string::npos);  // no snapshot yet, no error

  // f: every frame, as many as leave the events' title and a few events on the screen.
  d.pid = 100;
  d.events = json{{"events", evs}};
  d.snapshot = chained_snapshot();
  v.unfold = true;
  const auto unfolded = detail_frame(st, rows, h, d, v, 120, 40);
  const std::string u = text(unfolded);
  INFO(u);
  REQUIRE(unfolded.size() == 40);
  CHECK(u.find("Top call sites (live bytes), every frame:") != std::string::npos);
  CHECK(u.find("< make_buffers (/src/model.cpp:82)  [user]") != std::string::npos);
  CHECK(u.find("30.00 MiB") != std::string::npos);  // the newest event still shows
  CHECK(unfolded.back().plain() == "Esc/Backspace: back to the list  f: fold call sites  q: quit");
}

TEST_CASE("top.sparklines_start_from_the_daemons_history") {
  const std::vector<ProcRow> rows = process_rows(scene());
  History h;
  h.record(rows);
  const std::string key = rows[0].key;  // pid 200 on GPU-0, 100 MiB now
  REQUIRE(rows[0].pid == 200);
  CHECK(h.unseeded(rows).size() == rows.size());  // every row has a device and one sample
  const uint64_t now_s = 1700000000;
  json hist = {{"range", "hour"},
               {"time_ns", now_s * 1000000000ULL},
               {"processes",
                json::array({{{"pid", 200u},
                              {"start_time", 0u},
                              {"devices", json::array({{{"uuid", "GPU-0"},
                                                        {"t", json::array({now_s - 100, now_s - 10})},
                                                        {"used_bytes", json::array({10 * kMiB, 50 * kMiB})}}})}}})}};
  h.seed(rows, hist, 1.0);
  const auto& s = h.samples(key);
  REQUIRE(s.size() == History::kSamples);
  CHECK(s.front() == 10 * kMiB);     // 59 s ago: the value since 100 s ago
  CHECK(s[s.size() - 11] == 50 * kMiB);  // 10 s ago: the change
  CHECK(s[s.size() - 12] == 10 * kMiB);  // 11 s ago: before it
  CHECK(s.back() == 100 * kMiB);     // the sample record() took
  // Seeded rows are not asked for again; a process the history does not have stays as it was.
  for (const std::string& k : h.unseeded(rows)) CHECK(k != key);
  CHECK(h.samples(rows[1].key).size() == 1);
}

TEST_CASE("cli.parse_seconds_reads_durations") {
  using cuw::cli::parse_seconds;
  CHECK(parse_seconds("90") == 90u);
  CHECK(parse_seconds("30s") == 30u);
  CHECK(parse_seconds("10m") == 600u);
  CHECK(parse_seconds("10min") == 600u);
  CHECK(parse_seconds("2h") == 7200u);
  CHECK(parse_seconds("0") == 0u);
  CHECK_FALSE(parse_seconds(""));
  CHECK_FALSE(parse_seconds("m"));
  CHECK_FALSE(parse_seconds("10d"));
  CHECK_FALSE(parse_seconds("-5"));
  CHECK_FALSE(parse_seconds("99999999999999999999"));
  CHECK_FALSE(parse_seconds("9999999999999h"));
}
