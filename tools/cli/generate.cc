// snapfill generate: a continuation of a prompt, or an answer from a cache
// saved by snapfill prefill.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "snapfill/status.h"
#include "src/base/sys_stats.h"
#include "src/engine/generate.h"
#include "src/engine/prompt.h"
#include "src/engine/recall.h"
#include "src/gguf/fingerprint.h"
#include "src/kv/cache_file.h"
#include "src/kv/recall_store.h"
#include "src/model/llama_forward.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"
#include "tools/cli/roofline.h"
#include "tools/cli/flags.h"

namespace snapfill::cli {
namespace {

using Json = nlohmann::json;

// A 16-hex-digit digest as the cache's configuration records it.
bool ParseDigest(const Json& value, uint64_t* out) {
  if (!value.is_string()) return false;
  const std::string s = value.get<std::string>();
  char* end = nullptr;
  *out = std::strtoull(s.c_str(), &end, 16);
  return !s.empty() && s.size() <= 16 && end == s.c_str() + s.size();
}

// Streams each token's text to stdout as soon as it is chosen.
std::function<bool(int32_t)> StreamTo(const Tokenizer& tokenizer) {
  const bool tty = isatty(fileno(stdout));
  return [&tokenizer, tty](int32_t id) {
    const std::string piece = tokenizer.TokenToPiece(id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    if (tty) std::fflush(stdout);
    return true;
  };
}

void PrintTiming(const GenerateResult& r, const char* prefix) {
  const double decode_tps = r.tokens.size() > 1 ? (r.tokens.size() - 1) / r.decode_seconds : 0.0;
  std::fprintf(stderr,
               "%sprompt: %lld tokens in %.3f s (%.1f tokens/s) | TTFT %.3f s | generated %zu "
               "tokens, decode %.1f tokens/s%s | peak RSS %s\n",
               prefix, (long long)r.prompt_tokens, r.prefill_seconds,
               r.prompt_tokens / std::max(r.prefill_seconds, 1e-9), r.ttft_seconds,
               r.tokens.size(), decode_tps, r.stopped_at_eog ? " (stopped at end of turn)" : "",
               HumanBytes(PeakRssBytes()).c_str());
}

// --cache with --recall_dir: the store `prefill --out` kept for this cache
// (checked by the identity the cache records), then what the question
// attends to most brought back into the cache.
absl::Status RecallFromStore(const LoadedModel& m, Backend* backend, const PromptCache& cache, KvCache& kv,
                             int64_t* start_pos, const std::string& dir, const std::vector<int32_t>& question) {
  const Json config = Json::parse(cache.config, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.contains("recall_input_digest") || !config.contains("recall_plan_digest")) {
    return absl::FailedPreconditionError(absl::StrCat("--recall_dir: the cache ", absl::GetFlag(FLAGS_cache),
                                                      " was saved without a recall store (prefill --recall_dir)"));
  }
  const LlamaConfig& mc = m.model->config();
  RecallStoreInfo info = RecallShape(mc, RecallFormat::kF16);  // (Open reads the format)
  info.model_fingerprint = ModelFingerprint(m.model->gguf());
  info.input_tokens = cache.input_tokens;
  if (!ParseDigest(config["recall_input_digest"], &info.input_digest) ||
      !ParseDigest(config["recall_plan_digest"], &info.plan_digest)) {
    return absl::DataLossError(absl::StrCat("the cache ", absl::GetFlag(FLAGS_cache), " records a bad recall digest"));
  }
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<RecallStore> store, RecallStore::Open(dir, info));
  store->SetConversions(RecallStore::BackendConversions(backend));
  RecallOptions options;
  options.budget = absl::GetFlag(FLAGS_recall);
  SNAPFILL_ASSIGN_OR_RETURN(const Selection select, ParseSelection(absl::GetFlag(FLAGS_select)));
  options.span = select == Selection::kSpan ? absl::GetFlag(FLAGS_span) : 0;
  options.original_positions = config.value("positions", "") == "original";
  SNAPFILL_ASSIGN_OR_RETURN(const QueryVotes votes, ParseQueryVotes(absl::GetFlag(FLAGS_query_votes)));
  options.max_weight = votes == QueryVotes::kMax;
  SNAPFILL_ASSIGN_OR_RETURN(options.summed, RecallRankSummed());
  Stopwatch watch;
  SNAPFILL_ASSIGN_OR_RETURN(const int64_t added,
                            RecallForQuestion(*m.model, backend, kv, start_pos, *store, question, options));
  std::fprintf(stderr, "recall: %lld entries per layer and KV head brought back from %s in %s (%s) in %.1f s\n",
               (long long)added, HumanBytes(store->bytes()).c_str(), dir.c_str(),
               RecallFormatName(store->info().format), watch.Seconds());
  return absl::OkStatus();
}

}  // namespace

absl::Status RunGenerate() {
  std::string prompt = absl::GetFlag(FLAGS_prompt);
  const std::string prompt_file = absl::GetFlag(FLAGS_prompt_file);
  if (!prompt.empty() && !prompt_file.empty()) {
    return absl::InvalidArgumentError("give either --prompt or --prompt-file, not both");
  }
  if (!prompt_file.empty()) {
    SNAPFILL_ASSIGN_OR_RETURN(prompt, ReadInput(prompt_file, "--prompt-file"));
  }
  if (prompt.empty()) {
    return absl::InvalidArgumentError("the prompt is empty: give --prompt TEXT or --prompt-file F");
  }
  const int64_t n = absl::GetFlag(FLAGS_n);
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("-n=", n, " must be >= 0"));
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  if (batch <= 0) return absl::InvalidArgumentError(absl::StrCat("--batch=", batch, " must be > 0"));
  SNAPFILL_ASSIGN_OR_RETURN(SamplingParams sampling, SamplingFromFlags());
  SNAPFILL_ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromFlags());
  SNAPFILL_ASSIGN_OR_RETURN(auto backend, BackendFromFlags(m.model.get()));
  GenerateOptions gopts;
  gopts.max_new_tokens = n;
  gopts.sampling = sampling;
  gopts.is_eog = [&](int32_t id) { return m.tokenizer->IsEndOfGeneration(id); };

  const std::string cache_path = absl::GetFlag(FLAGS_cache);
  std::vector<int32_t> ids;
  std::unique_ptr<KvCache> kv;
  int64_t start_pos = 0;
  if (!cache_path.empty()) {
    // The prompt continues the user turn that the cached document opened.
    SNAPFILL_ASSIGN_OR_RETURN(ids, BuildContinuation(*m.tokenizer, m.chat_template, prompt));
    // (Room for the entries a recall store brings back, too.)
    const int64_t recall = absl::GetFlag(FLAGS_recall_dir).empty() ? 0 : absl::GetFlag(FLAGS_recall);
    if (recall < 0) return absl::InvalidArgumentError(absl::StrCat("--recall=", recall, " must be >= 1"));
    SNAPFILL_ASSIGN_OR_RETURN(
        PromptCache cache,
        LoadCacheFile(cache_path, ModelFingerprint(m.model->gguf()),
                      static_cast<int64_t>(ids.size()) + n + recall));
    start_pos = cache.next_position;
    kv = std::move(cache.kv);
    if (const std::string dir = absl::GetFlag(FLAGS_recall_dir); !dir.empty()) {
      SNAPFILL_RETURN_IF_ERROR(RecallFromStore(m, backend.get(), cache, *kv, &start_pos, dir, ids));
    }
    if (absl::GetFlag(FLAGS_verbosity) >= 1) {
      std::fprintf(stderr, "cache %s: %lld input tokens, next position %lld, config %s\n",
                   cache_path.c_str(), (long long)cache.input_tokens, (long long)start_pos,
                   cache.config.c_str());
    }
  } else {
    std::string text = prompt;
    bool parse_special = false;
    if (m.chat_template.kind != ChatTemplateKind::kNone) {
      std::vector<ChatMessage> messages;
      if (!absl::GetFlag(FLAGS_system).empty()) {
        messages.push_back({"system", absl::GetFlag(FLAGS_system)});
      }
      messages.push_back({"user", prompt});
      text = ApplyChatTemplate(m.chat_template, messages, /*add_generation_prompt=*/true);
      parse_special = true;  // the template's own markers are special tokens
    }
    ids = m.tokenizer->Encode(text, /*add_special=*/true, parse_special);
    if (ids.empty()) return absl::InvalidArgumentError("the prompt encodes to no tokens");
    const int64_t capacity = static_cast<int64_t>(ids.size()) + n;
    if (capacity > m.model->config().context_length) {
      std::fprintf(stderr,
                   "snapfill: warning: %zu prompt + %lld new tokens exceed the model's training "
                   "context of %lld; quality will degrade (snapfill run compresses long inputs)\n",
                   ids.size(), (long long)n, (long long)m.model->config().context_length);
    }
    SNAPFILL_ASSIGN_OR_RETURN(kv, KvCache::Create({m.model->config().num_layers,
                                                   m.model->config().num_kv_heads,
                                                   m.model->config().head_dim, capacity}));
  }
  if (!backend->HostReachesBuffers()) {
    // On a device the cache goes there once, rather than over the bus at
    // every step.
    SNAPFILL_ASSIGN_OR_RETURN(kv, kv->CopyToBackend(backend.get()));
  }
  SNAPFILL_ASSIGN_OR_RETURN(auto forward, LlamaForward::Create(*m.model, backend.get(), batch));
  if (absl::GetFlag(FLAGS_verbosity) >= 1) {
    std::fprintf(stderr,
                 "model=%s threads=%d prompt_tokens=%zu n=%lld temp=%g top_k=%d top_p=%g seed=%llu "
                 "chat_template=%s batch=%lld kv=%s\n",
                 m.path.c_str(), backend->num_threads(), ids.size(), (long long)n,
                 sampling.temperature, sampling.top_k, sampling.top_p,
                 (unsigned long long)sampling.seed, ChatTemplateKindName(m.chat_template.kind),
                 (long long)batch, HumanBytes(kv->bytes()).c_str());
  }
  SNAPFILL_ASSIGN_OR_RETURN(GenerateResult r, Generate(*forward, *kv, start_pos, ids, gopts,
                                                       StreamTo(*m.tokenizer)));
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (absl::GetFlag(FLAGS_timing)) PrintTiming(r, "");
  const bool prefill = AttentionMostlyPrefill(start_pos, r.prompt_tokens, static_cast<int64_t>(r.tokens.size()));
  std::fprintf(stderr, "%s", ProfileReportWithPeaks(*backend, prefill).c_str());
  return absl::OkStatus();
}

}  // namespace snapfill::cli
