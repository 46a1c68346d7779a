// cuwarden CLI: one typed table, printed for people (boxes), as CSV (nvidia-smi's spelling)
// or as JSON. Cells know what they hold, so a byte count becomes "4096MiB" in a box,
// "4096 MiB" in CSV, "4096" with nounits, and a number in JSON.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace cuw::cli {

enum class CellKind { text, integer, bytes, none };

struct Cell {
  CellKind kind = CellKind::none;
  std::string text;    ///< text cells
  uint64_t value = 0;  ///< integer and bytes cells

  static Cell str(std::string s) { return {CellKind::text, std::move(s), 0}; }
  static Cell num(uint64_t v) { return {CellKind::integer, {}, v}; }
  static Cell bytes(uint64_t v) { return {CellKind::bytes, {}, v}; }
  static Cell none() { return {}; }
  /// A JSON number (bytes or integer as `kind` says), or none when null/missing.
  static Cell from_json(const nlohmann::ordered_json& j, CellKind kind);
};

struct Column {
  std::string name;         ///< box header and CSV header ("used_gpu_memory")
  bool bytes_unit = false;  ///< CSV header gets " [MiB]" unless nounits
  bool right = false;       ///< right-aligned in boxes
  std::size_t max_width = 0;///< truncate text beyond this in boxes (0: never)
  std::size_t width = 0;    ///< lines (render_line): the column's fixed width (wider text is kept)
  bool human_bytes = false; ///< bytes print as "4.00 GiB" (format_bytes) instead of "4096MiB"
};

struct Table {
  std::vector<Column> columns;
  std::vector<std::vector<Cell>> rows;
};

/// A box like nvidia-smi's: a title line, the header, '=' rule, rows, a closing rule.
/// `empty_note` is shown as the only row when there are none. `width` is a minimum.
std::string render_box(const Table& t, const std::string& title, const std::string& empty_note,
                       std::size_t width = 0);
/// nvidia-smi CSV: ", "-separated, header "name [MiB]", values "4096 MiB", "[N/A]" for none.
std::string render_csv(const Table& t, bool header, bool units);
/// One line of a stream (events as they come): each cell padded to its column's fixed
/// width, columns set off by one space, trailing spaces dropped. A null `row` gives the
/// header line. Cells print as in boxes.
std::string render_line(const Table& t, const std::vector<Cell>* row);
/// Array of objects keyed by column name; bytes and integers as numbers, none as null.
nlohmann::ordered_json render_json(const Table& t);

/// Shorten `s` to `width` characters, ending in "..." when cut.
std::string truncate(const std::string& s, std::size_t width);

}  // namespace cuw::cli
