// A picture of the last collectives: one row per rank, a mark at each arrival, the last arrival
// of each collective in red, the straggler's row or the ranks missing from a stall marked. One
// self-contained HTML file (SVG inside; no script, font or image fetched from anywhere).
#pragma once

#include <deque>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "launcher/watch/straggler_watch.hpp"

namespace mcprun {

/// At most kMaxPictureRows rows: the straggler's and the missing ranks' first, then the lowest.
struct PictureMarks {
  std::string title;  ///< Why it was drawn: "straggler named", "stall", "end of the job".
  std::optional<int> straggler;  ///< Its row is marked.
  std::set<int> missing;         ///< A stalled collective's missing ranks: their rows are marked.
  std::string note;              ///< One line under the title (the straggler or stall line).
};

std::string render_collective_picture(const std::deque<SeenCollective>& recent,
                                      const std::map<int, RankArrivals>& ranks,
                                      const PictureMarks& marks);

/// Writes the picture of what `stragglers` saw to `path` and names it in one line; false when
/// there is nothing to draw (not the store's node, or torch 1.x) or the file cannot be written.
bool draw_collective_picture(const StragglerWatch* stragglers, const std::filesystem::path& path,
                             PictureMarks marks);

}  // namespace mcprun
