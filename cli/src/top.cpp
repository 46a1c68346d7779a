// cuwarden CLI: `cuwarden top`, the live terminal view (curses), and `top --once`, one frame
// as plain text. The frames are made by top_view.cpp; this file asks the daemon, keeps the
// refresh clock, reads keys and draws.
#include <langinfo.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <clocale>
#include <cstdlib>
#include <csignal>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <vector>

// The function forms only: curses' macros (move, clear, erase, timeout) would rewrite the
// standard library's member calls.
#define NCURSES_NOMACROS 1
#include <curses.h>

#include "client.hpp"
#include "commands.hpp"
#include "json_access.hpp"
#include "top_view.hpp"

namespace cuw::cli {

using json = nlohmann::ordered_json;

namespace {

volatile std::sig_atomic_t g_stop = 0;

/// Events the detail view asks for: more than a screen holds, so the newest always fill it.
constexpr unsigned kDetailEvents = 200;
/// The detail view asks for a new snapshot every this many refreshes: a snapshot reads every
/// live allocation of the process, the events are cheap.
constexpr unsigned kSnapshotEvery = 10;

/// The terminal, in curses mode while this lives.
class Screen {
 public:
  Screen() = default;
  Screen(const Screen&) = delete;
  Screen& operator=(const Screen&) = delete;
  ~Screen() {
    if (!term_) return;
    if (!lost_) endwin();  // nothing to give back to a terminal that is gone
    delscreen(term_);
  }
  /// The terminal hung up: leave without writing to it.
  void lose() noexcept { lost_ = true; }

  /// Enters curses mode; false (with *why) when the terminal cannot be used.
  bool open(std::string* why) {
    const char* term = std::getenv("TERM");
    term_ = newterm(nullptr, stdout, stdin);
    if (!term_) {
      *why = std::string("cannot use the terminal (TERM=") + (term ? term : "") + ")";
      return false;
    }
    set_term(term_);
    cbreak();
    noecho();
    keypad(stdscr, TRUE);
    curs_set(0);
    set_escdelay(25);  // Esc leaves the detail view at once, not after a second
    if (has_colors()) {
      start_color();
      use_default_colors();
      init_pair(1, COLOR_BLACK, COLOR_CYAN);  // selected row
      init_pair(2, COLOR_GREEN, -1);          // memory used
      init_pair(3, COLOR_RED, -1);            // nearly full; warnings
      init_pair(4, COLOR_YELLOW, -1);         // where the caps add up to
      colors_ = true;
    }
    return true;
  }

  /// Draws `lines` from the top, each cut to the screen's width.
  void draw(const std::vector<top::Line>& lines) {
    werase(stdscr);
    const int h = getmaxy(stdscr), w = getmaxx(stdscr);
    for (int y = 0; y < h && static_cast<std::size_t>(y) < lines.size(); ++y) {
      wmove(stdscr, y, 0);
      for (const top::Span& s : top::clip(lines[static_cast<std::size_t>(y)], static_cast<std::size_t>(w)).spans) {
        wattrset(stdscr, attr(s.style));
        waddstr(stdscr, s.text.c_str());  // the last cell of the screen answers ERR: the text is drawn
      }
    }
    wattrset(stdscr, A_NORMAL);
    wrefresh(stdscr);
  }

  std::size_t width() const { return static_cast<std::size_t>(std::max(0, getmaxx(stdscr))); }
  std::size_t height() const { return static_cast<std::size_t>(std::max(0, getmaxy(stdscr))); }

 private:
  attr_t attr(top::Style s) const {
    using top::Style;
    switch (s) {
      case Style::normal: return A_NORMAL;
      case Style::title: return A_BOLD;
      case Style::header: return A_REVERSE;
      case Style::selected: return colors_ ? COLOR_PAIR(1) | A_BOLD : A_REVERSE | A_BOLD;
      case Style::dim: return A_DIM;
      case Style::bar_used: return colors_ ? COLOR_PAIR(2) : A_NORMAL;
      case Style::bar_high: return colors_ ? COLOR_PAIR(3) | A_BOLD : A_BOLD;
      case Style::bar_cap: return colors_ ? COLOR_PAIR(4) | A_BOLD : A_BOLD;
      case Style::warn: return colors_ ? COLOR_PAIR(3) | A_BOLD : A_BOLD;
    }
    return A_NORMAL;
  }

