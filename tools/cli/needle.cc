// snapfill needle: retrieval accuracy over input length x needle depth x
// task (DESIGN.md §12; the SnapKV paper's Figure 3, RULER's retrieval
// tasks).
//
// A trial: a slice of the haystack text (--input), starting at an offset
// that depends on the seed (after a sentence end), holding the task's
// needle sentences (tools/cli/needle_tasks.h; the passkey's is "The special
// magic number is NNNNNNN.") at their depths (snapped back to sentence
// ends), inside the model's chat template with the task's question after
// it, exactly as `snapfill run --question` builds its prompt. The whole
// prompt is the cell's length in tokens. The prompt is read by the chunk
// loop with the configured schedule and pruner, the answer decoded
// greedily, and the trial scores 1 if the answer holds what the task asks
// for (the key; all values of multivalue; all variables of vartrack). The
// baseline reads the same prompt with full attention in one pass (plain
// prefill) where it fits the model's context.
//
// --json is written after every trial ("complete": false until the grid
// ends), so that a grid of hours loses nothing when it stops; --resume
// continues the grid that file holds, running only the trials it lacks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "snapfill/engine.h"
#include "src/model/llama_forward.h"
#include "snapfill/status.h"
#include "src/base/file_util.h"
#include "src/base/sys_stats.h"
#include "src/engine/generate.h"
#include "src/engine/prompt.h"
#include "src/engine/recall.h"
#include "src/kv/checkpoint_file.h"
#include "src/kv/kv_cache.h"
#include "src/kv/recall_store.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"
#include "tools/cli/flags.h"
#include "tools/cli/needle_tasks.h"
#include "tools/cli/plot.h"

namespace snapfill::cli {
namespace {

using Json = nlohmann::json;

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

struct Trial {
  int seed = 0;
  // What is planted and asked; plan.question is the question the prompt
  // ends with.
  NeedleTrial plan;
  std::vector<PlacedNeedle> placed;  // [plan.needles.size()]
  NeedleSpans spans;                 // the needles' and the expected values' tokens in the prompt
  // [plan.needles.size()], [plan.expected.size()]: the share of each
  // needle's and each expected value's tokens the final cache holds
  // (NeedleKept); -1 where not known (a record without it, tokens not
  // found).
  std::vector<double> kept, value_kept;
  int64_t tokens = 0;  // the prompt's length
  std::string answer;
  NeedleScore score;
  bool baseline_run = false;
  std::string baseline_answer;
  NeedleScore baseline_score;
  double seconds = 0;
  double baseline_seconds = 0;
};

struct Cell {
  NeedleTask task = NeedleTask::kPasskey;
  int64_t length = 0;
  double depth = 0;
  std::vector<Trial> trials;
};

// The mean of the asked needles' kept shares (values: of the expected
// values'); -1 where none is known.
double AskedKept(const Trial& t, bool values) {
  const std::vector<double>& kept = values ? t.value_kept : t.kept;
  double sum = 0;
  int n = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    if ((values || (i < t.plan.needles.size() && t.plan.needles[i].asked)) && kept[i] >= 0) {
      sum += kept[i];
      ++n;
    }
  }
  return n > 0 ? sum / n : -1;
}

// Counts over trials (a cell's or a task's).
struct Tally {
  int trials = 0, found = 0, matched = 0, expected = 0, distractor = 0;
  int base_runs = 0, base_found = 0, base_matched = 0, base_expected = 0, base_distractor = 0;
  double seconds = 0;
  // The asked needles' kept shares (AskedKept) summed over the trials that
  // know them, [.][0] the missed trials', [.][1] the found ones'; [0][.]
  // the needles', [1][.] the expected values'.
  double kept[2][2] = {};
  int kept_trials[2][2] = {};
  bool distractors = false;  // the trials plant distractors (multikey, vartrack)

  // Partial credit is worth showing where a trial asks for several values.
  bool several() const { return expected > trials; }

  void Add(const Trial& t) {
    const int n = t.plan.expected.size();
    ++trials;
    distractors |= !t.plan.distractors.empty();
    found += t.score.found;
    matched += t.score.matched;
    expected += n;
    distractor += t.score.distractor;
    seconds += t.seconds + t.baseline_seconds;
    for (int values = 0; values < 2; ++values) {
      if (const double k = AskedKept(t, values); k >= 0) {
        kept[values][t.score.found] += k;
        ++kept_trials[values][t.score.found];
      }
    }
    if (t.baseline_run) {
      ++base_runs;
      base_found += t.baseline_score.found;
      base_matched += t.baseline_score.matched;
      base_expected += n;
      base_distractor += t.baseline_score.distractor;
    }
  }
  void Add(const Cell& c) {
    for (const Trial& t : c.trials) Add(t);
  }
};

// The share of span's tokens (input positions) the cache holds, averaged
// over the global layers' KV heads (a sliding-window layer keeps its last
// entries whatever they are); -1 for a span not found.
double NeedleKept(const KvCache& kv, const LlamaConfig& c, TokenSpan span) {
  if (!span.found()) return -1;
  double sum = 0;
  int64_t heads = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.IsLocal(l)) continue;
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const int32_t* pos = kv.pos(l, h);
      const int64_t in =
          std::count_if(pos, pos + kv.size(l), [&](int32_t p) { return p >= span.begin && p < span.end; });
      sum += static_cast<double>(in) / (span.end - span.begin);
      ++heads;
    }
  }
  return heads > 0 ? sum / heads : -1;
}

