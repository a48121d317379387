// Pictures of the quality harness (`snapfill plot`, `snapfill needle --png`),
// drawn by gnuplot from Debian's gnuplot-nox: the data go to .dat files and
// a script in a temporary folder, gnuplot writes the PNG, the folder is
// removed. The figures follow the papers': memory and chunk per step (IMDC
// Figures 2-3), the origin of each layer's memory (Figure 6), retention per
// layer (Figure 7), loss per chunk by schedule, and the needle heat map
// (length x depth, SnapKV Figure 3).
#ifndef SNAPFILL_TOOLS_CLI_PLOT_H_
#define SNAPFILL_TOOLS_CLI_PLOT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace snapfill::cli {

// FailedPrecondition naming the Debian package when gnuplot is not on PATH.
absl::Status CheckGnuplot();

// Writes each (name, contents) of `files` into a fresh temporary folder,
// runs `script` there with gnuplot and removes the folder. The script reads
// the files by name; output paths in it must be absolute (AbsolutePath).
// Internal error with gnuplot's own message if it fails.
absl::Status RunGnuplot(const std::string& script,
                        const std::vector<std::pair<std::string, std::string>>& files);

// `path` made absolute against the current folder.
std::string AbsolutePath(const std::string& path);

// `text` as a gnuplot single-quoted string literal.
std::string GnuplotQuote(const std::string& text);

// One accuracy grid of a needle test.
struct NeedleGrid {
  std::string title;
  std::vector<int64_t> lengths;                // x axis, in tokens
  std::vector<double> depths;                  // y axis, 0 = start of the text
  std::vector<std::vector<double>> accuracy;   // [depth][length] in [0, 1]; NaN = not run
};

// Draws the grids side by side (one panel each) as heat maps, red at 0 and
// green at 1, the accuracy written in each cell, into `png`.
absl::Status PlotNeedleHeatMaps(const std::vector<NeedleGrid>& grids, const std::string& png);

// The heat maps of a needle JSON (`snapfill needle --json`; a file without
// "task" in its cells is one passkey task), one PNG per task with the
// baseline's grid beside the run's where it has one: `png` itself for a
// file of one task, else `png` with "_<task>" before its extension.
// Returns the paths written; InvalidArgument naming what is missing for a
// JSON that is not needle output.
absl::StatusOr<std::vector<std::string>> PlotNeedleJson(const nlohmann::json& j,
                                                        const std::string& png);

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_PLOT_H_
