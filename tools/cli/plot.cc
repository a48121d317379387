// snapfill plot: PNGs from the telemetry of any run (--telemetry JSONL files
// written by run, prefill or ppl), from ppl JSON files and from a needle JSON
// file. See plot.h for the figures.
#include "tools/cli/plot.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "snapfill/status.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"
#include "tools/cli/flags.h"

namespace snapfill::cli {

using Json = nlohmann::json;

absl::Status CheckGnuplot() {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    return absl::FailedPreconditionError(
        "gnuplot is not installed: install the Debian package gnuplot-nox (bash "
        "tools/install_deps.sh does)");
  }
  return absl::OkStatus();
}

std::string AbsolutePath(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

std::string GnuplotQuote(const std::string& text) {
  std::string s = "'";
  for (char c : text) {
    if (c == '\'') s += "''";  // gnuplot's escape inside single quotes
    else if (c == '\n') s += ' ';
    else s += c;
  }
  return s + "'";
}

namespace {

// `text` quoted for /bin/sh.
std::string ShellQuote(const std::string& text) {
  std::string s = "'";
  for (char c : text) {
    if (c == '\'') s += "'\\''";
    else s += c;
  }
  return s + "'";
}

// Writes `data` to `path`; PermissionDenied naming it if that fails.
absl::Status WriteText(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
  out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// The PNG terminal every figure uses: cairo (anti-aliased), plain text
// labels (underscores in file names are not subscripts).
std::string Terminal(int width, int height, const std::string& png) {
  return absl::StrFormat(
      "set terminal pngcairo size %d,%d font ',10' noenhanced\nset output %s\n", width, height,
      GnuplotQuote(AbsolutePath(png)));
}

// A tic step that gives at most about ten integer tics over `n` cells.
int64_t TicStep(int64_t n) {
  const int64_t raw = std::max<int64_t>(1, (n + 9) / 10);
  for (int64_t nice : {1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000}) {
    if (nice >= raw) return nice;
  }
  return raw;
}

// Heat map cells: (x, y) centres from columns 1 and 2, colour from column 3,
// one filled unit box each (works for a single row or column too, where
// gnuplot's `with image` draws nothing). Half-width 0.51, not 0.5: boxes
// that overlap a little leave no anti-aliasing seams between them.
constexpr char kCells[] = "using 1:2:(0.51):(0.51):3 with boxxyerror fs solid 1.0 noborder lc palette";

}  // namespace

absl::Status RunGnuplot(const std::string& script,
                        const std::vector<std::pair<std::string, std::string>>& files) {
  SNAPFILL_RETURN_IF_ERROR(CheckGnuplot());
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/snapfill_plot_XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create a folder like ", templ));
  }
  const std::string dir = templ;
  absl::Status status = absl::OkStatus();
  for (const auto& [name, contents] : files) {
    status.Update(WriteText(dir + "/" + name, contents));
  }
  status.Update(WriteText(dir + "/plot.gp", script));
  if (status.ok()) {
    const std::string cmd = absl::StrCat("cd ", ShellQuote(dir), " && gnuplot plot.gp >gnuplot.log 2>&1");
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream log(dir + "/gnuplot.log");
      std::stringstream ss;
      ss << log.rdbuf();
      status = absl::InternalError(absl::StrCat("gnuplot failed: ", ss.str()));
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return status;
}

absl::Status PlotNeedleHeatMaps(const std::vector<NeedleGrid>& grids, const std::string& png) {
  if (grids.empty()) return absl::InvalidArgumentError("no needle grid to plot");
  std::vector<std::pair<std::string, std::string>> files;
  const int panels = static_cast<int>(grids.size());
  std::string script = Terminal(std::max(520, 120 + 110 * static_cast<int>(grids[0].lengths.size())) * panels, 480, png);
  script += absl::StrFormat(
      "set multiplot layout 1,%d\n"
      "set palette defined (0 '#d7301f', 0.5 '#fee08b', 1 '#1a9850')\n"
      "set cbrange [0:1]\nset cblabel 'accuracy'\n"
      "set xlabel 'input length (tokens)'\nset ylabel 'needle depth'\n"
      "set yrange [] reverse\nunset key\nset tics nomirror\n",
      panels);
  for (size_t g = 0; g < grids.size(); ++g) {
    const NeedleGrid& grid = grids[g];
    std::string data;
    for (size_t d = 0; d < grid.depths.size(); ++d) {
      for (size_t l = 0; l < grid.lengths.size(); ++l) {
        const double a = grid.accuracy[d][l];
        if (std::isnan(a)) {
          absl::StrAppendFormat(&data, "%d %d NaN -\n", l, d);
        } else {
          absl::StrAppendFormat(&data, "%d %d %.4f %.2f\n", l, d, a, a);
        }
      }
      data += "\n";
    }
    const std::string name = absl::StrCat("needle_", g, ".dat");
    files.push_back({name, data});
    std::string xtics, ytics;
    for (size_t l = 0; l < grid.lengths.size(); ++l) {
      absl::StrAppendFormat(&xtics, "%s'%d' %d", l ? ", " : "", grid.lengths[l], l);
    }
    for (size_t d = 0; d < grid.depths.size(); ++d) {
      absl::StrAppendFormat(&ytics, "%s'%g' %d", d ? ", " : "", grid.depths[d], d);
    }
    absl::StrAppendFormat(&script,
                          "set title %s\nset xtics (%s)\nset ytics (%s)\n"
                          "set xrange [-0.5:%f]\nset yrange [%f:-0.5]\n"
                          "plot '%s' using 1:2:(0.51):(0.51):3 with boxxyerror fs solid 1.0 "
                          "noborder lc palette, '' using 1:2:4 with labels\n",
                          GnuplotQuote(grid.title), xtics, ytics, grid.lengths.size() - 0.5,
                          grid.depths.size() - 0.5, name);
  }
  script += "unset multiplot\n";
  return RunGnuplot(script, files);
}

namespace {

// One step of a --telemetry JSONL file.
struct StepRecord {
  int64_t step = 0, start = 0, chunk = 0;
  std::vector<int64_t> memory;
  std::vector<double> retention;
  bool has_origin = false;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> origin;  // [layer] (chunk, entries)
};

struct TelemetryRun {
  std::string label;
  std::vector<StepRecord> steps;
};

// The file name without folder and extension, as a series label.
std::string Stem(const std::string& path) { return std::filesystem::path(path).stem().string(); }

// A label usable in a file name.
std::string FileSafe(std::string s) {
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  }
  return s;
}

bool IsIntArray(const Json& j) {
  if (!j.is_array()) return false;
  for (const Json& x : j) {
    if (!x.is_number_integer()) return false;
  }
  return true;
}

absl::StatusOr<TelemetryRun> LoadTelemetry(const std::string& path) {
  SNAPFILL_ASSIGN_OR_RETURN(std::string text, ReadInput(path, "--telemetry"));
  TelemetryRun run;
  run.label = Stem(path);
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    ++line_no;
    const Json j = Json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    auto bad = [&](const char* what) {
      return absl::InvalidArgumentError(absl::StrCat("--telemetry ", path, " line ", line_no, ": ",
                                                     what));
    };
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    StepRecord r;
    for (auto [key, field] : {std::pair{"step", &r.step}, std::pair{"start", &r.start},
                              std::pair{"chunk", &r.chunk}}) {
      if (!j.contains(key) || !j[key].is_number_integer()) {
        return bad(absl::StrCat("no integer \"", key, "\"").c_str());
      }
      *field = j[key].get<int64_t>();
    }
    if (!IsIntArray(j.value("memory", Json())) || j["memory"].empty()) {
      return bad("\"memory\" is not an array of integers");
    }
    r.memory = j["memory"].get<std::vector<int64_t>>();
    if (j.contains("retention") && j["retention"].is_array()) {
      for (const Json& x : j["retention"]) {
        if (!x.is_number()) return bad("\"retention\" holds a non-number");
        r.retention.push_back(x.get<double>());
      }
    }
    if (j.contains("origin") && j["origin"].is_array()) {
      r.has_origin = true;
      for (const Json& layer : j["origin"]) {
        std::vector<std::pair<int64_t, int64_t>> pairs;
        if (!layer.is_array()) return bad("\"origin\" holds a non-array");
        for (const Json& p : layer) {
          if (!IsIntArray(p) || p.size() != 2) return bad("\"origin\" pairs are [chunk, entries]");
          pairs.push_back({p[0].get<int64_t>(), p[1].get<int64_t>()});
        }
        r.origin.push_back(std::move(pairs));
      }
    }
    run.steps.push_back(std::move(r));
  }
  if (run.steps.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--telemetry ", path, " has no records"));
  }
  return run;
}

// (a) Memory (mean over layers, min-max band) and chunk size per step.
absl::Status PlotMemoryAndChunk(const std::vector<TelemetryRun>& runs, const std::string& png) {
  std::vector<std::pair<std::string, std::string>> files;
  std::string mem_plot, band_plot, chunk_plot;
  for (size_t k = 0; k < runs.size(); ++k) {
    std::string data;
    bool spread = false;
    for (const StepRecord& r : runs[k].steps) {
      const auto [lo, hi] = std::minmax_element(r.memory.begin(), r.memory.end());
      double mean = 0;
      for (int64_t m : r.memory) mean += m;
      mean /= r.memory.size();
      spread |= *lo != *hi;
      absl::StrAppendFormat(&data, "%d %.2f %d %d %d %d\n", r.step, mean, *lo, *hi, r.chunk,
                            r.start);
    }
    const std::string name = absl::StrCat("mem_", k, ".dat");
    files.push_back({name, data});
    const std::string title = GnuplotQuote(runs[k].label);
    absl::StrAppendFormat(&mem_plot, "%s'%s' using 1:2 with linespoints ls %d pt 7 ps 0.5 title %s",
                          mem_plot.empty() ? "" : ", ", name, k + 1, title);
    if (spread) {
      absl::StrAppendFormat(&band_plot,
                            "'%s' using 1:3:4 with filledcurves ls %d fs transparent solid 0.2 "
                            "title %s, ",
                            name, k + 1, GnuplotQuote(runs[k].label + " (layer min-max)"));
    }
    absl::StrAppendFormat(&chunk_plot, "%s'%s' using 1:5 with linespoints ls %d pt 7 ps 0.5 title %s",
                          chunk_plot.empty() ? "" : ", ", name, k + 1, title);
  }
  std::string script = Terminal(1000, 760, png);
  script +=
      "set multiplot layout 2,1 title 'Memory and chunk size per step'\n"
      "set lmargin at screen 0.08\nset rmargin at screen 0.80\n"
      "set grid\nset key outside right top\nset xlabel 'step'\n"
      "set ylabel 'memory (entries per layer and KV head)'\nset yrange [0:*]\n";
  script += "plot " + band_plot + mem_plot + "\n";
  script += "set ylabel 'chunk (tokens)'\nplot " + chunk_plot + "\nunset multiplot\n";
  return RunGnuplot(script, files);
}

// (b) Which chunk each layer's memory comes from: layer x source chunk,
// colour = share of the layer's memory, after up to four steps.
absl::Status PlotOrigin(const TelemetryRun& run, const std::string& png) {
  std::vector<const StepRecord*> with;
  for (const StepRecord& r : run.steps) {
    if (r.has_origin && !r.origin.empty()) with.push_back(&r);
  }
  if (with.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("telemetry ", run.label, " has no origin map"));
  }
  std::vector<const StepRecord*> shown;
  if (with.size() <= 4) {
    shown = with;
  } else {
    for (int q = 1; q <= 4; ++q) shown.push_back(with[(with.size() * q + 3) / 4 - 1]);
  }
  std::vector<std::pair<std::string, std::string>> files;
  const int rows = shown.size() > 2 ? 2 : 1, cols = shown.size() > 1 ? 2 : 1;
  std::string script = Terminal(560 * cols, 420 * rows, png);
  absl::StrAppendFormat(&script,
                        "set multiplot layout %d,%d title %s\n"
                        "set palette defined (0 'white', 0.02 '#deebf7', 0.3 '#6baed6', 1 '#08306b')\n"
                        "set cbrange [0:*]\nset cblabel 'share of the layer''s memory'\n"
                        "set xlabel 'source chunk'\nset ylabel 'layer'\nunset key\n",
                        rows, cols, GnuplotQuote("Where each layer's memory comes from: " + run.label));
  for (size_t s = 0; s < shown.size(); ++s) {
    const StepRecord& r = *shown[s];
    const int64_t chunks = r.step + 1;
    std::string data;
    for (size_t l = 0; l < r.origin.size(); ++l) {
      std::vector<double> share(chunks, 0.0);
      double total = 0;
      for (const auto& [c, n] : r.origin[l]) {
        if (c >= 0 && c < chunks) share[c] += n;
        total += n;
      }
      for (int64_t c = 0; c < chunks; ++c) {
        absl::StrAppendFormat(&data, "%d %d %.5f\n", c, l, total > 0 ? share[c] / total : 0.0);
      }
      data += "\n";
    }
    const std::string name = absl::StrCat("origin_", s, ".dat");
    files.push_back({name, data});
    absl::StrAppendFormat(&script,
                          "set title 'after step %d'\nset xrange [-0.5:%f]\nset yrange [-0.5:%f]\n"
                          "set xtics %d\nset ytics %d\nplot '%s' %s\n",
                          r.step, chunks - 0.5, r.origin.size() - 0.5, TicStep(chunks),
                          TicStep(r.origin.size()), name, kCells);
  }
  script += "unset multiplot\n";
  return RunGnuplot(script, files);
}

