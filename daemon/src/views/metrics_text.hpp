// cuwarden daemon view: Prometheus's text format (0.0.4) from a published State.
#pragma once

#include <string>

#include "model/state.hpp"

namespace cuw::daemon {

/// The /metrics page of `st`. Names come from the counter list (counters.hpp): its gauge
/// rows per running process and GPU (labels hostname, gpu, uuid, pid, process, user,
/// cuwarden_job; a cap row is absent when there is no cap, and an exited process has no
/// series), its counter rows per GPU, job and user, summed over every process the State
/// has and those it forgot (State::retired: so they never fall when a process exits); then
/// events dropped per job and user, jobs' used bytes and caps per GPU, devices' total,
/// tracked and driver-reported bytes, the number of running processes, and build info.
/// Base units (bytes). Pure; any thread.
std::string metrics_text(const State& st);

/// `v` escaped for a label value: backslash, double quote and line feed; bytes that are not
/// well-formed UTF-8 become U+FFFD. Pure.
std::string escape_label(const std::string& v);

}  // namespace cuw::daemon
