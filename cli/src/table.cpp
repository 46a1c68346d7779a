// cuwarden CLI: the typed table and its three printers (see table.hpp).
#include "table.hpp"

#include <algorithm>

#include "cuw/size.hpp"

namespace cuw::cli {

Cell Cell::from_json(const nlohmann::ordered_json& j, CellKind kind) {
  if (j.is_number_unsigned() || (j.is_number_integer() && j.get<int64_t>() >= 0))
    return {kind, {}, j.get<uint64_t>()};
  if (j.is_string()) return str(j.get<std::string>());
  return none();
}

std::string truncate(const std::string& s, std::size_t width) {
  if (width == 0 || s.size() <= width) return s;
  if (width <= 3) return s.substr(0, width);
  return s.substr(0, width - 3) + "...";
}

namespace {

/// Columns a string takes in a terminal: UTF-8 continuation bytes take none ("×", "→").
std::size_t display_width(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

std::string box_text(const Cell& c, const Column& col) {
  switch (c.kind) {
    case CellKind::text: return truncate(c.text, col.max_width);
    case CellKind::integer: return std::to_string(c.value);
    case CellKind::bytes: return col.human_bytes ? format_bytes(c.value) : format_mib(c.value);
    case CellKind::none: return "-";
  }
  return "";
}

std::string csv_text(const Cell& c, bool units) {
  switch (c.kind) {
    case CellKind::text: return c.text;
    case CellKind::integer: return std::to_string(c.value);
    case CellKind::bytes: return std::to_string(c.value >> 20) + (units ? " MiB" : "");
    case CellKind::none: return "[N/A]";
  }
  return "";
}

}  // namespace

std::string render_box(const Table& t, const std::string& title, const std::string& empty_note, std::size_t width) {
  const std::size_t n = t.columns.size();
  std::vector<std::string> header(n);
  std::vector<std::size_t> w(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    header[i] = t.columns[i].name;
    w[i] = display_width(header[i]);
  }
  std::vector<std::vector<std::string>> cells;
  for (const auto& row : t.rows) {
    std::vector<std::string> r(n);
    for (std::size_t i = 0; i < n && i < row.size(); ++i) {
      r[i] = box_text(row[i], t.columns[i]);
      w[i] = std::max(w[i], display_width(r[i]));
    }
    cells.push_back(std::move(r));
  }
  auto line = [&](const std::vector<std::string>& r) {
    std::string s;
    for (std::size_t i = 0; i < n; ++i) {
      if (i) s += "  ";
      const std::size_t pad = w[i] - std::min(w[i], display_width(r[i]));
      if (t.columns[i].right) s += std::string(pad, ' ') + r[i];
      else s += r[i] + std::string(i + 1 == n ? pad : pad, ' ');
    }
    return s;
  };
  std::size_t inner = display_width(line(header));
  inner = std::max({inner, title.size(), empty_note.size(), width >= 4 ? width - 4 : 0});
  auto framed = [&](const std::string& s) {
    return "| " + s + std::string(inner - std::min(inner, display_width(s)), ' ') + " |\n";
  };
  const std::string rule = "+" + std::string(inner + 2, '-') + "+\n";
  std::string out = rule;
  if (!title.empty()) out += framed(title);
  out += framed(line(header));
  out += "|" + std::string(inner + 2, '=') + "|\n";
  if (cells.empty()) out += framed(empty_note);
  for (const auto& r : cells) out += framed(line(r));
  out += rule;
  return out;
}

std::string render_line(const Table& t, const std::vector<Cell>* row) {
  std::string s;
  for (std::size_t i = 0; i < t.columns.size(); ++i) {
    const Column& col = t.columns[i];
    const std::string text = !row ? col.name : i < row->size() ? box_text((*row)[i], col) : std::string();
    const std::size_t pad = col.width - std::min(col.width, display_width(text));
    if (i) s += ' ';
    s += col.right ? std::string(pad, ' ') + text : text + std::string(pad, ' ');
  }
  s.erase(s.find_last_not_of(' ') + 1);
  return s;
}

std::string render_csv(const Table& t, bool header, bool units) {
  std::string out;
  auto join = [&](const std::vector<std::string>& parts) {
    for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
    out += '\n';
  };
  if (header) {
    std::vector<std::string> h;
    // nvidia-smi keeps the unit in the header with nounits: only the values lose it.
    for (const auto& c : t.columns) h.push_back(c.name + (c.bytes_unit ? " [MiB]" : ""));
    join(h);
  }
  for (const auto& row : t.rows) {
    std::vector<std::string> r;
    for (const auto& c : row) r.push_back(csv_text(c, units));
    join(r);
  }
  return out;
}

nlohmann::ordered_json render_json(const Table& t) {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const auto& row : t.rows) {
    nlohmann::ordered_json o = nlohmann::ordered_json::object();
    for (std::size_t i = 0; i < t.columns.size() && i < row.size(); ++i) {
      const Cell& c = row[i];
      switch (c.kind) {
        case CellKind::text: o[t.columns[i].name] = c.text; break;
        case CellKind::integer:
        case CellKind::bytes: o[t.columns[i].name] = c.value; break;
        case CellKind::none: o[t.columns[i].name] = nullptr; break;
      }
    }
    arr.push_back(std::move(o));
  }
  return arr;
}

}  // namespace cuw::cli