class NeedleHarness {
 public:
  // recall_after: entries per layer and KV head the question brings back
  // after a prefill it did not guide (--recall_dir with --query_aware=false
  // or a pruner that needs no question), as run does then; 0: none, or the
  // chunk loop's own recall (config.recall_budget).
  NeedleHarness(LoadedModel& model, Backend* backend, PrefillConfig config, int64_t recall_after)
      : model_(model), backend_(backend), config_(config), recall_after_(recall_after) {}

  // The configured chunk loop, then `answer_tokens` greedy tokens. With
  // --query_aware the trial's question (as it closes the prompt) guides
  // every chunk's compression, as in `run --question`. With recall_after,
  // the chunk loop reads the prompt up to document_end (the template's
  // opening and the document: what `prefill` saves), and the rest (the
  // question as it closes the prompt) brings back what it attends to most
  // from the store and is then read as the answer's prompt, as `prefill
  // --recall_dir` and `generate --cache --recall_dir` do. kept,
  // value_kept: for each of spans' needles and values, the share of its
  // tokens the cache holds once the input is read (and the store's entries
  // brought back), NeedleKept's.
  absl::StatusOr<std::string> AnswerCompressed(const std::vector<int32_t>& prompt, int64_t document_end,
                                               const std::string& question, int64_t answer_tokens,
                                               const NeedleSpans& spans, std::vector<double>* kept,
                                               std::vector<double>* value_kept) {
    PrefillConfig config = config_;
    if (absl::GetFlag(FLAGS_query_aware) && config.pruner.kind == PrunerKind::kSnapKv) {
      SNAPFILL_ASSIGN_OR_RETURN(config.query_tokens,
                                BuildContinuation(*model_.tokenizer, model_.chat_template, question));
    }
    std::vector<int32_t> ask_after;
    if (recall_after_ > 0) {
      SNAPFILL_ASSIGN_OR_RETURN(ask_after, BuildContinuation(*model_.tokenizer, model_.chat_template, question));
    }
    std::vector<int32_t> document;
    if (!ask_after.empty()) document.assign(prompt.begin(), prompt.begin() + document_end);
    const std::vector<int32_t>& tokens = ask_after.empty() ? prompt : document;
    SNAPFILL_ASSIGN_OR_RETURN(
        std::unique_ptr<PrefillEngine> engine,
        PrefillEngine::Create(*model_.model, backend_, config, tokens.size()));
    // --recall_dir: a store of this trial's own, removed after it.
    std::unique_ptr<RecallStore> store;
    if (config.recall_budget > 0 || recall_after_ > 0) {
      RecallStoreInfo info = RecallShape(model_.model->config(), config.recall_format);
      info.input_digest = TokenDigest(tokens.data(), tokens.size());
      info.input_tokens = static_cast<int64_t>(tokens.size());
      info.plan_digest = engine->plan_digest();
      SNAPFILL_ASSIGN_OR_RETURN(store, RecallStore::Create(absl::GetFlag(FLAGS_recall_dir), info));
      SNAPFILL_RETURN_IF_ERROR(engine->AttachRecallStore(store.get()));
    }
    absl::Status ran = engine->Run(tokens, nullptr);
    std::unique_ptr<KvCache> kv;
    int64_t next_position = 0;
    if (ran.ok()) {
      const int64_t room = answer_tokens + (ask_after.empty() ? 0 : ask_after.size() + recall_after_);
      absl::StatusOr<std::unique_ptr<KvCache>> made = engine->MakeDecoderCache(room);
      if (made.ok()) {
        kv = *std::move(made);
        next_position = engine->next_position();
      } else {
        ran = made.status();
      }
    }
    if (ran.ok() && !ask_after.empty()) {
      ran = RecallForQuestion(*model_.model, backend_, *kv, &next_position, *store, ask_after,
                              RecallAfterOptions(config, recall_after_))
                .status();
    }
    if (store != nullptr) SNAPFILL_RETURN_IF_ERROR(store->Remove());
    SNAPFILL_RETURN_IF_ERROR(ran);
    kept->clear();
    for (const TokenSpan& span : spans.needles) kept->push_back(NeedleKept(*kv, model_.model->config(), span));
    value_kept->clear();
    for (const TokenSpan& span : spans.values) value_kept->push_back(NeedleKept(*kv, model_.model->config(), span));
    if (!ask_after.empty()) {
      if (prompt_forward_ == nullptr || prompt_forward_->max_tokens() < static_cast<int64_t>(ask_after.size())) {
        SNAPFILL_ASSIGN_OR_RETURN(prompt_forward_, LlamaForward::Create(*model_.model, backend_, ask_after.size()));
      }
      SNAPFILL_ASSIGN_OR_RETURN(
          GenerateResult r, Generate(*prompt_forward_, *kv, next_position, ask_after, Options(answer_tokens), nullptr));
      return model_.tokenizer->Decode(r.tokens);
    }
    if (decoder_ == nullptr) {
      SNAPFILL_ASSIGN_OR_RETURN(decoder_, LlamaForward::Create(*model_.model, backend_, 1));
    }
    SNAPFILL_ASSIGN_OR_RETURN(GenerateResult r, GenerateFromLogits(*decoder_, *kv, next_position, engine->last_logits(),
                                                                   Options(answer_tokens), nullptr));
    return model_.tokenizer->Decode(r.tokens);
  }

