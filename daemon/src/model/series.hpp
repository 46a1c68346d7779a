// cuwarden daemon model: memory over time (the HTTP API's history, the web page's charts).
//
// Fed once a second by the loop thread with the State it just published; read by the HTTP
// thread. One mutex: record() holds it for the length of one pass over the State, readers
// for one copy of what they asked for.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "model/state.hpp"

namespace cuw::daemon {

/// K values over time at two resolutions: one point a second for the last hour, one a
/// minute for the last day. A point is kept only when a value changed (with the last
/// sample of the old values before it, so that a chart steps where the change was), so an
/// idle series holds one or two points. Bound: 3,602 + 1,442 points of 4 + 8K bytes.
/// Not thread-safe (SeriesStore locks).
template <std::size_t K>
class Series {
 public:
  using Values = std::array<uint64_t, K>;
  struct Point {
    uint32_t t = 0;  ///< unix seconds
    Values v{};
  };
  static constexpr uint32_t kHourSpan = 3600, kDaySpan = 86400;

  /// Add the sample taken at unix second `t` (not earlier than the last one). In the minute
  /// series, value i is the largest of the minute's samples when max_of_minute[i], else its
  /// last.
  void add(uint32_t t, const Values& v, const std::array<bool, K>& max_of_minute) {
    keep(hour_, hour_pending_, {t, v}, kHourSpan);
    const uint32_t minute = t - t % 60;
    if (minute_ && minute_->t == minute) {
      for (std::size_t i = 0; i < K; ++i) minute_->v[i] = max_of_minute[i] ? std::max(minute_->v[i], v[i]) : v[i];
    } else {
      if (minute_) keep(day_, day_pending_, *minute_, kDaySpan);
      minute_ = Point{minute, v};
    }
  }
  /// The hour's points (day == false) or the day's, oldest first, ending with the newest
  /// sample; the first point's time is clamped to the start of the range.
  std::vector<Point> points(bool day) const {
    std::vector<Point> out(day ? day_.begin() : hour_.begin(), day ? day_.end() : hour_.end());
    const std::optional<Point>& pending = day ? day_pending_ : hour_pending_;
    if (pending) out.push_back(*pending);
    if (day && minute_) {
      if (!out.empty() && out.back().v == minute_->v) out.back().t = std::max(out.back().t, minute_->t);
      else out.push_back(*minute_);
    }
    if (!out.empty()) {
      const uint32_t newest = out.back().t, span = day ? kDaySpan : kHourSpan;
      const uint32_t start = newest > span ? newest - span : 0;
      if (out.front().t < start) out.front().t = start;
    }
    return out;
  }
  /// Bytes held by the points (what --history-bytes reports).
  std::size_t bytes() const noexcept { return (hour_.size() + day_.size() + 3) * sizeof(Point); }