// (c) Retention ratio per layer over steps: step x layer, colour = ratio.
absl::Status PlotRetention(const TelemetryRun& run, const std::string& png) {
  std::string data;
  int64_t layers = 0, last_step = 0;
  for (const StepRecord& r : run.steps) {
    if (r.step == 0 || r.retention.empty()) continue;  // nothing to retain at step 0
    layers = std::max<int64_t>(layers, r.retention.size());
    last_step = r.step;
    for (size_t l = 0; l < r.retention.size(); ++l) {
      absl::StrAppendFormat(&data, "%d %d %.4f\n", r.step, l, r.retention[l]);
    }
    data += "\n";
  }
  if (layers == 0) {
    return absl::InvalidArgumentError(absl::StrCat("telemetry ", run.label,
                                                   " has no retention after step 0"));
  }
  std::string script = Terminal(1000, 520, png);
  absl::StrAppendFormat(
      &script,
      "set title %s\nset palette defined (0 '#440154', 0.5 '#21918c', 1 '#fde725')\n"
      "set cbrange [0:1]\nset cblabel 'retention'\nset xlabel 'step'\nset ylabel 'layer'\n"
      "set xrange [0.5:%f]\nset yrange [-0.5:%f]\nset ytics %d\nunset key\n"
      "plot 'retention.dat' %s\n",
      GnuplotQuote("Memory retention ratio |M(i-1) & M(i)| / |M(i)| per layer: " + run.label),
      last_step + 0.5, layers - 0.5, TicStep(layers), kCells);
  return RunGnuplot(script, {{"retention.dat", data}});
}