  SCREEN* term_ = nullptr;
  bool colors_ = false;
  bool lost_ = false;
};

/// A request whose failure is drawn, not printed: *message gets the reason.
std::optional<json> ask_quietly(const std::string& socket, proto::Command cmd, const json& body, std::string* message) {
  AskError e;
  e.quiet = true;
  auto r = ask(socket, cmd, body, &e);
  if (!r) *message = e.message;
  return r;
}

/// Asks for the detail view's events and, with `snapshot`, its call sites.
void refresh_detail(const std::string& socket, top::Detail& d, bool snapshot) {
  std::string why;
  if (auto ev = ask_quietly(socket, proto::Command::get_events, {{"pid", d.pid}, {"max", kDetailEvents}}, &why)) {
    d.events = std::move(*ev);
    d.events_error.clear();
  } else {
    d.events_error = why;
  }
  if (!snapshot) return;
  // The daemon gives a snapshot to the process's owner and root only: its refusal is shown.
  auto r = ask_quietly(socket, proto::Command::get_snapshot, {{"pid", d.pid}, {"format", "json"}}, &why);
  json body = r ? json::parse(jstr(*r, "body"), nullptr, false) : json();
  if (r && body.is_object()) {
    d.snapshot = std::move(body);
    d.snapshot_error.clear();
  } else {
    d.snapshot.reset();
    d.snapshot_error = r ? "the daemon's snapshot is not JSON" : why;
  }
}

bool utf8_locale() {
  const char* cs = nl_langinfo(CODESET);
  return cs && std::string(cs) == "UTF-8";
}

}  // namespace

int cmd_top(const TopOptions& o) {
  std::setlocale(LC_ALL, "");
  top::ViewOptions view;
  view.utf8 = utf8_locale();
  view.interval_s = o.interval_s;
  // The first answer, or the message `cuwarden` prints when there is no daemon.
  auto first = ask(o.socket, proto::Command::get_state, json::object());
  if (!first) return kExitFailure;
  json state = std::move(*first);
  std::vector<top::ProcRow> rows = top::process_rows(state);
  top::History history;
  history.record(rows);
  // Sparklines start from the daemon's history, asked for once per new row.
  std::set<std::string> seeded;
  auto seed_new_rows = [&] {
    bool ask_now = false;
    for (const std::string& k : history.unseeded(rows)) ask_now |= seeded.insert(k).second;
    if (!ask_now) return;
    std::string ignored;  // a daemon without history: the sparklines start empty
    if (auto h = ask_quietly(o.socket, proto::Command::get_history, {{"range", "hour"}}, &ignored))
      history.seed(rows, *h, o.interval_s);
  };

  if (o.once) {
    view.interactive = false;
    top::sort_rows(rows, view.sort, view.reversed);
    std::vector<top::Line> frame;
    if (o.pid >= 0) {
      auto it = std::find_if(rows.begin(), rows.end(), [&](const top::ProcRow& r) { return r.pid == uint64_t(o.pid); });
      if (it == rows.end()) {
        std::fprintf(stderr, "cuwarden top: no process %lld\n", o.pid);
        return kExitFailure;
      }
      top::Detail d{it->pid, std::to_string(jnum(it->process, "created_ns")), {}, {}, {}, {}};
      refresh_detail(o.socket, d, true);
      frame = top::detail_frame(state, rows, history, d, view, 200, 0);
    } else {
      frame = top::list_frame(state, rows, history, view, 0, 0, nullptr);
    }
    for (const top::Line& l : frame) std::puts(l.plain().c_str());
    return std::fflush(stdout) == 0 ? kExitOk : kExitFailure;
  }
  if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
    std::fprintf(stderr, "cuwarden top: needs a terminal (--once prints one frame as text)\n");
    return kExitFailure;
  }
  seed_new_rows();