  // Full attention in one pass: plain prefill of the whole prompt.
  absl::StatusOr<std::string> AnswerFull(const std::vector<int32_t>& tokens, int64_t batch,
                                         int64_t answer_tokens) {
    if (batch_forward_ == nullptr) {
      SNAPFILL_ASSIGN_OR_RETURN(batch_forward_, LlamaForward::Create(*model_.model, backend_, batch));
    }
    SNAPFILL_ASSIGN_OR_RETURN(auto kv, batch_forward_->NewKvCache(tokens.size() + answer_tokens));
    SNAPFILL_ASSIGN_OR_RETURN(
        GenerateResult r,
        Generate(*batch_forward_, *kv, 0, tokens, Options(answer_tokens), nullptr));
    return model_.tokenizer->Decode(r.tokens);
  }

 private:
  GenerateOptions Options(int64_t answer_tokens) const {
    GenerateOptions o;
    o.max_new_tokens = answer_tokens;  // greedy: SamplingParams' default temperature is 0
    const Tokenizer* tok = model_.tokenizer.get();
    o.is_eog = [tok](int32_t id) { return tok->IsEndOfGeneration(id); };
    return o;
  }

  LoadedModel& model_;
  Backend* backend_;
  PrefillConfig config_;
  int64_t recall_after_ = 0;
  std::unique_ptr<LlamaForward> decoder_;
  std::unique_ptr<LlamaForward> batch_forward_;
  std::unique_ptr<LlamaForward> prompt_forward_;  // the question after a recall (recall_after_)
};

std::string ConfigLabel(const PrefillConfig& c, int64_t recall_after) {
  std::string s = absl::StrCat(std::string(ScheduleKindName(c.schedule.kind)), " ",
                               PrunerKindName(c.pruner.kind));
  if (c.pruner.kind != PrunerKind::kFull) absl::StrAppend(&s, " m", c.schedule.memory);
  absl::StrAppend(&s, " c", c.schedule.chunk);
  if (absl::GetFlag(FLAGS_query_aware) && c.pruner.kind == PrunerKind::kSnapKv) {
    absl::StrAppend(&s, " question-guided (", QuestionSelectionLabel(c.pruner), ")");
    if (c.recall_budget > 0) absl::StrAppend(&s, " recall ", c.recall_budget, " ", RecallFormatName(c.recall_format));
  }
  if (recall_after > 0) {
    absl::StrAppend(&s, " recall ", recall_after, " ", RecallFormatName(c.recall_format), " after the prefill");
    // (Named only where it is not the default, as batch records it: grids
    // made before the ranking across layers resume with it.)
    if (!RecallAfterOptions(c, recall_after).summed) absl::StrAppend(&s, ", ranked by heads");
    // (Named: a grid made while the last chunk was compressed does not
    // resume into one that keeps it.)
    if (c.schedule.keep_last_chunk) absl::StrAppend(&s, ", last chunk whole");
  }
  return s;
}

// "0.583 (28/48)".
std::string Share(int part, int whole) {
  return absl::StrFormat("%.3f (%d/%d)", double(part) / whole, part, whole);
}

Json TallyJson(const Tally& t) {
  Json j;
  j["trials"] = t.trials;
  j["found"] = t.found;
  j["accuracy"] = double(t.found) / t.trials;
  // The share of the expected values (multivalue's numbers, vartrack's
  // variables) the answers hold.
  j["recall"] = double(t.matched) / t.expected;
  if (t.distractors) j["distractors_answered"] = t.distractor;
  // The asked needle's tokens in the final cache (AskedKept), and the
  // expected values', over the trials, the found ones and the missed ones.
  for (int values = 0; values < 2; ++values) {
    const std::string name = values ? "expected_kept" : "asked_kept";
    const double* k = t.kept[values];
    const int* n = t.kept_trials[values];
    if (n[0] + n[1] == 0) continue;
    j[name] = (k[0] + k[1]) / (n[0] + n[1]);
    if (n[1] > 0) j[name + "_found"] = k[1] / n[1];
    if (n[0] > 0) j[name + "_missed"] = k[0] / n[0];
  }
  if (t.base_runs > 0) {
    j["baseline_runs"] = t.base_runs;
    j["baseline_accuracy"] = double(t.base_found) / t.base_runs;
    j["baseline_recall"] = double(t.base_matched) / t.base_expected;
    if (t.distractors) j["baseline_distractors_answered"] = t.base_distractor;
  } else {
    j["baseline_accuracy"] = nullptr;
  }
  return j;
}