absl::StatusOr<Json> LoadJsonFile(const std::string& path, const char* flag) {
  SNAPFILL_ASSIGN_OR_RETURN(std::string text, ReadInput(path, flag));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is not a JSON object"));
  }
  return j;
}

// A ppl run's series label: its schedule, pruner and sizes.
std::string PplLabel(const Json& j, const std::string& path) {
  const Json c = j.value("config", Json::object());
  if (!c.is_object() || !c.contains("schedule")) return Stem(path);
  std::string label = absl::StrCat(c.value("schedule", std::string("?")), " ",
                                   c.value("pruner", std::string("?")));
  if (c.value("pruner", std::string()) != "full") {
    absl::StrAppend(&label, " m", c.value("memory", int64_t{0}));
  }
  absl::StrAppend(&label, " c", c.value("chunk", int64_t{0}));
  if (j.contains("loss") && j["loss"].is_number()) {
    absl::StrAppendFormat(&label, " (loss %.3f)", j["loss"].get<double>());
  }
  return label;
}

// (d) Loss per chunk against the input position, one series per ppl file.
absl::Status PlotLoss(const std::vector<std::string>& paths, const std::string& png) {
  std::vector<std::pair<std::string, std::string>> files;
  std::string plot;
  for (size_t k = 0; k < paths.size(); ++k) {
    SNAPFILL_ASSIGN_OR_RETURN(Json j, LoadJsonFile(paths[k], "--ppl"));
    if (!j.contains("steps") || !j["steps"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat("--ppl ", paths[k],
                                                     " has no \"steps\" array (not ppl output?)"));
    }
    std::string data;
    for (const Json& s : j["steps"]) {
      if (!s.is_object() || !s.contains("start") || !s.contains("chunk") || !s.contains("loss") ||
          !s["loss"].is_number()) {
        continue;  // a step with nothing scored has a null loss
      }
      absl::StrAppendFormat(&data, "%.1f %.6f\n",
                            s["start"].get<double>() + s["chunk"].get<double>() / 2,
                            s["loss"].get<double>());
    }
    const std::string name = absl::StrCat("loss_", k, ".dat");
    files.push_back({name, data});
    absl::StrAppendFormat(&plot, "%s'%s' using 1:2 with linespoints pt 7 ps 0.5 title %s",
                          plot.empty() ? "" : ", ", name, GnuplotQuote(PplLabel(j, paths[k])));
  }
  std::string script = Terminal(1000, 520, png);
  script +=
      "set title 'Loss per chunk (each chunk''s tokens given the memory before it)'\n"
      "set grid\nset key outside below\nset xlabel 'input position (tokens, chunk middle)'\n"
      "set ylabel 'loss (nats/token)'\nplot " +
      plot + "\n";
  return RunGnuplot(script, files);
}

