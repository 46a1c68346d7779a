// cuwarden CLI: the commands, one file each; main.cpp parses arguments and calls these.
#pragma once

#include <string>
#include <vector>

namespace cuw::cli {

struct StatusOptions {
  std::string socket;
  bool json = false;
  std::string query_compute_apps;  ///< comma-separated fields; empty = the table
  std::string format;              ///< "csv[,noheader][,nounits]"
  std::string gpu_filter;          ///< -i: GPU index or UUID (prefix)
  double loop_seconds = 0;         ///< -l: repeat every N seconds
};
int cmd_status(const StatusOptions& o);

struct EventsOptions {
  std::string socket;
  long long pid = -1;
  bool follow = false;
  bool json = false;
  unsigned max = 100;
};
int cmd_events(const EventsOptions& o);

struct LimitOptions {
  std::string socket;
  std::string target;  ///< "PID", "job:NAME" or "job:USER/NAME"
  std::string size;    ///< "8G", "75%" (PID only), "none"/"unlimited"
  std::string user;    ///< --user: the job's owner (root only, for other users' jobs)
  int device = -1;     ///< --device: CUDA ordinal as the process sees it; -1 = every device in use
  bool json = false;
};
int cmd_limit(const LimitOptions& o);

struct RunOptions {
  std::string limit, job, job_limit, pool, lib;
  std::string cap_scope;  ///< empty: CUWARDEN_CAP_SCOPE as set (default allocations)
  int callsites = -1;  ///< -1: not given
  std::vector<std::string> command;
};
/// Returns only on failure (exec replaces the process).
int cmd_run(const RunOptions& o);

}  // namespace cuw::cli