Json RunJson(const Trial& t) {
  Json jt;
  jt["seed"] = t.seed;
  if (t.plan.task == NeedleTask::kPasskey) jt["key"] = t.plan.expected[0];
  jt["tokens"] = t.tokens;
  jt["needle_depth"] = t.placed[0].depth;  // the needle at the cell's depth
  jt["question"] = t.plan.question;
  Json needles = Json::array();
  for (size_t i = 0; i < t.plan.needles.size(); ++i) {
    // depth and offset as placed: haystack tokens before the needle.
    needles.push_back({{"text", t.plan.needles[i].text},
                       {"asked", t.plan.needles[i].asked},
                       {"depth", t.placed[i].depth},
                       {"offset", t.placed[i].offset}});
    // Its tokens in the prompt, and their share in the final cache.
    if (i < t.spans.needles.size() && t.spans.needles[i].found()) {
      needles.back()["tokens"] = {t.spans.needles[i].begin, t.spans.needles[i].end};
    }
    if (i < t.kept.size() && t.kept[i] >= 0) needles.back()["kept"] = t.kept[i];
  }
  jt["needles"] = std::move(needles);
  jt["expected"] = t.plan.expected;
  // The same for each expected value, where the asked needles hold it as
  // written (null where not).
  Json value_kept = Json::array();
  for (size_t v = 0; v < t.plan.expected.size(); ++v) {
    value_kept.push_back(v < t.value_kept.size() && t.value_kept[v] >= 0 ? Json(t.value_kept[v]) : Json());
  }
  jt["expected_kept"] = std::move(value_kept);
  if (!t.plan.distractors.empty()) jt["distractors"] = t.plan.distractors;
  jt["answer"] = t.answer;
  jt["matched"] = t.score.matched;
  jt["found"] = t.score.found;
  if (!t.plan.distractors.empty()) jt["distractor_found"] = t.score.distractor;
  jt["seconds"] = t.seconds;
  if (t.baseline_run) {
    jt["baseline_answer"] = t.baseline_answer;
    jt["baseline_matched"] = t.baseline_score.matched;
    jt["baseline_found"] = t.baseline_score.found;
    if (!t.plan.distractors.empty()) jt["baseline_distractor_found"] = t.baseline_score.distractor;
    jt["baseline_seconds"] = t.baseline_seconds;
  }
  return jt;
}

// The grid's flags, checked.
struct Grid {
  std::string input_path;
  std::vector<NeedleTask> tasks;
  std::vector<int64_t> lengths;
  std::vector<double> depths;
  int seeds = 0, first_seed = 0;
  int64_t batch = 0;
  bool baseline = false, progress = false, resume = false;
  std::string json_path, png;
};

absl::StatusOr<Grid> GridFromFlags() {
  Grid g;
  g.input_path = absl::GetFlag(FLAGS_input);
  if (g.input_path.empty()) {
    return absl::InvalidArgumentError("--input FILE (the haystack text) is required");
  }
  SNAPFILL_ASSIGN_OR_RETURN(g.tasks, ParseNeedleTasks(absl::GetFlag(FLAGS_tasks)));
  SNAPFILL_ASSIGN_OR_RETURN(g.lengths, ParseLengths(absl::GetFlag(FLAGS_lengths)));
  SNAPFILL_ASSIGN_OR_RETURN(g.depths, ParseDepths(absl::GetFlag(FLAGS_depths)));
  g.seeds = absl::GetFlag(FLAGS_seeds);
  if (g.seeds < 1 || g.seeds > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("--seeds=", g.seeds, " must be in [1, 1000]"));
  }
  g.first_seed = absl::GetFlag(FLAGS_first_seed);
  if (g.first_seed < 0 || g.first_seed >= g.seeds) {
    return absl::InvalidArgumentError(
        absl::StrCat("--first_seed=", g.first_seed, " must be in [0, --seeds=", g.seeds, ")"));
  }
  g.batch = absl::GetFlag(FLAGS_batch);
  if (g.batch < 1) return absl::InvalidArgumentError(absl::StrCat("--batch=", g.batch, " must be >= 1"));
  g.baseline = absl::GetFlag(FLAGS_baseline);
  g.progress = absl::GetFlag(FLAGS_progress);
  g.json_path = absl::GetFlag(FLAGS_json);
  g.png = absl::GetFlag(FLAGS_png);
  g.resume = absl::GetFlag(FLAGS_resume);
  if (g.resume && g.json_path.empty()) {
    return absl::InvalidArgumentError("--resume continues the grid in --json FILE: give the file");
  }
  return g;
}

