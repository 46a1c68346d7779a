// cuwarden: the command users type. Without a subcommand it prints the nvidia-smi-like
// table (or --json, or --query-compute-apps CSV); `run` launches a program under the
// interposer; `fit` searches for the largest value of a parameter that fits under a cap;
// `events` prints what the daemon collected; `top` shows it live.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fmt/format.h>
#include <regex>
#include <string>
#include <string_view>

#include "client.hpp"
#include "commands.hpp"
#include "cuw/options.hpp"
#include "cuw/paths.hpp"
#include "fields.hpp"
#include "tensors_mode.hpp"

namespace {

/// The table's Markdown as plain text: without the backticks.
std::string plain(std::string_view markdown) {
  std::string s;
  for (char c : markdown)
    if (c != '`') s += c;
  return s;
}

/// "values; default D" of an option, as --help shows it.
std::string values_help(const cuw::options::Option& o) {
  std::string s = plain(o.values);
  if (*o.default_value) s += std::string("; default ") + o.default_value;
  return s;
}

/// The help of the `cuwarden run` flag that sets `o`: its doc line, values and variable.
std::string flag_help(const cuw::options::Option& o) {
  return plain(o.doc) + " (" + values_help(o) + "; sets " + o.variable + ")";
}

/// The footer of `cuwarden run --help`: every variable of the options table.
std::string environment_help() {
  std::string s =
      "Environment, read by libcuwarden.so at the program's first CUDA call (a flag above sets its variable):";
  for (const cuw::options::Option& o : cuw::options::kOptions) {
    s += std::string("\n  ") + o.variable;
    if (*o.flag) s += std::string(" (") + o.flag + ")";
    s += ": " + values_help(o) + "\n      " + plain(o.doc);
  }
  return s;
}

/// A CLI11 parse error in cuwarden's words: what was wrong, with the value and the range or
/// the commands, instead of the library's own sentences. Anything unknown keeps its text.
std::string parse_error_words(const CLI::ParseError& e) {
  const std::string what = e.what();
  std::smatch m;
  // "--loop: Value abc not in range 0.000000 to 86400.000000"
  static const std::regex range(R"(^(\S+): Value (.*) not in range (\S+) to (\S+)$)");
  if (std::regex_match(what, m, range))
    return fmt::format("{} takes a number from {:g} to {:g}, not '{}'", m[1].str(), std::stod(m[3].str()),
                       std::stod(m[4].str()), m[2].str());
  // "The following argument was not expected: frobnicate" (or "arguments were ...: a b")
  static const std::regex extras(R"(^The following arguments? (?:was|were) not expected: (.*)$)");
  if (std::regex_match(what, m, extras))
    return fmt::format(
        "unknown command or argument '{}' (commands: run, top, events, snapshot, summary, oom, fit, limit, suspend, resume)",
        m[1].str());
  // "Could not convert: --pid = abc"
  static const std::regex conversion(R"(^Could not convert: (\S+) = (.*)$)");
  if (std::regex_match(what, m, conversion)) return fmt::format("{}: '{}' is not a number", m[1].str(), m[2].str());
  // "--socket: 1 required TEXT missing"
  static const std::regex missing(R"(^(\S+): \d+ required \S+ missing$)");
  if (std::regex_match(what, m, missing)) return fmt::format("{} needs a value", m[1].str());
  return what;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cuw::cli;
  CLI::App app{"cuwarden: GPU memory caps and accounting for processes you did not build"};
  app.set_version_flag("--version", std::string("cuwarden ") + CUWARDEN_VERSION);
  app.require_subcommand(0, 1);

  std::string socket = cuw::paths::socket_path();
  app.add_option("--socket", socket,
                 "daemon socket (default: $CUWARDEN_SOCKET, else daemon/cuwardend.sock in $CUWARDEN_RUN_DIR "
                 "when set, else /run/cuwarden/cuwardend.sock)");

  StatusOptions st;
  app.add_flag("--json", st.json, "print the daemon's state as JSON");
  app.add_option("--query-compute-apps", st.query_compute_apps, cuw::cli::query_fields_help());
  bool fields_reference = false;
  app.add_flag("--help-query-compute-apps", fields_reference, "list the fields of --query-compute-apps, as nvidia-smi");
  app.add_option("--query-gpu", st.query_gpu,
                 "comma-separated fields, one row per GPU, as nvidia-smi: index, uuid, name, pci.bus_id, memory.total, "
                 "memory.used, memory.free, memory.reserved, count, driver_version, timestamp");
  bool gpu_fields_ref = false;
  app.add_flag("--help-query-gpu", gpu_fields_ref, "list the fields of --query-gpu, as nvidia-smi");
  app.add_flag("-L,--list-gpus", st.list_gpus, "one line per GPU: GPU 0: NAME (UUID: GPU-...), as nvidia-smi -L");
  app.add_option("--format", st.format, "csv[,noheader][,nounits], or json (the same rows as objects)");
  app.add_option("-i,--id", st.gpu_filter, "only these GPUs (index or UUID, comma-separated)");
  app.add_option("-l,--loop", st.loop_seconds, "repeat every SEC seconds")->check(CLI::Range(0.0, 86400.0));
  double loop_ms = 0;
  app.add_option("--loop-ms", loop_ms, "repeat every MS milliseconds (also -lms MS, as nvidia-smi)")
      ->check(CLI::Range(1.0, 86400000.0));

  auto* run = app.add_subcommand("run", "run a command under cuwarden: cuwarden run [options] -- CMD ...");
  RunOptions ro;
  // Each flag sets one variable of the options table: its name and help come from the row.
  const auto run_flag = [run](cuw::options::Id id, auto& field) {
    const cuw::options::Option& o = cuw::options::get(id);
    run->add_option(o.flag, field, flag_help(o));
  };
  run_flag(cuw::options::Id::CUWARDEN_LIMIT, ro.limit);
  run_flag(cuw::options::Id::CUWARDEN_CAP_SCOPE, ro.cap_scope);
  run_flag(cuw::options::Id::CUWARDEN_JOB, ro.job);
  run_flag(cuw::options::Id::CUWARDEN_JOB_LIMIT, ro.job_limit);
  run_flag(cuw::options::Id::CUWARDEN_POOL, ro.pool);
  run_flag(cuw::options::Id::CUWARDEN_CALLSITES, ro.callsites);
  run->add_flag("--tensors", ro.tensors,
                "every tensor through cuwarden's pool: sets each framework's switch that sends every buffer to the "
                "driver (listed below; also CUWARDEN_TENSORS=1)");
  run->add_option("--lib", ro.lib, "path of libcuwarden.so (default: $CUWARDEN_LIB, then the one installed beside this cuwarden)");
  run->footer(
      "Nested runs: cuwarden run never loosens what it inherits. --limit applies together with the inherited\n"
      "CUWARDEN_LIMIT and CUWARDEN_OUTER_LIMIT (the lowest cap on each device); --job-limit is the lower of it and\n"
      "CUWARDEN_JOB_LIMIT; an inherited CUWARDEN_JOB is kept; --cap-scope only widens to process; with an\n"
      "inherited cap, CUWARDEN_ON_ERROR=open becomes fail. Each of these is said on standard error.\n\n" +
      tensors_help() + "\n\n" + environment_help());
  // Everything from the command on is the command's, with or without "--".
  run->prefix_command();
  run->fallthrough(false);

  auto* fit = app.add_subcommand(
      "fit", "the largest value that fits under a cap: cuwarden fit --limit S --try NAME=LO..HI -- CMD ... {NAME} ...");
  FitOptions fo;
  fit->add_option("--limit", fo.limit, "the cap every try runs under, as `cuwarden run --limit` takes it")->required();
  fit->add_option("--try", fo.try_spec, "NAME=LO..HI: the whole numbers to search; {NAME} in the command becomes each")
      ->required();
  fit->add_option("--plot", fo.plot, "also draw peak memory against each value tried, as an SVG file");
  // The same flags as `cuwarden run`'s, from the same rows of the options table.
  for (const auto& [id, field] : {std::pair{cuw::options::Id::CUWARDEN_POOL, &fo.pool},
                                  std::pair{cuw::options::Id::CUWARDEN_CAP_SCOPE, &fo.cap_scope}}) {
    const cuw::options::Option& o = cuw::options::get(id);
    fit->add_option(o.flag, *field, flag_help(o));
  }
  fit->add_option("--lib", fo.lib, "path of libcuwarden.so, as for `cuwarden run`");
  fit->add_flag("--json", fo.json, "print the tries and the answer as one JSON document");
  fit->add_flag("--show-output", fo.show_output,
                "pass the command's output through, to standard error (default: kept out of the way; the end of its "
                "standard error is shown when a try fails)");
  fit->footer(
      "Each try runs the command as `cuwarden run --limit S` would, with {NAME} replaced by the value tried,\n"
      "and waits for it and every process it started. Exit 0: it fits. An exit (or a signal) after a\n"
      "refusal by the cap, or a failed allocation of the driver: it does not fit. Any other failure stops\n"
      "the search and shows the end of its standard error. LO is tried first, then HI, then halves\n"
      "(assuming that whatever fits, every smaller value fits too). Peak memory is per GPU: the most one\n"
      "process of the try held, as the cap counts it. No daemon is needed; a running one does not see the tries.\n"
      "Exit status: 0 a value fits, 1 a try failed (or fit could not run), 2 bad arguments, 4 not even LO fits.");
  fit->prefix_command();
  fit->fallthrough(false);

  auto* top = app.add_subcommand("top", "a live view of GPUs and processes, with each process's memory over time");
  TopOptions to;
  top->add_flag("--once", to.once, "print one frame as plain text and exit (as top -b -n 1)");
  top->add_option("--pid", to.pid, "with --once: the detail view of this process (its counters, call sites, events)");
  top->add_option("-d,--delay", to.interval_s, "seconds between refreshes (default 1)")->check(CLI::Range(0.1, 3600.0));
  top->add_option("--socket", socket, "daemon socket");
  top->footer(
      "Keys: s cycles the sort key; u, p, c, n, P sort by used, peak, cap, name, pid; r reverses;\n"
      "up/down (or j/k) select a process; Enter shows its counters, top call sites and last events;\n"
      "there f unfolds each call site to every frame (as snapshot --full) and folds it again;\n"
      "Esc or Backspace goes back; q quits. A process's sparkline is its used bytes at the last 60\n"
      "refreshes this cuwarden made (it starts empty; --once has none).\n"
      "Exit status: 0, or 1 when no daemon answers or there is no terminal.");

  auto* events = app.add_subcommand("events", "print allocation events the daemon collected");
  EventsOptions eo;
  events->add_option("--pid", eo.pid, "only this process");
  events->add_flag("-f,--follow", eo.follow, "keep printing new events");
  events->add_flag("--json", eo.json, "one JSON object per line");
  events->add_option("--socket", socket, "daemon socket");
  events->add_option("--max", eo.max, "how many recent events")->check(CLI::Range(1u, 100000u));

  auto* snapshot = app.add_subcommand("snapshot", "a process's live allocations, call sites and recent events");
  SnapshotOptions so;
  snapshot->add_option("pid", so.pid, "the process")->required();
  snapshot->add_option("--format", so.format,
                       "text (default), json, pytorch (a pickle for pytorch.org/memory_viz), perfetto (ui.perfetto.dev), "
                       "folded (flame graph stacks for flamegraph.pl, inferno, speedscope)");
  snapshot->add_option("-o,--output", so.output, "write to this file (default: standard output)");
  snapshot->add_option("--top", so.top, "call sites and allocations the text lists")->check(CLI::Range(1u, 100000u));
  snapshot->add_option("--oom", so.oom, "the snapshot taken at the Nth newest out-of-memory report (0: the newest)")
      ->check(CLI::Range(0, 1000));
  snapshot->add_flag("--leaks", so.leaks,
                     "the call sites whose live bytes grew over the daemon's last 3 samples (every 30 s), never falling, by "
                     "max(1 MiB, 1%) or more, after the warm-up");
  snapshot->add_option("--since", so.since,
                       "the call sites whose live bytes changed since the daemon's sample of this long ago (30s, 10m, 1h)");
  snapshot->add_option("--leak-warmup", so.leak_warmup,
                       "with --leaks: leave out the samples of this long after the process's first allocation "
                       "(default 60s; 0: none)");
  snapshot->add_flag("--full", so.full, "list every frame of each call site (with its class), not only its printed form");
  snapshot->add_option("--by", so.by,
                       "how call sites are grouped: user (default: sites whose user frames are equal are one, their bytes "
                       "added) or native (one per native stack, as captured)")
      ->check(CLI::IsMember({"user", "native"}));
  snapshot->add_option("--socket", socket, "daemon socket");
  auto* summary = app.add_subcommand("summary", "a memory_summary-like table of a process, any program");
  SnapshotOptions sumo;
  sumo.format = "summary";
  summary->add_option("pid", sumo.pid, "the process")->required();
  summary->add_option("--socket", socket, "daemon socket");
  auto* oom = app.add_subcommand("oom", "the out-of-memory reports the daemon kept (with their snapshots)");
  OomOptions oo;
  oom->add_option("pid", oo.pid, "only this process's");
  oom->add_flag("--json", oo.json, "the daemon's reply as JSON");
  oom->add_option("--socket", socket, "daemon socket");

  auto* limit = app.add_subcommand("limit", "change the cap of a running process or job: cuwarden limit PID|job:NAME SIZE");
  LimitOptions lo;
  limit->add_option("target", lo.target, "PID, job:NAME (your job) or job:USER/NAME (root: another user's)")->required();
  limit->add_option("size", lo.size, "new cap: 8G, 512MiB, 75% (PID only), none|unlimited (root only)")->required();
  limit->add_option("--device", lo.device, "only this GPU, by the number `cuwarden` shows for it (PID only)")
      ->check(CLI::Range(0, 1023));
  limit->add_option("--user", lo.user, "the job's user (name or uid), for root changing another user's job");
  limit->add_flag("--json", lo.json, "print the daemon's reply as JSON");
  limit->add_option("--socket", socket, "daemon socket");
  limit->footer(
      "Root may set, raise or remove any cap. Other users may only lower the caps of their own\n"
      "processes and jobs, within the policy (cuwardend --config). Exit status 3: refused.");

  SuspendOptions sus, uo;
  uo.resume = true;
  auto* suspend = app.add_subcommand(
      "suspend", "move a process's (or a job's) device memory to the host: cuwarden suspend PID|job:NAME");
  suspend->add_option("target", sus.target, "PID, job:NAME (your job) or job:USER/NAME (root: another user's)")->required();
  suspend->add_option("--timeout", sus.timeout, "how long each process's lock may wait for its GPU work (default 10s)");
  suspend->add_flag("--json", sus.json, "print the daemon's reply as JSON");
  suspend->add_option("--socket", socket, "daemon socket");
  suspend->footer(
      "The daemon suspends through the driver's checkpoint API (driver 570 or later): the process's calls wait\n"
      "until it is resumed, its GPU memory is free meanwhile. A job goes as a whole or not at all. The owner or\n"
      "root only. Refused (exit status 3), with the reason: a process that used managed memory or CUDA IPC, one\n"
      "whose memory cgroup or node cannot hold its device memory, another user's.");
  auto* resume = app.add_subcommand("resume", "bring a suspended process (or job) back: cuwarden resume PID|job:NAME");
  resume->add_option("target", uo.target, "PID, job:NAME or job:USER/NAME")->required();
  resume->add_flag("--json", uo.json, "print the daemon's reply as JSON");
  resume->add_option("--socket", socket, "daemon socket");
  resume->add_option("--gpu", uo.gpu,
                     "restore onto GPU N (its index as nvidia-smi numbers it, or its UUID) instead of its own");
  resume->footer(
      "Refused (exit status 3) while its GPUs lack the free memory it needs back, with the figures.\n"
      "--gpu N moves a process suspended from one GPU onto GPU N: it keeps its device addresses, its\n"
      "job share moves with it; one that held memory on N already resumes where it was. Refused (exit\n"
      "status 3), before the driver is called: a process that held memory on several GPUs, a GPU of\n"
      "another chip, a GPU without its footprint free plus a margin; an unknown GPU fails (exit status 1).\n"
      "A job moves whole: every member is checked before any is restored.");

  // `run [options] -- CMD ...` (and `fit`): CLI11 sees only what precedes "--"; the rest is the command
  // verbatim. Without "--", prefix_command() stops at the first non-option (the command).
  // nvidia-smi spells the millisecond loop "-lms" (one dash, three letters): CLI11 would read
  // it as -l -m -s. Everything after `run` is the command's, left alone.
  std::vector<std::string> args(argv, argv + argc);
  for (std::size_t i = 1; i < args.size() && args[i] != "run" && args[i] != "fit"; ++i)
    if (args[i] == "-lms") args[i] = "--loop-ms";
    else if (args[i].rfind("-lms=", 0) == 0) args[i] = "--loop-ms=" + args[i].substr(5);
  std::vector<char*> argv_fixed;
  for (auto& a : args) argv_fixed.push_back(a.data());
  argv_fixed.push_back(nullptr);
  argv = argv_fixed.data();

  std::vector<std::string> after_dashes;
  int parse_argc = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) != "run" && std::string(argv[i]) != "fit") continue;
    for (int k = i + 1; k < argc; ++k)
      if (std::string(argv[k]) == "--") {
        after_dashes.assign(argv + k + 1, argv + argc);
        parse_argc = k;
        break;
      }
    break;
  }
  // nvidia-smi's `--query-compute-apps=` with nothing after it: CLI11 would take the next
  // argument (often --format=csv) as the field list.
  for (int i = 1; i < parse_argc; ++i)
    if (std::string_view(argv[i]) == "--query-compute-apps=" || std::string_view(argv[i]) == "--query-gpu=") {
      const bool gpu = std::string_view(argv[i]) == "--query-gpu=";
      std::fprintf(stderr, "cuwarden: %s names no field: give some, e.g. %s (cuwarden --help-%s lists them)\n", argv[i],
                   gpu ? "--query-gpu=index,memory.used" : "--query-compute-apps=pid,used_memory",
                   gpu ? "query-gpu" : "query-compute-apps");
      return kExitUsage;
    }
  try {
    app.parse(parse_argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string cmd = "cuwarden";
    for (const CLI::App* sub : app.get_subcommands()) cmd += " " + sub->get_name();
    std::fprintf(stderr, "%s: %s\nSee '%s --help'.\n", cmd.c_str(), parse_error_words(e).c_str(), cmd.c_str());
    return kExitUsage;
  }

  if (*run) {
    ro.command = run->remaining();
    if (parse_argc != argc) {
      if (!ro.command.empty()) {
        std::fprintf(stderr, "cuwarden run: unexpected '%s' before '--'\n", ro.command.front().c_str());
        return kExitUsage;
      }
      ro.command = after_dashes;
    }
    return cmd_run(ro);
  }
  if (*fit) {
    fo.command = fit->remaining();
    if (parse_argc != argc) {
      if (!fo.command.empty()) {
        std::fprintf(stderr, "cuwarden fit: unexpected '%s' before '--'\n", fo.command.front().c_str());
        return kExitUsage;
      }
      fo.command = after_dashes;
    }
    return cmd_fit(fo);
  }
  if (*limit) {
    lo.socket = socket;
    return cmd_limit(lo);
  }
  if (*suspend) {
    sus.socket = socket;
    return cmd_suspend(sus);
  }
  if (*resume) {
    uo.socket = socket;
    return cmd_suspend(uo);
  }
  if (*top) {
    to.socket = socket;
    return cmd_top(to);
  }
  if (*events) {
    eo.socket = socket;
    return cmd_events(eo);
  }
  if (*snapshot) {
    so.socket = socket;
    return cmd_snapshot(so);
  }
  if (*summary) {
    sumo.socket = socket;
    return cmd_snapshot(sumo);
  }
  if (*oom) {
    oo.socket = socket;
    return cmd_oom(oo);
  }
  if (fields_reference) {
    std::fputs(cuw::cli::query_fields_reference().c_str(), stdout);
    return kExitOk;
  }
  if (gpu_fields_ref) {
    std::fputs(cuw::cli::gpu_fields_reference().c_str(), stdout);
    return kExitOk;
  }
  st.socket = socket;
  if (loop_ms > 0) {
    if (st.loop_seconds > 0) {
      std::fprintf(stderr, "cuwarden: give -l SEC or -lms MS, not both\n");
      return kExitUsage;
    }
    st.loop_seconds = loop_ms / 1000.0;
  }
  return cmd_status(st);
}
