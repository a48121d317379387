// Flags of the snapfill command, shared by its subcommands. Defined in
// flags.cc; each subcommand lists the ones it reads (see commands.cc).
#ifndef SNAPFILL_TOOLS_CLI_FLAGS_H_
#define SNAPFILL_TOOLS_CLI_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"

// Model and machine.
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(int32_t, threads);
ABSL_DECLARE_FLAG(std::string, kernels);
ABSL_DECLARE_FLAG(bool, pack_decode);
ABSL_DECLARE_FLAG(bool, decode_kv_f16);
// Prompt and sampling.
ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(std::string, prompt_file);
ABSL_DECLARE_FLAG(int64_t, n);
ABSL_DECLARE_FLAG(double, temp);
ABSL_DECLARE_FLAG(int32_t, top_k);
ABSL_DECLARE_FLAG(double, top_p);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, chat_template);
ABSL_DECLARE_FLAG(std::string, system);
ABSL_DECLARE_FLAG(int64_t, batch);
// Long inputs: schedule and pruner.
ABSL_DECLARE_FLAG(std::string, input);
ABSL_DECLARE_FLAG(std::string, question);
ABSL_DECLARE_FLAG(std::string, schedule);
ABSL_DECLARE_FLAG(std::string, growth);
ABSL_DECLARE_FLAG(int64_t, memory);
ABSL_DECLARE_FLAG(int64_t, chunk);
ABSL_DECLARE_FLAG(int64_t, first_memory);
ABSL_DECLARE_FLAG(int64_t, window);
ABSL_DECLARE_FLAG(int64_t, pool_kernel);
ABSL_DECLARE_FLAG(std::string, pooling);
ABSL_DECLARE_FLAG(bool, query_aware);
ABSL_DECLARE_FLAG(double, query_share);
ABSL_DECLARE_FLAG(int64_t, repeat_stride);
ABSL_DECLARE_FLAG(int64_t, score_span);
ABSL_DECLARE_FLAG(std::string, gates);
ABSL_DECLARE_FLAG(int64_t, seq_len);
ABSL_DECLARE_FLAG(int64_t, max_sequences);
ABSL_DECLARE_FLAG(double, tau);
ABSL_DECLARE_FLAG(int64_t, hidden);
ABSL_DECLARE_FLAG(int64_t, epochs);
ABSL_DECLARE_FLAG(std::string, compare_hidden);
ABSL_DECLARE_FLAG(std::string, repeat_prompt);
ABSL_DECLARE_FLAG(std::string, recall_dir);
ABSL_DECLARE_FLAG(int64_t, recall);
ABSL_DECLARE_FLAG(std::string, recall_format);
ABSL_DECLARE_FLAG(std::string, recall_rank);
ABSL_DECLARE_FLAG(std::string, select);
ABSL_DECLARE_FLAG(int64_t, span);
ABSL_DECLARE_FLAG(std::string, query_heads);
ABSL_DECLARE_FLAG(std::string, query_votes);
ABSL_DECLARE_FLAG(std::string, pruner);
ABSL_DECLARE_FLAG(int64_t, sinks);
ABSL_DECLARE_FLAG(bool, keep_last_chunk);
ABSL_DECLARE_FLAG(bool, original_positions);
ABSL_DECLARE_FLAG(bool, dry_run);
ABSL_DECLARE_FLAG(std::string, max_memory);
// Checkpoints.
ABSL_DECLARE_FLAG(std::string, checkpoint);
ABSL_DECLARE_FLAG(int64_t, checkpoint_every);
ABSL_DECLARE_FLAG(bool, resume);
// Benchmarks.
ABSL_DECLARE_FLAG(std::string, report);
ABSL_DECLARE_FLAG(bool, ignore_eos);
ABSL_DECLARE_FLAG(std::string, schedules);
ABSL_DECLARE_FLAG(int64_t, imdc_chunk);
ABSL_DECLARE_FLAG(int32_t, repetitions);
ABSL_DECLARE_FLAG(int64_t, full_tokens);
// Outputs and reporting.
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, cache);
ABSL_DECLARE_FLAG(bool, force);
ABSL_DECLARE_FLAG(std::string, telemetry);
ABSL_DECLARE_FLAG(bool, progress);
ABSL_DECLARE_FLAG(bool, timing);
ABSL_DECLARE_FLAG(bool, profile);
ABSL_DECLARE_FLAG(int32_t, verbosity);
// Quality harness: ppl, needle, plot.
ABSL_DECLARE_FLAG(std::string, json);
ABSL_DECLARE_FLAG(int64_t, max_tokens);
ABSL_DECLARE_FLAG(std::string, spool_dir);
ABSL_DECLARE_FLAG(std::string, manifest);
ABSL_DECLARE_FLAG(std::string, shard);
ABSL_DECLARE_FLAG(bool, guided);
ABSL_DECLARE_FLAG(std::string, cache_dir);
ABSL_DECLARE_FLAG(std::string, checkpoint_dir);
ABSL_DECLARE_FLAG(bool, ids);
ABSL_DECLARE_FLAG(bool, pieces);
ABSL_DECLARE_FLAG(bool, parse_special);
ABSL_DECLARE_FLAG(bool, add_special);
ABSL_DECLARE_FLAG(int64_t, spool_after);
ABSL_DECLARE_FLAG(std::string, lengths);
ABSL_DECLARE_FLAG(std::string, depths);
ABSL_DECLARE_FLAG(std::string, tasks);
ABSL_DECLARE_FLAG(int32_t, seeds);
ABSL_DECLARE_FLAG(int32_t, first_seed);
ABSL_DECLARE_FLAG(bool, baseline);
ABSL_DECLARE_FLAG(std::string, png);
ABSL_DECLARE_FLAG(std::string, ppl);
ABSL_DECLARE_FLAG(std::string, needle);
ABSL_DECLARE_FLAG(std::string, out_dir);

namespace snapfill::cli {

// Whether the user gave --name (or --noname) on the command line: the
// command's main records the names it checked before parsing (Abseil of
// this version keeps its own record internal).
void RecordGivenFlags(const std::vector<std::string>& names);
bool FlagGiven(const std::string& name);

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_FLAGS_H_