// Refuses impossible cells before any work: a length too short for a
// trial's template, needles and question, or a plan the schedule cannot
// make (checked on each length's first prompt).
absl::Status CheckCells(const Grid& g, const NeedlePromptBuilder& builder, const LoadedModel& model,
                        const PrefillConfig& config) {
  for (NeedleTask task : g.tasks) {
    for (int64_t length : g.lengths) {
      for (size_t di = 0; di < g.depths.size(); ++di) {
        for (int seed = g.first_seed; seed < g.seeds; ++seed) {
          SNAPFILL_RETURN_IF_ERROR(
              builder.CheckLength(length, MakeNeedleTrial(task, length, di, g.depths[di], seed)));
        }
      }
      const NeedleTrial first = MakeNeedleTrial(task, length, 0, g.depths[0], 0);
      SNAPFILL_ASSIGN_OR_RETURN(NeedlePrompt p, builder.Build(length, 0, first));
      // (Checked with a question, as every trial runs with its own.)
      PrefillConfig checked = config;
      if (absl::GetFlag(FLAGS_query_aware) && config.pruner.kind == PrunerKind::kSnapKv) {
        SNAPFILL_ASSIGN_OR_RETURN(checked.query_tokens, BuildContinuation(*model.tokenizer, model.chat_template,
                                                                          first.question));
      }
      SNAPFILL_RETURN_IF_ERROR(
          PrefillEngine::Footprint(model.model->config(), checked, p.prompt.tokens.size()).status());
    }
  }
  return absl::OkStatus();
}

// The trials a --json file records, by cell and seed (RecordKey), as
// --resume reads them.
using Recorded = std::map<std::string, Json>;

std::string RecordKey(const std::string& task, int64_t length, double depth, int seed) {
  return absl::StrFormat("%s|%d|%.17g|%d", task, length, depth, seed);
}

// A recorded trial in place of running it: its answers (the scores are the
// answers' again). False where the record is not this trial's (other
// values planted) or lacks the baseline the grid now runs.
bool FromRecord(const Json& run, bool wants_baseline, Trial& t) {
  if (!run.contains("expected") || run["expected"] != Json(t.plan.expected) || !run.contains("answer")) return false;
  if (wants_baseline && !run.contains("baseline_answer")) return false;
  t.answer = run["answer"].get<std::string>();
  t.seconds = run.value("seconds", 0.0);
  t.kept.assign(t.plan.needles.size(), -1);
  if (run.contains("needles") && run["needles"].is_array()) {
    for (size_t i = 0; i < t.kept.size() && i < run["needles"].size(); ++i) {
      const Json& n = run["needles"][i];
      if (n.is_object() && n.contains("kept") && n["kept"].is_number()) t.kept[i] = n["kept"].get<double>();
    }
  }
  t.value_kept.assign(t.plan.expected.size(), -1);
  if (run.contains("expected_kept") && run["expected_kept"].is_array()) {
    for (size_t v = 0; v < t.value_kept.size() && v < run["expected_kept"].size(); ++v) {
      if (run["expected_kept"][v].is_number()) t.value_kept[v] = run["expected_kept"][v].get<double>();
    }
  }
  t.score = ScoreNeedleAnswer(t.plan, t.answer);
  if (wants_baseline) {
    t.baseline_run = true;
    t.baseline_answer = run["baseline_answer"].get<std::string>();
    t.baseline_seconds = run.value("baseline_seconds", 0.0);
    t.baseline_score = ScoreNeedleAnswer(t.plan, t.baseline_answer);
  }
  return true;
}

