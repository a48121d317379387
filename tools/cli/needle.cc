// snapfill needle: needle-in-a-haystack accuracy over input length x needle
// depth (DESIGN.md §7; the SnapKV paper's Figure 3).
//
// A trial: a slice of the haystack text (--input), starting at an offset
// that depends on the seed (after a sentence end), holding the needle
// sentence "The special magic number is NNNNNNN." at the given depth (snapped
// back to a sentence end), inside the model's chat template with the question
// after it, exactly as `snapfill run --question` builds its prompt. The
// whole prompt is the cell's length in tokens. The prompt is read by the
// chunk loop with the configured schedule and pruner, the answer decoded
// greedily, and the trial scores 1 if the answer contains the key. The
// baseline reads the same prompt with full attention in one pass (plain
// prefill) where it fits the model's context.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "snapfill/status.h"
#include "src/base/sys_stats.h"
#include "src/engine/generate.h"
#include "src/engine/prefill_engine.h"
#include "src/engine/prompt.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"
#include "tools/cli/flags.h"
#include "tools/cli/plot.h"

namespace snapfill::cli {
namespace {

using Json = nlohmann::json;

constexpr char kQuestion[] = "What is the special magic number mentioned in the text?";
constexpr char kNeedlePrefix[] = "The special magic number is ";
// Greedy tokens decoded per answer: enough for "The special magic number
// mentioned in the text is 1234567." with digits as single tokens.
constexpr int64_t kAnswerTokens = 24;
// The fewest haystack tokens a cell may hold.
constexpr int64_t kMinHaystack = 16;

absl::StatusOr<std::vector<int64_t>> ParseLengths(const std::string& flag) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--lengths: \"", std::string(part),
                                                     "\" is not a positive number of tokens"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError("--lengths is empty");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::StatusOr<std::vector<double>> ParseDepths(const std::string& flag) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    double v = 0;
    if (!absl::SimpleAtod(part, &v) || !(v >= 0.0 && v <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat("--depths: \"", std::string(part),
                                                     "\" is not a number in [0, 1]"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError("--depths is empty");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The key of one trial: 7 digits from the cell and the seed (std::seed_seq
// and mt19937_64 are fully specified, so keys are the same everywhere).
std::string TrialKey(int64_t length, size_t depth_index, int seed) {
  std::seed_seq seq{static_cast<uint32_t>(length), static_cast<uint32_t>(depth_index),
                    static_cast<uint32_t>(seed), 0x6e65u};
  std::mt19937_64 rng(seq);
  return absl::StrCat(1000000 + rng() % 9000000);
}

// Whether `answer` holds `key`, ignoring thousands separators.
bool ContainsKey(const std::string& answer, const std::string& key) {
  std::string a;
  for (char c : answer) {
    if (c != ',' && c != '\'') a += c;
  }
  return a.find(key) != std::string::npos;
}

struct Trial {
  int seed = 0;
  std::string key;
  int64_t tokens = 0;          // the prompt's length
  double needle_depth = 0;     // where the needle went: haystack tokens before it / all
  std::string answer;
  bool found = false;
  bool baseline_run = false;
  std::string baseline_answer;
  bool baseline_found = false;
  double seconds = 0;
  double baseline_seconds = 0;
};

struct Cell {
  int64_t length = 0;
  double depth = 0;
  std::vector<Trial> trials;
  int found = 0, baseline_found = 0, baseline_runs = 0;
};

class NeedleHarness {
 public:
  NeedleHarness(LoadedModel& model, Backend* backend, PrefillConfig config,
                std::vector<int32_t> haystack, std::string system)
      : model_(model),
        backend_(backend),
        config_(config),
        haystack_(std::move(haystack)),
        system_(std::move(system)) {
    const Tokenizer& tok = *model_.tokenizer;
    sentence_end_.resize(haystack_.size());
    for (size_t i = 0; i < haystack_.size(); ++i) {
      const std::string piece = tok.TokenToPiece(haystack_[i]);
      const char last = piece.empty() ? 0 : piece.back();
      sentence_end_[i] = last == '.' || last == '!' || last == '?' || last == '\n';
    }
  }

  // Tokens the template and question add around the document.
  absl::StatusOr<int64_t> Overhead() const {
    SNAPFILL_ASSIGN_OR_RETURN(DocumentPrompt p,
                              BuildDocumentPrompt(*model_.tokenizer, model_.chat_template, "x",
                                                  kQuestion, system_));
    return static_cast<int64_t>(p.tokens.size()) - p.document_tokens;
  }

  // The haystack offset of a seed: an even share of the text per seed,
  // moved to just after the next sentence end.
  int64_t Offset(int seed, int seeds) const {
    const int64_t n = haystack_.size();
    const int64_t raw = static_cast<int64_t>(static_cast<double>(seed) * n / seeds);
    if (raw == 0) return 0;
    for (int64_t i = raw; i < std::min(n, raw + 256); ++i) {
      if (sentence_end_[i]) return (i + 1) % n;
    }
    return raw;
  }

  // The prompt of one trial, `length` tokens long (or within a token or two
  // when the joins tokenize differently and no correction hits exactly).
  absl::StatusOr<DocumentPrompt> BuildPrompt(int64_t length, double depth, int64_t offset,
                                             const std::string& key, double* needle_depth) const {
    const Tokenizer& tok = *model_.tokenizer;
    const std::string needle = absl::StrCat(kNeedlePrefix, key, ".");
    SNAPFILL_ASSIGN_OR_RETURN(const int64_t overhead, Overhead());
    const int64_t needle_tokens = tok.Encode(" " + needle + " ", false, false).size();
    int64_t hay = length - overhead - needle_tokens;
    DocumentPrompt best;
    for (int attempt = 0; attempt < 4; ++attempt) {
      if (hay < kMinHaystack) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--lengths ", length, " is too short: the template, needle and question take ",
            overhead + needle_tokens, " tokens, leaving fewer than ", kMinHaystack,
            " for the haystack"));
      }
      std::vector<int32_t> slice(hay);
      std::vector<bool> ends(hay);
      const int64_t n = haystack_.size();
      for (int64_t i = 0; i < hay; ++i) {
        slice[i] = haystack_[(offset + i) % n];
        ends[i] = sentence_end_[(offset + i) % n];
      }
      // Insert after haystack token k-1; snap back to a sentence end.
      int64_t k = std::llround(depth * hay);
      if (k > 0 && k < hay) {
        for (int64_t j = k; j > std::max<int64_t>(0, k - 64); --j) {
          if (ends[j - 1]) {
            k = j;
            break;
          }
        }
      }
      std::string before = tok.Decode(std::vector<int32_t>(slice.begin(), slice.begin() + k));
      std::string after = tok.Decode(std::vector<int32_t>(slice.begin() + k, slice.end()));
      std::string doc = before;
      if (!doc.empty() && !std::isspace(static_cast<unsigned char>(doc.back()))) doc += ' ';
      doc += needle;
      if (!after.empty() && !std::isspace(static_cast<unsigned char>(after.front()))) doc += ' ';
      doc += after;
      SNAPFILL_ASSIGN_OR_RETURN(DocumentPrompt p,
                                BuildDocumentPrompt(tok, model_.chat_template, doc, kQuestion,
                                                    system_));
      *needle_depth = static_cast<double>(k) / hay;
      const int64_t got = p.tokens.size();
      const int64_t best_miss = best.tokens.empty()
                                    ? INT64_MAX
                                    : std::abs(static_cast<int64_t>(best.tokens.size()) - length);
      if (std::abs(got - length) < best_miss) best = std::move(p);
      if (got == length) break;
      hay += length - got;
    }
    return best;
  }

  // The configured chunk loop, then greedy decoding.
  absl::StatusOr<std::string> AnswerCompressed(const std::vector<int32_t>& tokens) {
    SNAPFILL_ASSIGN_OR_RETURN(
        std::unique_ptr<PrefillEngine> engine,
        PrefillEngine::Create(*model_.model, backend_, config_, tokens.size()));
    SNAPFILL_RETURN_IF_ERROR(engine->Run(tokens, nullptr));
    SNAPFILL_ASSIGN_OR_RETURN(auto kv, engine->MakeDecoderCache(kAnswerTokens));
    if (decoder_ == nullptr) {
      SNAPFILL_ASSIGN_OR_RETURN(decoder_, LlamaForward::Create(*model_.model, backend_, 1));
    }
    SNAPFILL_ASSIGN_OR_RETURN(GenerateResult r,
                              GenerateFromLogits(*decoder_, *kv, engine->next_position(),
                                                 engine->last_logits(), Options(), nullptr));
    return model_.tokenizer->Decode(r.tokens);
  }

  // Full attention in one pass: plain prefill of the whole prompt.
  absl::StatusOr<std::string> AnswerFull(const std::vector<int32_t>& tokens, int64_t batch) {
    if (batch_forward_ == nullptr) {
      SNAPFILL_ASSIGN_OR_RETURN(batch_forward_, LlamaForward::Create(*model_.model, backend_, batch));
    }
    SNAPFILL_ASSIGN_OR_RETURN(auto kv, batch_forward_->NewKvCache(tokens.size() + kAnswerTokens));
    SNAPFILL_ASSIGN_OR_RETURN(GenerateResult r,
                              Generate(*batch_forward_, *kv, 0, tokens, Options(), nullptr));
    return model_.tokenizer->Decode(r.tokens);
  }

 private:
  GenerateOptions Options() const {
    GenerateOptions o;
    o.max_new_tokens = kAnswerTokens;  // greedy: SamplingParams' default temperature is 0
    const Tokenizer* tok = model_.tokenizer.get();
    o.is_eog = [tok](int32_t id) { return tok->IsEndOfGeneration(id); };
    return o;
  }

  LoadedModel& model_;
  Backend* backend_;
  PrefillConfig config_;
  std::vector<int32_t> haystack_;
  std::vector<bool> sentence_end_;
  std::string system_;
  std::unique_ptr<LlamaForward> decoder_;
  std::unique_ptr<LlamaForward> batch_forward_;
};

std::string ConfigLabel(const PrefillConfig& c) {
  std::string s = absl::StrCat(std::string(ScheduleKindName(c.schedule.kind)), " ",
                               PrunerKindName(c.pruner.kind));
  if (c.pruner.kind != PrunerKind::kFull) absl::StrAppend(&s, " m", c.schedule.memory);
  absl::StrAppend(&s, " c", c.schedule.chunk);
  if (!c.query_tokens.empty() && c.pruner.kind == PrunerKind::kSnapKv) {
    absl::StrAppend(&s, " question-guided (share ", c.pruner.query_share, ", ",
                    SelectionName(c.pruner.query_select),
                    c.pruner.query_select == Selection::kSpan ? absl::StrCat(" ", c.pruner.span) : "", ")");
  }
  return s;
}

}  // namespace

absl::Status RunNeedle() {
  const std::string input_path = absl::GetFlag(FLAGS_input);
  if (input_path.empty()) {
    return absl::InvalidArgumentError("--input FILE (the haystack text) is required");
  }
  SNAPFILL_ASSIGN_OR_RETURN(const std::vector<int64_t> lengths,
                            ParseLengths(absl::GetFlag(FLAGS_lengths)));
  SNAPFILL_ASSIGN_OR_RETURN(const std::vector<double> depths,
                            ParseDepths(absl::GetFlag(FLAGS_depths)));
  const int seeds = absl::GetFlag(FLAGS_seeds);
  if (seeds < 1 || seeds > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("--seeds=", seeds, " must be in [1, 1000]"));
  }
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("--batch=", batch, " must be >= 1"));
  const std::string json_path = absl::GetFlag(FLAGS_json);
  const std::string png = absl::GetFlag(FLAGS_png);
  if (!png.empty()) SNAPFILL_RETURN_IF_ERROR(CheckGnuplot());  // before hours of work
  SNAPFILL_ASSIGN_OR_RETURN(PrefillConfig config, PrefillConfigFromFlags());
  // As in ppl: the full pruner evicts nothing; its chunks are --chunk each.
  if (config.pruner.kind == PrunerKind::kFull) config.schedule.kind = ScheduleKind::kFixed;
  SNAPFILL_ASSIGN_OR_RETURN(std::string text, ReadInput(input_path, "--input"));
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--input ", input_path, " is empty"));
  }
  SNAPFILL_ASSIGN_OR_RETURN(LoadedModel model, LoadModelFromFlags());
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, BackendFromFlags());
  std::vector<int32_t> haystack = model.tokenizer->Encode(text, false, false);
  text.clear();
  text.shrink_to_fit();
  if (haystack.size() < static_cast<size_t>(kMinHaystack)) {
    return absl::InvalidArgumentError(absl::StrCat("--input ", input_path, " has ",
                                                   haystack.size(), " tokens; the haystack "
                                                   "needs at least ", kMinHaystack));
  }
  if (absl::GetFlag(FLAGS_query_aware)) {
    // As `run --question`: the question guides every chunk's compression.
    SNAPFILL_ASSIGN_OR_RETURN(config.query_tokens,
                              BuildContinuation(*model.tokenizer, model.chat_template, kQuestion));
  }
  const int64_t haystack_tokens = haystack.size();
  const int64_t context = model.model->config().context_length;
  const bool baseline = absl::GetFlag(FLAGS_baseline);
  const bool progress = absl::GetFlag(FLAGS_progress);
  NeedleHarness harness(model, backend.get(), config, std::move(haystack),
                        absl::GetFlag(FLAGS_system));
  // Refuse impossible cells before any work: too short for the template,
  // or a plan the schedule cannot make (checked on the longest and
  // shortest lengths, whose plans bracket the others').
  {
    double unused = 0;
    for (int64_t length : lengths) {
      SNAPFILL_ASSIGN_OR_RETURN(DocumentPrompt p,
                                harness.BuildPrompt(length, 0.5, 0, "1234567", &unused));
      SNAPFILL_RETURN_IF_ERROR(
          PrefillEngine::Footprint(model.model->config(), config, p.tokens.size()).status());
    }
  }

  std::vector<Cell> cells;
  Stopwatch total;
  const size_t num_cells = lengths.size() * depths.size();
  for (size_t li = 0; li < lengths.size(); ++li) {
    for (size_t di = 0; di < depths.size(); ++di) {
      Cell cell;
      cell.length = lengths[li];
      cell.depth = depths[di];
      for (int seed = 0; seed < seeds; ++seed) {
        Trial t;
        t.seed = seed;
        t.key = TrialKey(cell.length, di, seed);
        SNAPFILL_ASSIGN_OR_RETURN(
            DocumentPrompt p, harness.BuildPrompt(cell.length, cell.depth,
                                                  harness.Offset(seed, seeds), t.key,
                                                  &t.needle_depth));
        t.tokens = p.tokens.size();
        Stopwatch watch;
        SNAPFILL_ASSIGN_OR_RETURN(t.answer, harness.AnswerCompressed(p.tokens));
        t.seconds = watch.Seconds();
        t.found = ContainsKey(t.answer, t.key);
        cell.found += t.found;
        if (baseline && t.tokens + kAnswerTokens <= context) {
          Stopwatch base_watch;
          SNAPFILL_ASSIGN_OR_RETURN(t.baseline_answer, harness.AnswerFull(p.tokens, batch));
          t.baseline_seconds = base_watch.Seconds();
          t.baseline_run = true;
          t.baseline_found = ContainsKey(t.baseline_answer, t.key);
          cell.baseline_found += t.baseline_found;
          ++cell.baseline_runs;
        }
        if (progress) {
          std::fprintf(stderr,
                       "[snapfill needle] cell %zu/%zu seed %d/%d: length %lld depth %.2f key %s "
                       "-> %s%s (%.1f s) | %s\n",
                       cells.size() + 1, num_cells, seed + 1, seeds, (long long)t.tokens,
                       cell.depth, t.key.c_str(), t.found ? "found" : "missed",
                       t.baseline_run ? (t.baseline_found ? ", baseline found" : ", baseline missed")
                                      : "",
                       t.seconds + t.baseline_seconds, HumanSeconds(total.Seconds()).c_str());
        }
        cell.trials.push_back(std::move(t));
      }
      cells.push_back(std::move(cell));
    }
  }

  // The grid: rows are depths, columns lengths; "found/trials [baseline]".
  const std::string label = ConfigLabel(config);
  std::printf("needle: haystack %s (%lld tokens) | %s, window %lld, positions %s | %d seed%s | "
              "question \"%s\" | %lld greedy tokens\n",
              input_path.c_str(), (long long)haystack_tokens, label.c_str(),
              (long long)config.schedule.window,
              config.keep_original_positions ? "original" : "re-encoded", seeds,
              seeds == 1 ? "" : "s", kQuestion, (long long)kAnswerTokens);
  std::printf("%-16s", "depth \\ length");
  for (int64_t l : lengths) std::printf("%14lld", (long long)l);
  std::printf("\n");
  int found = 0, trials = 0, base_found = 0, base_runs = 0;
  for (size_t di = 0; di < depths.size(); ++di) {
    std::printf("%-16.2f", depths[di]);
    for (size_t li = 0; li < lengths.size(); ++li) {
      const Cell& c = cells[li * depths.size() + di];
      const std::string base =
          c.baseline_runs > 0 ? absl::StrCat(" [", c.baseline_found, "/", c.baseline_runs, "]")
                              : (baseline ? " [-]" : "");
      std::printf("%14s", absl::StrCat(c.found, "/", c.trials.size(), base).c_str());
      found += c.found;
      trials += c.trials.size();
      base_found += c.baseline_found;
      base_runs += c.baseline_runs;
    }
    std::printf("\n");
  }
  std::printf("accuracy: %s %.3f (%d/%d)", label.c_str(), double(found) / trials, found, trials);
  if (base_runs > 0) {
    std::printf(" | full attention [in brackets] %.3f (%d/%d)", double(base_found) / base_runs,
                base_found, base_runs);
  }
  if (baseline && base_runs < trials) std::printf(" | [-]: beyond the model's context of %lld", (long long)context);
  std::printf(" | %.1f s\n", total.Seconds());

  if (!json_path.empty()) {
    Json j;
    j["command"] = "needle";
    j["model"] = model.path;
    j["input"] = input_path;
    j["haystack_tokens"] = haystack_tokens;
    j["label"] = label;
    Json cfg = Json::parse(ConfigJson(config, "", 0), nullptr, /*allow_exceptions=*/false);
    cfg.erase("input_tokens");
    j["config"] = cfg.is_discarded() ? Json::object() : cfg;
    j["context_length"] = context;
    j["question"] = kQuestion;
    j["needle"] = absl::StrCat(kNeedlePrefix, "<key>.");
    j["answer_tokens"] = kAnswerTokens;
    j["lengths"] = lengths;
    j["depths"] = depths;
    j["seeds"] = seeds;
    j["accuracy"] = double(found) / trials;
    if (base_runs > 0) j["baseline_accuracy"] = double(base_found) / base_runs;
    Json cells_json = Json::array();
    for (const Cell& c : cells) {
      Json jc;
      jc["length"] = c.length;
      jc["depth"] = c.depth;
      jc["found"] = c.found;
      jc["trials"] = static_cast<int64_t>(c.trials.size());
      jc["accuracy"] = double(c.found) / c.trials.size();
      if (c.baseline_runs > 0) {
        jc["baseline_accuracy"] = double(c.baseline_found) / c.baseline_runs;
      } else {
        jc["baseline_accuracy"] = nullptr;
      }
      Json runs = Json::array();
      for (const Trial& t : c.trials) {
        Json jt;
        jt["seed"] = t.seed;
        jt["key"] = t.key;
        jt["tokens"] = t.tokens;
        jt["needle_depth"] = t.needle_depth;
        jt["answer"] = t.answer;
        jt["found"] = t.found;
        jt["seconds"] = t.seconds;
        if (t.baseline_run) {
          jt["baseline_answer"] = t.baseline_answer;
          jt["baseline_found"] = t.baseline_found;
          jt["baseline_seconds"] = t.baseline_seconds;
        }
        runs.push_back(std::move(jt));
      }
      jc["runs"] = std::move(runs);
      cells_json.push_back(std::move(jc));
    }
    j["cells"] = std::move(cells_json);
    std::ofstream out(json_path, std::ios::trunc);
    out << j.dump(1, ' ', false, Json::error_handler_t::replace) << "\n";
    out.close();
    if (!out) return absl::PermissionDeniedError(absl::StrCat("--json ", json_path, ": cannot write"));
  }
  if (!png.empty()) {
    NeedleGrid run, base;
    run.title = label;
    base.title = "full attention, one pass (baseline)";
    run.lengths = base.lengths = lengths;
    run.depths = base.depths = depths;
    const double nan = std::nan("");
    run.accuracy.assign(depths.size(), std::vector<double>(lengths.size(), nan));
    base.accuracy = run.accuracy;
    for (size_t li = 0; li < lengths.size(); ++li) {
      for (size_t di = 0; di < depths.size(); ++di) {
        const Cell& c = cells[li * depths.size() + di];
        run.accuracy[di][li] = double(c.found) / c.trials.size();
        if (c.baseline_runs > 0) base.accuracy[di][li] = double(c.baseline_found) / c.baseline_runs;
      }
    }
    std::vector<NeedleGrid> grids = {run};
    if (base_runs > 0) grids.push_back(base);
    SNAPFILL_RETURN_IF_ERROR(PlotNeedleHeatMaps(grids, png));
  }
  return absl::OkStatus();
}

}  // namespace snapfill::cli