// The grids of a needle JSON file per task, in the order the cells first
// name them: the run's and, if present, the baseline's.
struct TaskGrids {
  std::string task;
  std::vector<NeedleGrid> grids;
};

absl::StatusOr<std::vector<TaskGrids>> NeedleGridsFromJson(const Json& j) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("needle JSON: ", what));
  };
  if (!j.contains("lengths") || !IsIntArray(j["lengths"]) || !j.contains("depths") ||
      !j["depths"].is_array() || !j.contains("cells") || !j["cells"].is_array()) {
    return bad("needs \"lengths\", \"depths\" and \"cells\" arrays (not needle output?)");
  }
  NeedleGrid empty;
  empty.lengths = j["lengths"].get<std::vector<int64_t>>();
  for (const Json& d : j["depths"]) {
    if (!d.is_number()) return bad("a depth is not a number");
    empty.depths.push_back(d.get<double>());
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  empty.accuracy.assign(empty.depths.size(), std::vector<double>(empty.lengths.size(), nan));
  struct Grids {
    std::string task;
    NeedleGrid run, base;
    bool any_base = false;
  };
  std::vector<Grids> tasks;
  for (const Json& c : j["cells"]) {
    if (!c.is_object() || !c.contains("length") || !c["length"].is_number_integer() ||
        !c.contains("depth") || !c["depth"].is_number()) {
      return bad("a cell lacks an integer \"length\" or a numeric \"depth\"");
    }
    if (c.contains("task") && !c["task"].is_string()) return bad("a cell's \"task\" is not a string");
    const std::string task = c.value("task", std::string("passkey"));
    auto g = std::find_if(tasks.begin(), tasks.end(), [&](const Grids& t) { return t.task == task; });
    if (g == tasks.end()) g = tasks.insert(tasks.end(), Grids{task, empty, empty});
    const auto l = std::find(empty.lengths.begin(), empty.lengths.end(), c["length"].get<int64_t>());
    const auto d = std::find(empty.depths.begin(), empty.depths.end(), c["depth"].get<double>());
    if (l == empty.lengths.end() || d == empty.depths.end()) return bad("a cell is off the grid");
    const size_t li = l - empty.lengths.begin(), di = d - empty.depths.begin();
    if (c.contains("accuracy") && c["accuracy"].is_number()) {
      g->run.accuracy[di][li] = c["accuracy"].get<double>();
    }
    if (c.contains("baseline_accuracy") && c["baseline_accuracy"].is_number()) {
      g->base.accuracy[di][li] = c["baseline_accuracy"].get<double>();
      g->any_base = true;
    }
  }
  if (tasks.empty()) return bad("no cells");
  const std::string label = j.value("label", std::string("compressed"));
  std::vector<TaskGrids> out;
  for (Grids& g : tasks) {
    g.run.title = absl::StrCat(g.task, ": ", label);
    g.base.title = absl::StrCat(g.task, ": full attention, one pass (baseline)");
    TaskGrids t{g.task, {std::move(g.run)}};
    if (g.any_base) t.grids.push_back(std::move(g.base));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> PlotNeedleJson(const Json& j, const std::string& png) {
  SNAPFILL_ASSIGN_OR_RETURN(std::vector<TaskGrids> tasks, NeedleGridsFromJson(j));
  std::vector<std::string> written;
  for (const TaskGrids& t : tasks) {
    std::string path = png;
    if (tasks.size() > 1) {
      const std::filesystem::path p(png);
      path = (p.parent_path() / (p.stem().string() + "_" + FileSafe(t.task) +
                                 p.extension().string()))
                 .string();
    }
    SNAPFILL_RETURN_IF_ERROR(PlotNeedleHeatMaps(t.grids, path));
    written.push_back(path);
  }
  return written;
}

namespace {

std::vector<std::string> SplitList(const std::string& s) {
  return absl::StrSplit(s, ',', absl::SkipWhitespace());
}

}  // namespace

absl::Status RunPlot() {
  const std::vector<std::string> telemetry = SplitList(absl::GetFlag(FLAGS_telemetry));
  const std::vector<std::string> ppl = SplitList(absl::GetFlag(FLAGS_ppl));
  const std::string needle = absl::GetFlag(FLAGS_needle);
  const std::string dir = absl::GetFlag(FLAGS_out_dir);
  if (telemetry.empty() && ppl.empty() && needle.empty()) {
    return absl::InvalidArgumentError(
        "nothing to plot: give --telemetry FILE[,FILE...], --ppl FILE[,FILE...] and/or "
        "--needle FILE");
  }
  if (dir.empty()) return absl::InvalidArgumentError("--out_dir is empty");
  SNAPFILL_RETURN_IF_ERROR(CheckGnuplot());
  // Read every input before drawing anything: a bad file fails fast.
  std::vector<TelemetryRun> runs;
  for (const std::string& path : telemetry) {
    SNAPFILL_ASSIGN_OR_RETURN(TelemetryRun run, LoadTelemetry(path));
    runs.push_back(std::move(run));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat("--out_dir ", dir, ": ", ec.message()));
  }
  std::vector<std::string> written;
  auto out = [&](const std::string& name) { return (std::filesystem::path(dir) / name).string(); };
  if (!runs.empty()) {
    SNAPFILL_RETURN_IF_ERROR(PlotMemoryAndChunk(runs, out("memory_chunk.png")));
    written.push_back(out("memory_chunk.png"));
    for (const TelemetryRun& run : runs) {
      const std::string suffix = runs.size() > 1 ? "_" + FileSafe(run.label) : "";
      const std::string origin = out("origin" + suffix + ".png");
      const absl::Status s = PlotOrigin(run, origin);
      if (s.ok()) {
        written.push_back(origin);
      } else if (absl::IsInvalidArgument(s)) {
        std::fprintf(stderr, "snapfill plot: skipping the origin map: %s\n",
                     std::string(s.message()).c_str());
      } else {
        return s;
      }
      const std::string retention = out("retention" + suffix + ".png");
      const absl::Status r = PlotRetention(run, retention);
      if (r.ok()) {
        written.push_back(retention);
      } else if (absl::IsInvalidArgument(r)) {
        std::fprintf(stderr, "snapfill plot: skipping retention: %s\n",
                     std::string(r.message()).c_str());
      } else {
        return r;
      }
    }
  }
  if (!ppl.empty()) {
    SNAPFILL_RETURN_IF_ERROR(PlotLoss(ppl, out("loss.png")));
    written.push_back(out("loss.png"));
  }
  if (!needle.empty()) {
    SNAPFILL_ASSIGN_OR_RETURN(const Json j, LoadJsonFile(needle, "--needle"));
    SNAPFILL_ASSIGN_OR_RETURN(std::vector<std::string> maps, PlotNeedleJson(j, out("needle.png")));
    written.insert(written.end(), maps.begin(), maps.end());
  }
  for (const std::string& w : written) std::printf("%s\n", w.c_str());
  return absl::OkStatus();
}

}  // namespace snapfill::cli