// Every trial, cells in task, length, depth order, taking those `recorded`
// holds from it; a line on stderr after each with --progress, and `save`
// called with the cells so far (the last one perhaps in part).
absl::StatusOr<std::vector<Cell>> RunCells(const Grid& g, const NeedlePromptBuilder& builder,
                                           NeedleHarness& harness, int64_t context, const Recorded& recorded,
                                           const std::function<absl::Status(const std::vector<Cell>&)>& save) {
  std::vector<Cell> cells;
  Stopwatch total;
  const size_t num_cells = g.tasks.size() * g.lengths.size() * g.depths.size();
  for (NeedleTask task : g.tasks) {
    const int64_t answer_tokens = InfoOf(task).answer_tokens;
    for (int64_t length : g.lengths) {
      for (size_t di = 0; di < g.depths.size(); ++di) {
        Cell cell;
        cell.task = task;
        cell.length = length;
        cell.depth = g.depths[di];
        for (int seed = g.first_seed; seed < g.seeds; ++seed) {
          Trial t;
          t.seed = seed;
          t.plan = MakeNeedleTrial(task, length, di, cell.depth, seed);
          SNAPFILL_ASSIGN_OR_RETURN(NeedlePrompt p, builder.Build(length, builder.Offset(seed, g.seeds), t.plan));
          t.placed = std::move(p.placed);
          t.spans = std::move(p.spans);
          t.tokens = p.prompt.tokens.size();
          const bool wants_baseline = g.baseline && t.tokens + answer_tokens <= context;
          auto record = recorded.find(RecordKey(InfoOf(task).name, length, cell.depth, seed));
          const bool reused = record != recorded.end() && FromRecord(record->second, wants_baseline, t);
          if (!reused) {
            Stopwatch watch;
            SNAPFILL_ASSIGN_OR_RETURN(t.answer,
                                      harness.AnswerCompressed(p.prompt.tokens, p.prompt.document_end, t.plan.question,
                                                               answer_tokens, t.spans, &t.kept, &t.value_kept));
            t.seconds = watch.Seconds();
            t.score = ScoreNeedleAnswer(t.plan, t.answer);
          }
          if (!reused && wants_baseline) {
            Stopwatch base_watch;
            SNAPFILL_ASSIGN_OR_RETURN(t.baseline_answer, harness.AnswerFull(p.prompt.tokens, g.batch, answer_tokens));
            t.baseline_seconds = base_watch.Seconds();
            t.baseline_run = true;
            t.baseline_score = ScoreNeedleAnswer(t.plan, t.baseline_answer);
          }
          if (g.progress) {
            std::fprintf(
                stderr,
                "[snapfill needle] %s cell %zu/%zu seed %d/%d: length %lld depth %.2f expects "
                "%s -> %s%s (%.1f s%s) | %s\n",
                InfoOf(task).name, cells.size() + 1, num_cells, seed + 1, g.seeds,
                (long long)t.tokens, cell.depth, absl::StrJoin(t.plan.expected, ",").c_str(),
                t.score.found ? "found" : "missed",
                t.baseline_run ? (t.baseline_score.found ? ", baseline found" : ", baseline missed")
                               : "",
                t.seconds + t.baseline_seconds, reused ? ", recorded" : "", HumanSeconds(total.Seconds()).c_str());
          }
          cell.trials.push_back(std::move(t));
          if (save && !reused) {
            std::vector<Cell> so_far = cells;
            so_far.push_back(cell);
            SNAPFILL_RETURN_IF_ERROR(save(so_far));
          }
        }
        cells.push_back(std::move(cell));
      }
    }
  }
  return cells;
}

// Per task, the grid: rows are depths, columns lengths; "found/trials
// [baseline]", then the task's accuracy line.
void PrintGrid(const Grid& g, const std::vector<Cell>& cells, const std::string& label,
                             int64_t context) {
  const size_t cells_per_task = g.lengths.size() * g.depths.size();
  for (size_t ti = 0; ti < g.tasks.size(); ++ti) {
    const NeedleTaskInfo& info = InfoOf(g.tasks[ti]);
    const Cell* task_cells = &cells[ti * cells_per_task];
    std::printf("task %s | question \"%s\" | %lld greedy tokens | found: %s\n", info.name,
                info.question, (long long)info.answer_tokens, info.found_when);
    std::printf("%-16s", "depth \\ length");
    for (int64_t l : g.lengths) std::printf("%14lld", (long long)l);
    std::printf("\n");
    Tally all;
    for (size_t di = 0; di < g.depths.size(); ++di) {
      std::printf("%-16.2f", g.depths[di]);
      for (size_t li = 0; li < g.lengths.size(); ++li) {
        Tally c;
        c.Add(task_cells[li * g.depths.size() + di]);
        const std::string base =
            c.base_runs > 0 ? absl::StrCat(" [", c.base_found, "/", c.base_runs, "]")
                            : (g.baseline ? " [-]" : "");
        std::printf("%14s", absl::StrCat(c.found, "/", c.trials, base).c_str());
        all.Add(task_cells[li * g.depths.size() + di]);
      }
      std::printf("\n");
    }
    std::string line = absl::StrCat("accuracy ", info.name, ": ", label, " ",
                                    Share(all.found, all.trials));
    const bool several = all.several(), distractors = all.distractors;
    if (several) absl::StrAppend(&line, ", values found ", Share(all.matched, all.expected));
    if (distractors) absl::StrAppend(&line, ", a distractor's value answered ", all.distractor, "/", all.trials);
    if (all.base_runs > 0) {
      absl::StrAppend(&line, " | full attention [in brackets] ", Share(all.base_found, all.base_runs));
      if (several) absl::StrAppend(&line, ", values found ", Share(all.base_matched, all.base_expected));
      if (distractors) {
        absl::StrAppend(&line, ", a distractor's value answered ", all.base_distractor, "/", all.base_runs);
      }
    }
    if (g.baseline && all.base_runs < all.trials) {
      absl::StrAppend(&line, " | [-]: beyond the model's context of ", context);
    }
    for (int values = 0; values < 2; ++values) {
      const double* k = all.kept[values];
      const int* n = all.kept_trials[values];
      if (n[0] + n[1] == 0) continue;
      absl::StrAppend(&line, values ? ", the answer's " : " | the asked needle's tokens in the final cache: ",
                      absl::StrFormat("%.0f%%", 100 * (k[0] + k[1]) / (n[0] + n[1])));
      std::vector<std::string> parts;
      if (n[1] > 0) parts.push_back(absl::StrFormat("found %.0f%%", 100 * k[1] / n[1]));
      if (n[0] > 0) parts.push_back(absl::StrFormat("missed %.0f%%", 100 * k[0] / n[0]));
      absl::StrAppend(&line, " (", absl::StrJoin(parts, ", "), ")");
    }
    absl::StrAppendFormat(&line, " | %.1f s", all.seconds);
    std::printf("%s\n", line.c_str());
  }
}