 private:
  static void keep(std::deque<Point>& pts, std::optional<Point>& pending, const Point& p, uint32_t span) {
    if (!pts.empty() && pts.back().v == p.v) {
      pending = p;  // unchanged: only the last such sample matters
    } else {
      if (pending && !pts.empty() && pending->t > pts.back().t) pts.push_back(*pending);
      pending.reset();
      pts.push_back(p);
    }
    const uint32_t cutoff = p.t > span ? p.t - span : 0;
    // Keep one point at or before the cutoff: it says what the value was when the range starts.
    while (pts.size() > 1 && pts[1].t <= cutoff) pts.pop_front();
  }
  std::deque<Point> hour_, day_;
  std::optional<Point> hour_pending_, day_pending_;
  std::optional<Point> minute_;  ///< the minute being filled
};

/// An allocation refused, as a marker on a process's timeline.
struct OomMark {
  uint64_t time_ns = 0;  ///< CLOCK_REALTIME ns
  uint32_t ordinal = 0;  ///< the process's CUDA device ordinal
  uint64_t bytes = 0;    ///< what was asked
  uint8_t kind = 0;      ///< ring::EventKind: refuse, job_refuse or driver_error
};

/// What a reader copies out of the store for one range.
struct HistoryCopy {
  using ProcessSeries = Series<4>;  ///< used, reserved, peak, cap (ring::kNoLimit: none)
  using PairSeries = Series<2>;     ///< job: used, cap; GPU: used, driver's used (kUnknown: none)
  static constexpr uint64_t kUnknown = ~0ULL;
  struct Device {
    uint32_t ordinal = 0;
    std::string uuid;
    int gpu_index = -1;
    std::vector<ProcessSeries::Point> points;
  };
  struct Process {
    std::string file;  ///< ring file name
    uint32_t pid = 0;
    uint64_t start_time = 0;
    std::string name, user, job;
    bool exited = false;
    std::vector<Device> devices;
    std::vector<OomMark> ooms;
  };
  struct JobGpu {
    std::string uuid;
    int gpu_index = -1;
    std::vector<PairSeries::Point> points;
  };
  struct Job {
    std::string name, user;
    std::vector<JobGpu> gpus;
  };
  struct Gpu {
    int index = -1;
    std::string uuid, name;
    uint64_t total = 0;
    std::vector<PairSeries::Point> points;
  };
  bool day = false;
  uint64_t time_ns = 0;  ///< the newest sample's State time
  std::vector<Process> processes;
  std::vector<Job> jobs;
  std::vector<Gpu> gpus;
};

/// The history of every process, job and GPU the daemon knows, and the retired counters.
/// Thread-safety: every member may be called from any thread (one internal mutex).
class SeriesStore {
 public:
  static constexpr std::size_t kOomMarks = 256;  ///< newest OOM markers kept per process

  /// Sample `st` (the loop thread calls it after each scan's publish, about once a second;
  /// samples less than a second after the previous one are ignored). Processes and jobs
  /// that are no longer in `st` are forgotten.
  void record(const State& st);
  /// A copy of one range (day: the minute series). `pid`: that running (or lingering)
  /// process only, and no jobs or GPUs; nullopt when the store has no such process.
  std::optional<HistoryCopy> copy(bool day, std::optional<uint32_t> pid) const;
  /// Bytes the series hold now (points only), and how many series there are.
  std::pair<std::size_t, std::size_t> footprint() const;

 private:
  struct DeviceSeries {
    std::string uuid;
    int gpu_index = -1;
    HistoryCopy::ProcessSeries series;
  };
  struct ProcessEntry {
    uint32_t pid = 0;
    uint64_t start_time = 0;
    std::string name, user, job;
    uint32_t named_t = 0;  ///< when name, user and job were last read from the header (seconds)
    uint32_t seen_t = 0;   ///< the last record() whose State held the process
    bool exited = false;
    std::map<uint32_t, DeviceSeries> devices;  ///< by CUDA ordinal
    std::deque<OomMark> ooms;
    uint64_t oom_seq = 0;  ///< events up to this global seq were looked at
  };
  struct JobEntry {
    std::string name, user;
    std::map<std::string, std::pair<int, HistoryCopy::PairSeries>> gpus;  ///< by UUID: index, series
  };
  static constexpr uint32_t kForgetGpuS = 86400;  ///< a GPU not a row for a day is forgotten
  static constexpr std::size_t kMaxGpus = 256;     ///< GPUs kept at most; of those only one uid's
                                                   ///< rings made rows, kMaxRingGpusPerUid (gpus.hpp)
  struct GpuEntry {
    uint32_t seen_t = 0;  ///< when last a row (s)
    std::vector<uint32_t> uids;  ///< GpuRow::uids when last a row (empty: NVML's)
    int index = -1;
    std::string name;
    uint64_t total = 0;
    HistoryCopy::PairSeries series;
  };

  mutable std::mutex mu_;
  uint32_t last_t_ = 0;
  uint64_t time_ns_ = 0;
  std::map<std::string, ProcessEntry> procs_;  ///< by ring file name
  std::map<std::string, JobEntry> jobs_;       ///< by job file name
  std::map<std::string, GpuEntry> gpus_;       ///< by UUID
  std::set<uint32_t> gpu_limit_logged_;        ///< uids told of kMaxRingGpusPerUid
};

}  // namespace cuw::daemon