  // Ctrl-C and the like end the loop, so that the terminal is given back as it was. No
  // SA_RESTART: the wait for a key returns at once.
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop = 1; };
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);

  Screen screen;
  std::string why;
  if (!screen.open(&why)) {
    std::fprintf(stderr, "cuwarden top: %s\n", why.c_str());
    return kExitFailure;
  }
  using clock = std::chrono::steady_clock;
  const auto interval = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(o.interval_s));
  auto next = clock::now() + interval;
  std::optional<top::Detail> detail;
  std::size_t index = 0;      // the selected row's place in the sorted list
  std::size_t first_row = 0;  // the first row shown (the list scrolls to keep the selection)
  unsigned refreshes = 0;
  bool dirty = true;
  while (!g_stop) {
    if (clock::now() >= next) {
      std::string fail;
      if (auto st = ask_quietly(o.socket, proto::Command::get_state, json::object(), &fail)) {
        state = std::move(*st);
        rows = top::process_rows(state);
        history.record(rows);
        seed_new_rows();
        view.status.clear();
      } else {
        view.status = fail;  // the last frame stays, without new samples, until the daemon answers
      }
      if (detail) refresh_detail(o.socket, *detail, ++refreshes % kSnapshotEvery == 0);
      next += interval;
      if (next <= clock::now()) next = clock::now() + interval;
      dirty = true;
    }
    if (dirty) {
      top::sort_rows(rows, view.sort, view.reversed);
      // The selection follows its row through sorting and refreshes; a row that went away
      // leaves it at the same place.
      auto it = std::find_if(rows.begin(), rows.end(), [&](const top::ProcRow& r) { return r.key == view.selected; });
      if (it != rows.end()) index = static_cast<std::size_t>(it - rows.begin());
      else index = rows.empty() ? 0 : std::min(index, rows.size() - 1);
      view.selected = rows.empty() ? std::string() : rows[index].key;
      screen.draw(detail ? top::detail_frame(state, rows, history, *detail, view, screen.width(), screen.height())
                         : top::list_frame(state, rows, history, view, screen.width(), screen.height(), &first_row));
      dirty = false;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - clock::now()).count();
    wtimeout(stdscr, static_cast<int>(std::clamp<long long>(left, 0, 250)));
    const int ch = wgetch(stdscr);
    if (ch == ERR) {
      // A terminal that went away (its tmux or ssh session closed) fails every read at once:
      // stop, rather than spin until someone kills the process.
      pollfd in{STDIN_FILENO, POLLIN, 0};
      if (::poll(&in, 1, 0) > 0 && (in.revents & (POLLHUP | POLLERR | POLLNVAL))) {
        screen.lose();
        break;
      }
      continue;
    }
    dirty = true;
    if (ch == 'q' || ch == 'Q') break;
    if (ch == KEY_RESIZE) continue;
    if (detail) {
      if (ch == 'f') view.unfold = !view.unfold;  // kept for the next process's detail too
      else if (ch == 27 || ch == KEY_BACKSPACE || ch == 127 || ch == 8 || ch == KEY_LEFT || ch == 'h') detail.reset();
      continue;
    }
    switch (ch) {
      case KEY_UP:
      case 'k': index = index ? index - 1 : 0; break;
      case KEY_DOWN:
      case 'j': index = rows.empty() ? 0 : std::min(index + 1, rows.size() - 1); break;
      case KEY_PPAGE: index -= std::min(index, std::size_t{10}); break;
      case KEY_NPAGE: index = rows.empty() ? 0 : std::min(index + 10, rows.size() - 1); break;
      case KEY_HOME:
      case 'g': index = 0; break;
      case KEY_END:
      case 'G': index = rows.empty() ? 0 : rows.size() - 1; break;
      case 's': view.sort = top::next_sort(view.sort); break;
      case 'u': view.sort = top::SortKey::used; break;
      case 'p': view.sort = top::SortKey::peak; break;
      case 'c': view.sort = top::SortKey::cap; break;
      case 'n': view.sort = top::SortKey::name; break;
      case 'P': view.sort = top::SortKey::pid; break;
      case 'r': view.reversed = !view.reversed; break;
      case '\n':
      case '\r':
      case KEY_ENTER:
        if (rows.empty()) break;
        detail = top::Detail{rows[index].pid, std::to_string(jnum(rows[index].process, "created_ns")), {}, {}, {}, {}};
        // Drawn once while the daemon is asked, then with its answers.
        screen.draw(top::detail_frame(state, rows, history, *detail, view, screen.width(), screen.height()));
        refresh_detail(o.socket, *detail, true);
        refreshes = 0;
        break;
      default: dirty = false; break;
    }
    // A move of the selection names its new row; sorting keeps the row it had.
    if (ch == KEY_UP || ch == 'k' || ch == KEY_DOWN || ch == 'j' || ch == KEY_PPAGE || ch == KEY_NPAGE ||
        ch == KEY_HOME || ch == 'g' || ch == KEY_END || ch == 'G')
      view.selected = rows.empty() ? std::string() : rows[index].key;
  }
  return kExitOk;
}

}  // namespace cuw::cli
