// cuwarden CLI: the default view (nvidia-smi-like boxes), --json, and --query-compute-apps.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fmt/format.h>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "client.hpp"
#include "cuw/size.hpp"
#include "commands.hpp"
#include "fields.hpp"
#include "json_access.hpp"
#include "table.hpp"

namespace cuw::cli {

using json = nlohmann::ordered_json;  // keeps the daemon's field order for --json

namespace {

std::string short_uuid(const std::string& uuid) { return uuid.size() > 12 ? uuid.substr(0, 12) : uuid; }

bool gpu_matches(const std::string& filter, const json& dev_or_gpu, const char* index_key) {
  if (filter.empty()) return true;
  std::stringstream ss(filter);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const std::string uuid = jstr(dev_or_gpu, "uuid");
    if (item.find_first_not_of("0123456789") == std::string::npos) {
      if (std::to_string(jnum(dev_or_gpu, index_key)) == item) return true;
    } else if (uuid.compare(0, item.size(), item) == 0) {
      return true;
    }
  }
  return false;
}

/// The state's processes in pid order, as numbers (the daemon lists them by ring file name,
/// where 17912 comes before 6867).
std::vector<const json*> by_pid(const json& st) {
  std::vector<const json*> out;
  for (const auto& p : jarr(st, "processes")) out.push_back(&p);
  std::stable_sort(out.begin(), out.end(),
                   [](const json* a, const json* b) { return jnum(*a, "pid") < jnum(*b, "pid"); });
  return out;
}

/// A cap for people: "16 GiB" when whole GiB, else format_bytes; "none" for null.
std::string cap_words(const json& j) {
  if (!j.is_number_unsigned()) return "none";
  const uint64_t b = j.get<uint64_t>();
  if (b && b % (1ULL << 30) == 0) return fmt::format("{} GiB", b >> 30);
  return format_bytes(b);
}

/// "16 GiB ×3, 8 GiB ×1 → 8 GiB" when members asked for different job caps, else the one
/// cap they all asked for.
std::string caps_asked(const json& job) {
  const auto& req = jarr(job, "caps_requested");
  if (req.size() <= 1) return req.empty() ? "-" : cap_words(req[0].value("bytes", json()));
  std::string s;
  for (const auto& r : req)
    s += fmt::format("{}{} ×{}", s.empty() ? "" : ", ", cap_words(r.value("bytes", json())), jnum(r, "members"));
  return s + " → " + cap_words(job.value("limit_bytes", json()));
}

/// The jobs box: per job and GPU a row with the job's use and cap, then one row per member
/// with what it holds on that GPU, its own cap and what it asked for.
Table jobs_table(const json& st, const std::string& filter) {
  Table t;
  t.columns = {{"Job / member", false, false, 32}, {"User", false, false, 12}, {"GPU", false, true},
               {"Used", false, true},              {"Cap", false, true},         {"Caps asked", false, false},
               {"OOMs", false, true}};
  for (const auto& job : jarr(st, "jobs")) {
    const auto& members = jarr(job, "members");
    const auto& gpus = jarr(job, "gpus");
    const std::string title = fmt::format("{} ({} member{})", jstr(job, "name"), members.size(),
                                          members.size() == 1 ? "" : "s");
    auto job_row = [&](const json* g, bool first) {
      t.rows.push_back({Cell::str(first ? title : ""), Cell::str(first ? jstr(job, "user") : ""),
                        g ? jcell(*g, "gpu_index", CellKind::integer) : Cell::none(),
                        g ? jcell(*g, "used_bytes", CellKind::bytes) : Cell::none(),
                        jcell(job, "limit_bytes", CellKind::bytes), Cell::str(first ? caps_asked(job) : ""),
                        first ? jcell(job, "refusals", CellKind::integer) : Cell::none()});
    };
    auto member_rows = [&](const json* g) {
      for (const auto& m : members) {
        Cell used = Cell::none();
        if (g)
          for (const auto& c : jarr(m, "charged"))
            if (jstr(c, "uuid") == jstr(*g, "uuid")) used = jcell(c, "bytes", CellKind::bytes);
        const std::string name = jstr(m, "process_name");
        t.rows.push_back({Cell::str(fmt::format("  pid {}{}", jnum(m, "pid"), name.empty() ? "" : " " + name)),
                          Cell::str(""), g ? jcell(*g, "gpu_index", CellKind::integer) : Cell::none(), used,
                          jcell(m, "limit_bytes", CellKind::bytes), Cell::str(cap_words(m.value("requested_bytes", json()))),
                          jcell(m, "refusals", CellKind::integer)});
      }
    };
    if (gpus.empty()) {
      if (!filter.empty()) continue;
      job_row(nullptr, true);
      member_rows(nullptr);
      continue;
    }
    bool first = true;
    for (const auto& g : gpus) {
      if (!gpu_matches(filter, g, "gpu_index")) continue;
      job_row(&g, first);
      member_rows(&g);
      first = false;
    }
  }
  return t;
}

std::string render_table(const json& st, const std::string& filter) {
  std::string out;
  const std::string head = fmt::format("{}       cuwarden {} (daemon {})  host {}",
                                       local_time(jnum(st, "time_ns"), "%a %b %e %H:%M:%S %Y", false),
                                       CUWARDEN_VERSION, jstr(st, "version", "?"), jstr(st, "hostname", "?"));
  out += head + "\n";

  Table gpus;
  gpus.columns = {{"GPU", false, true}, {"Name", false, false, 28}, {"UUID", false, false},
                  {"Memory tracked / physical", false, true}, {"Procs", false, true}, {"Capped", false, true}};
  bool have_driver = false;
  for (const auto& g : jarr(st, "gpus"))
    if (g.contains("driver_used_bytes")) have_driver = true;
  if (have_driver) gpus.columns.push_back({"Driver used", false, true});
  for (const auto& g : jarr(st, "gpus")) {
    if (!gpu_matches(filter, g, "index")) continue;
    std::vector<Cell> row = {Cell::num(jnum(g, "index")), Cell::str(jstr(g, "name")),
                             Cell::str(short_uuid(jstr(g, "uuid"))),
                             Cell::str(fmt::format("{}MiB / {}MiB", jnum(g, "used_bytes") >> 20,
                                                   jnum(g, "memory_total_bytes") >> 20)),
                             Cell::num(jnum(g, "processes")), Cell::num(jnum(g, "capped_processes"))};
    if (have_driver) row.push_back(jcell(g, "driver_used_bytes", CellKind::bytes));
    gpus.rows.push_back(std::move(row));
  }

  // Allocations, reserved bytes and the rest are in --json and --query-compute-apps: the
  // table keeps to what fits beside nvidia-smi's. A column is either a device counter (its
  // title and key from the counter list) or one of the table's own.
  bool proc_driver = false;
  for (const auto& p : jarr(st, "processes"))
    for (const auto& d : jarr(p, "devices"))
      if (d.contains("driver_used_bytes")) proc_driver = true;
  const auto& unmanaged = jarr(st, "unmanaged_processes");
  if (!unmanaged.empty()) proc_driver = true;
  // A pooling backend holds more than the program uses: show what it uses too (Used stays
  // what counts against the cap, which is what the pool holds).
  bool pooled = false;
  for (const auto& p : jarr(st, "processes")) {
    const std::string pool = jstr(p, "pool", "off");
    if (!pool.empty() && pool != "off") pooled = true;
  }
  using counters::Id;
  std::vector<Id> shown = {Id::used};
  if (pooled) shown.push_back(Id::in_use);
  for (Id id : {Id::peak, Id::limit, Id::refusals}) shown.push_back(id);
  Table procs;
  procs.columns = {{"GPU", false, true}, {"PID", false, true}, {"User", false, false, 12},
                   {"Process name", false, false, 24}};
  for (std::size_t i = 0; i < shown.size(); ++i) {
    procs.columns.push_back({column_title(shown[i]), false, true});
    // Beside the driver's figure, how much of it no cap counts (the context and modules,
    // under the default CUWARDEN_CAP_SCOPE=allocations).
    if (i == 0 && proc_driver) {
      procs.columns.push_back({"Driver", false, true});
      procs.columns.push_back({"Outside", false, true});
    }
  }
  procs.columns.push_back({"State", false, false});
  // A job member without a cap of its own is still capped: by its job, per GPU.
  std::map<uint64_t, json> job_cap;
  for (const auto& job : jarr(st, "jobs"))
    if (job.contains("limit_bytes") && job["limit_bytes"].is_number_unsigned())
      for (const auto& m : jarr(job, "members")) job_cap[jnum(m, "pid")] = job["limit_bytes"];
  for (const json* pp : by_pid(st)) {
    const json& p = *pp;
    const auto& devs = jarr(p, "devices");
    auto row_for = [&](const json* d) {
      std::vector<Cell> row;
      row.push_back(d ? jcell(*d, "gpu_index", CellKind::integer) : Cell::none());
      row.push_back(jcell(p, "pid", CellKind::integer));
      row.push_back(Cell::str(jstr(p, "user")));
      row.push_back(Cell::str(jstr(p, "process_name")));
      for (std::size_t i = 0; i < shown.size(); ++i) {
        Cell c = d ? jcell(*d, json_key(shown[i]), cell_kind(shown[i])) : Cell::none();
        if (shown[i] == Id::limit && c.kind == CellKind::none && job_cap.count(jnum(p, "pid")))
          c = Cell::str(format_mib(job_cap[jnum(p, "pid")].get<uint64_t>()) + " job");
        row.push_back(std::move(c));
        if (i == 0 && proc_driver) {
          row.push_back(d ? jcell(*d, "driver_used_bytes", CellKind::bytes) : Cell::none());
          row.push_back(d ? jcell(*d, "outside_cap_bytes", CellKind::bytes) : Cell::none());
        }
      }
      // A running process whose cap the daemon had to put back says so where people look.
      const bool tampered = p.value("tampers", uint64_t{0}) > 0 && jstr(p, "state") == "running";
      if (jstr(p, "state") == "suspended") {
        // Where its device bytes are now, and since when: "suspended 1.5 GiB host 42s".
        const uint64_t since = jnum(p, "suspended_since_ns"), now = jnum(st, "time_ns");
        row.push_back(Cell::str(fmt::format("suspended {} host {}s", format_mib(jnum(p, "suspended_host_bytes")),
                                            now > since ? (now - since) / 1'000'000'000ULL : 0)));
      } else {
        row.push_back(Cell::str(tampered ? "tampered" : jstr(p, "state")));
      }
      procs.rows.push_back(std::move(row));
    };
    if (devs.empty()) {
      if (filter.empty()) row_for(nullptr);
    } else {
      for (const auto& d : devs)
        if (gpu_matches(filter, d, "gpu_index")) row_for(&d);
    }
  }
  // Processes on a GPU without cuwarden: only the driver's figure, and none of it capped.
  for (const auto& u : unmanaged) {
    if (!gpu_matches(filter, u, "gpu_index")) continue;
    std::vector<Cell> row = {jcell(u, "gpu_index", CellKind::integer), jcell(u, "pid", CellKind::integer),
                             Cell::none(), Cell::str(jstr(u, "process_name"))};
    for (std::size_t i = 0; i < shown.size(); ++i) {
      row.push_back(Cell::none());
      if (i == 0) {
        row.push_back(jcell(u, "driver_used_bytes", CellKind::bytes));
        row.push_back(jcell(u, "driver_used_bytes", CellKind::bytes));
      }
    }
    row.push_back(Cell::str("unmanaged"));
    procs.rows.push_back(std::move(row));
  }

  // Every box the same width, like nvidia-smi's.
  const std::string gpu_note = "No GPU seen yet (no interposed process has used CUDA)";
  const Table jobs = jobs_table(st, filter);
  std::size_t width = std::max(render_box(procs, "Processes:", "No interposed processes found").find('\n'),
                               render_box(gpus, "", gpu_note).find('\n'));
  if (!jobs.rows.empty()) width = std::max(width, render_box(jobs, "Jobs (shared caps per GPU):", "").find('\n'));
  out += render_box(gpus, "", gpu_note, width);
  out += "\n";
  out += render_box(procs, "Processes:", "No interposed processes found", width);
  if (!jobs.rows.empty()) {
    out += "\n";
    out += render_box(jobs, "Jobs (shared caps per GPU):", "", width);
  }
  const auto& problems = jarr(st, "problems");
  if (!problems.empty()) {
    out += "\nProblems (ring files the daemon refused):\n";
    for (const auto& pr : problems) out += fmt::format("  {}: {}\n", jstr(pr, "path"), jstr(pr, "reason"));
  }
  return out;
}

/// Whether every entry of `filter` (-i: indexes or UUID prefixes) names a GPU the daemon
/// knows; else *why says which does not. With no GPU known yet, any filter is accepted (the
/// table says so itself).
bool known_gpus(const json& st, const std::string& filter, std::string* why) {
  const auto& gpus = jarr(st, "gpus");
  if (gpus.empty()) return true;
  std::stringstream ss(filter);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    bool found = false;
    for (const auto& g : gpus) found = found || gpu_matches(item, g, "index");
    if (!found) {
      std::string have;
      for (const auto& g : gpus) have += (have.empty() ? "" : ", ") + std::to_string(jnum(g, "index"));
      *why = "no GPU '" + item + "' (GPUs: " + have + ")";
      return false;
    }
  }
  return true;
}

/// --json -i: only the GPUs the filter names, and each process's and job's rows on them.
void filter_state(json& st, const std::string& filter) {
  auto keep = [&](json& arr, const char* index_key) {
    if (!arr.is_array()) return;
    json out = json::array();
    for (auto& x : arr)
      if (gpu_matches(filter, x, index_key)) out.push_back(std::move(x));
    arr = std::move(out);
  };
  if (st.contains("gpus")) keep(st["gpus"], "index");
  if (st.contains("processes") && st["processes"].is_array()) {
    json out = json::array();
    for (auto& p : st["processes"]) {
      if (!p.contains("devices")) continue;
      keep(p["devices"], "gpu_index");
      if (!p["devices"].empty()) out.push_back(std::move(p));
    }
    st["processes"] = std::move(out);
  }
  if (st.contains("jobs") && st["jobs"].is_array()) {
    json out = json::array();
    for (auto& j : st["jobs"]) {
      if (!j.contains("gpus")) continue;
      keep(j["gpus"], "gpu_index");
      if (!j["gpus"].empty()) out.push_back(std::move(j));
    }
    st["jobs"] = std::move(out);
  }
}

volatile std::sig_atomic_t g_status_stop = 0;

}  // namespace

int cmd_status(const StatusOptions& o) {
  // Parse --query-compute-apps (or --query-gpu) / --format before asking anything: bad input
  // exits 2. Both queries are one table, a row per process and GPU or per GPU, printed alike.
  const bool gpu_query = !o.query_gpu.empty();
  if (gpu_query && !o.query_compute_apps.empty()) {
    std::fprintf(stderr, "cuwarden: give --query-gpu or --query-compute-apps, not both\n");
    return kExitUsage;
  }
  const char* const option = gpu_query ? "--query-gpu" : "--query-compute-apps";
  const std::vector<QueryField> all_fields = gpu_query ? gpu_query_fields() : query_fields();
  std::vector<const QueryField*> fields;
  bool csv_header = true, csv_units = true, rows_json = false;
  const bool query = gpu_query || !o.query_compute_apps.empty();
  if (query) {
    std::stringstream ss(gpu_query ? o.query_gpu : o.query_compute_apps);
    std::string f;
    while (std::getline(ss, f, ',')) {
      f.erase(0, f.find_first_not_of(" \t"));
      f.erase(f.find_last_not_of(" \t") + 1);
      if (f.empty()) continue;
      if (!find_query_field(all_fields, f)) {
        std::fprintf(stderr, "Field \"%s\" is not a valid field to query.\n", f.c_str());
        return kExitUsage;
      }
      fields.push_back(find_query_field(all_fields, f));
    }
    if (fields.empty()) {
      std::fprintf(stderr, "cuwarden: %s needs at least one field\n", option);
      return kExitUsage;
    }
    if (o.format.empty()) {
      std::fprintf(stderr, "cuwarden: --format= must be specified with %s (e.g. --format=csv)\n", option);
      return kExitUsage;
    }
  }
  if (!o.format.empty()) {
    std::stringstream ss(o.format);
    std::string f;
    bool csv = false;
    while (std::getline(ss, f, ',')) {
      if (f == "csv") csv = true;
      else if (f == "json") rows_json = true;
      else if (f == "noheader") csv_header = false;
      else if (f == "nounits") csv_units = false;
      else {
        std::fprintf(stderr, "cuwarden: unknown --format option \"%s\" (use csv[,noheader][,nounits] or json)\n", f.c_str());
        return kExitUsage;
      }
    }
    if (csv == rows_json) {
      std::fprintf(stderr, "cuwarden: --format must include csv, or be json\n");
      return kExitUsage;
    }
    if (!query) {
      std::fprintf(stderr, "cuwarden: --format goes with --query-compute-apps or --query-gpu\n");
      return kExitUsage;
    }
  }

  if (o.loop_seconds > 0) {
    std::signal(SIGINT, [](int) { g_status_stop = 1; });
    std::signal(SIGTERM, [](int) { g_status_stop = 1; });
  }
  for (bool first = true;; first = false) {
    auto st = ask(o.socket, proto::Command::get_state, json::object());
    if (!st) return kExitFailure;
    if (!o.gpu_filter.empty()) {
      std::string why;
      if (!known_gpus(*st, o.gpu_filter, &why)) {
        std::fprintf(stderr, "cuwarden: %s\n", why.c_str());
        return kExitFailure;
      }
      if (o.json) filter_state(*st, o.gpu_filter);
    }
    if (o.list_gpus) {
      for (const auto& g : jarr(*st, "gpus"))
        if (gpu_matches(o.gpu_filter, g, "index"))
          std::printf("GPU %llu: %s (UUID: %s)\n", static_cast<unsigned long long>(jnum(g, "index")),
                      jstr(g, "name").c_str(), jstr(g, "uuid").c_str());
    } else if (o.json) {
      // Looping: one document per line, which a reader parses line by line.
      std::fputs((st->dump(o.loop_seconds > 0 ? -1 : 2, ' ', false, json::error_handler_t::replace) + "\n").c_str(),
                 stdout);
    } else if (query) {
      Table t;
      for (const QueryField* f : fields) t.columns.push_back({f->header, f->kind == CellKind::bytes});
      std::map<std::string, json> gpu_by_uuid;
      for (const auto& g : jarr(*st, "gpus")) gpu_by_uuid[jstr(g, "uuid")] = g;
      if (gpu_query)
        for (const auto& g : jarr(*st, "gpus")) {
          if (!gpu_matches(o.gpu_filter, g, "index")) continue;
          std::vector<Cell> row;
          for (const QueryField* f : fields) row.push_back(gpu_query_cell(*f, *st, g));
          t.rows.push_back(std::move(row));
        }
      for (const json* pp : by_pid(*st)) {
        if (gpu_query) break;
        const json& p = *pp;
        // nvidia-smi lists running processes; a suspended one is listed too (its used_memory 0,
        // its state and host bytes in fields of their own), as it still holds its place.
        const std::string state = jstr(p, "state");
        if (state != "running" && state != "suspended") continue;
        for (const auto& d : jarr(p, "devices")) {
          if (!gpu_matches(o.gpu_filter, d, "gpu_index")) continue;
          std::vector<Cell> row;
          for (const QueryField* f : fields) row.push_back(query_cell(*f, *st, p, d, gpu_by_uuid));
          t.rows.push_back(std::move(row));
        }
      }
      if (rows_json)  // the same rows: numbers in bytes, missing values null; one document per line when looping
        std::fputs((render_json(t).dump(o.loop_seconds > 0 ? -1 : 2) + "\n").c_str(), stdout);
      else
        std::fputs(render_csv(t, csv_header && first, csv_units).c_str(), stdout);  // the header once, as nvidia-smi
    } else {
      std::fputs(render_table(*st, o.gpu_filter).c_str(), stdout);
    }
    std::fflush(stdout);
    if (o.loop_seconds <= 0) return kExitOk;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.loop_seconds);
    while (!g_status_stop && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_status_stop) return kExitOk;
    if (!o.json && !query) std::fputs("\n", stdout);
  }
}

}  // namespace cuw::cli