// Per task (in --tasks order), the tally of the cells given (the whole
// grid, or the part run so far).
std::vector<Tally> TalliesByTask(const Grid& g, const std::vector<Cell>& cells) {
  std::vector<Tally> tallies(g.tasks.size());
  for (const Cell& c : cells) {
    const size_t ti = std::find(g.tasks.begin(), g.tasks.end(), c.task) - g.tasks.begin();
    if (ti < tallies.size()) tallies[ti].Add(c);
  }
  return tallies;
}

// What a grid is, as --json records it: a --resume continues only the
// grid these fields describe.
Json GridHeader(const Grid& g, const LoadedModel& model, const PrefillConfig& config, const std::string& label,
                int64_t haystack_tokens, int64_t context) {
  Json j;
  j["command"] = "needle";
  j["model"] = model.path;
  j["input"] = g.input_path;
  j["haystack_tokens"] = haystack_tokens;
  j["label"] = label;
  Json cfg = Json::parse(ConfigJson(config, "", 0), nullptr, /*allow_exceptions=*/false);
  cfg.erase("input_tokens");
  if (!cfg.is_discarded() && absl::GetFlag(FLAGS_query_aware) && config.pruner.kind == PrunerKind::kSnapKv) {
    // Each trial's question guided its compression (its own tokens).
    cfg["query_aware"] = true;
    cfg["query_share"] = config.pruner.query_share;
    cfg["select"] = SelectionName(config.pruner.query_select);
    cfg["span"] = config.pruner.span;
    cfg["query_heads"] = QueryHeadsName(config.pruner);
    cfg["query_votes"] = QueryVotesName(config.pruner.query_votes);
  }
  j["config"] = cfg.is_discarded() ? Json::object() : cfg;
  j["context_length"] = context;
  if (g.tasks.size() == 1) {
    j["question"] = InfoOf(g.tasks[0]).question;
    j["needle"] = InfoOf(g.tasks[0]).needle;
    j["answer_tokens"] = InfoOf(g.tasks[0]).answer_tokens;
  }
  j["lengths"] = g.lengths;
  j["depths"] = g.depths;
  j["seeds"] = g.seeds;
  j["first_seed"] = g.first_seed;
  Json names = Json::array();
  for (NeedleTask t : g.tasks) names.push_back(InfoOf(t).name);
  j["task_names"] = std::move(names);
  return j;
}

// The whole grid as --json writes it (and --png plots it); with `complete`
// false, the trials run so far.
Json GridJson(const Grid& g, const Json& header, const std::vector<Cell>& cells, bool complete) {
  Json j = header;
  j["complete"] = complete;
  const std::vector<Tally> task_tallies = TalliesByTask(g, cells);
  Tally overall;
  for (const Cell& c : cells) overall.Add(c);
  if (overall.trials == 0) return j;
  j["accuracy"] = double(overall.found) / overall.trials;
  if (overall.base_runs > 0) j["baseline_accuracy"] = double(overall.base_found) / overall.base_runs;
  Json tasks_json = Json::array();
  for (size_t ti = 0; ti < g.tasks.size(); ++ti) {
    if (task_tallies[ti].trials == 0) continue;
    const NeedleTaskInfo& info = InfoOf(g.tasks[ti]);
    Json jt = TallyJson(task_tallies[ti]);
    jt["task"] = info.name;
    jt["question"] = info.question;
    jt["needle"] = info.needle;
    jt["found_when"] = info.found_when;
    jt["answer_tokens"] = info.answer_tokens;
    tasks_json.push_back(std::move(jt));
  }
  j["tasks"] = std::move(tasks_json);
  Json cells_json = Json::array();
  for (const Cell& c : cells) {
    Tally tally;
    tally.Add(c);
    Json jc = TallyJson(tally);
    jc["task"] = InfoOf(c.task).name;
    jc["length"] = c.length;
    jc["depth"] = c.depth;
    Json runs = Json::array();
    for (const Trial& t : c.trials) runs.push_back(RunJson(t));
    jc["runs"] = std::move(runs);
    cells_json.push_back(std::move(jc));
  }
  j["cells"] = std::move(cells_json);
  return j;
}

absl::Status WriteGridJson(const std::string& path, const Json& j) {
  return WriteFileAtomically(path, j.dump(1, ' ', false, Json::error_handler_t::replace) + "\n", /*overwrite=*/true);
}

// The trials of the grid in `path` (--resume): InvalidArgument, naming the
// field, where the file holds another grid.
absl::StatusOr<Recorded> ReadRecorded(const std::string& path, const Json& header) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--resume: cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  const Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || j.value("command", "") != "needle") {
    return absl::InvalidArgumentError(absl::StrCat("--resume: ", path, " is not a needle grid's --json"));
  }
  for (const auto& [key, value] : header.items()) {
    if (!j.contains(key) || j[key] != value) {
      return absl::InvalidArgumentError(absl::StrCat("--resume: ", path, " holds a grid with another ", key, " (",
                                                     j.contains(key) ? j[key].dump() : "none", ", here ",
                                                     value.dump(), "): run it with the settings it was made with"));
    }
  }
  Recorded recorded;
  for (const Json& c : j.value("cells", Json::array())) {
    for (const Json& run : c.value("runs", Json::array())) {
      recorded[RecordKey(c.value("task", ""), c.value("length", int64_t{0}), c.value("depth", 0.0),
                         run.value("seed", -1))] = run;
    }
  }
  return recorded;
}

}  // namespace

absl::Status RunNeedle() {
  SNAPFILL_ASSIGN_OR_RETURN(const Grid g, GridFromFlags());
  if (!g.png.empty()) SNAPFILL_RETURN_IF_ERROR(CheckGnuplot());  // before hours of work
  SNAPFILL_ASSIGN_OR_RETURN(PrefillConfig config, PrefillConfigFromFlags());
  // As in ppl: the full pruner evicts nothing; its chunks are --chunk each.
  if (config.pruner.kind == PrunerKind::kFull) config.schedule.kind = ScheduleKind::kFixed;
  SNAPFILL_ASSIGN_OR_RETURN(LongInput in, OpenLongInput(g.input_path));
  LoadedModel& model = in.model;
  SNAPFILL_RETURN_IF_ERROR(SetPrunerInputs(model, config, /*question_guided=*/absl::GetFlag(FLAGS_query_aware)));
  // --recall_dir where the question does not guide the compression: it
  // recalls after the prefill (NeedleHarness), which then only keeps the store.
  const int64_t recall_after = MoveRecallAfterPrefill(&config);
  config.schedule.keep_last_chunk = KeepLastChunkFor(recall_after > 0);
  std::vector<int32_t> haystack = model.tokenizer->Encode(in.text, false, false);
  in.text.clear();
  in.text.shrink_to_fit();
  if (haystack.size() < static_cast<size_t>(NeedlePromptBuilder::kMinHaystackPerNeedle)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--input ", g.input_path, " has ", haystack.size(),
        " tokens; the haystack needs at least ", NeedlePromptBuilder::kMinHaystackPerNeedle));
  }
  const int64_t context = model.model->config().context_length;
  const NeedlePromptBuilder builder(*model.tokenizer, model.chat_template, std::move(haystack),
                                    absl::GetFlag(FLAGS_system));
  NeedleHarness harness(model, in.backend.get(), config, recall_after);
  SNAPFILL_RETURN_IF_ERROR(CheckCells(g, builder, model, config));
  const std::string label = ConfigLabel(config, recall_after);
  const Json header = GridHeader(g, model, config, label, builder.haystack_tokens(), context);
  Recorded recorded;
  if (g.resume) {
    SNAPFILL_ASSIGN_OR_RETURN(recorded, ReadRecorded(g.json_path, header));
  } else if (!g.json_path.empty()) {
    // Writable before the first trial, not after hours of them.
    SNAPFILL_RETURN_IF_ERROR(WriteGridJson(g.json_path, GridJson(g, header, {}, false)));
  }
  std::function<absl::Status(const std::vector<Cell>&)> save;
  if (!g.json_path.empty()) {
    save = [&](const std::vector<Cell>& so_far) { return WriteGridJson(g.json_path, GridJson(g, header, so_far, false)); };
  }
  SNAPFILL_ASSIGN_OR_RETURN(const std::vector<Cell> cells, RunCells(g, builder, harness, context, recorded, save));

  std::printf("needle: haystack %s (%lld tokens) | %s, window %lld, positions %s | %d seed%s\n",
              g.input_path.c_str(), (long long)builder.haystack_tokens(), label.c_str(),
              (long long)config.schedule.window,
              config.keep_original_positions ? "original" : "re-encoded", g.seeds,
              g.seeds == 1 ? "" : "s");
  PrintGrid(g, cells, label, context);
  const Json j = GridJson(g, header, cells, /*complete=*/true);
  if (!g.json_path.empty()) SNAPFILL_RETURN_IF_ERROR(WriteGridJson(g.json_path, j));
  if (!g.png.empty()) {
    SNAPFILL_ASSIGN_OR_RETURN(std::vector<std::string> maps, PlotNeedleJson(j, g.png));
    for (const std::string& m : maps) std::printf("%s\n", m.c_str());
  }
  return absl::OkStatus();
}

}  // namespace snapfill::cli
