#include "tools/cli/commands.h"

#include <initializer_list>
#include <vector>

namespace snapfill::cli {

namespace {

using Flags = std::vector<const char*>;

// The flag groups, each declared once; a command lists the groups it reads.
const Flags kLongInput = {"input", "max_tokens", "spool_dir", "spool_after"};
const Flags kQuestionGuided = {"query_aware", "query_share", "select", "span", "query_heads", "query_votes"};
const Flags kRecall = {"recall_dir", "recall", "recall_format", "recall_rank"};
const Flags kSchedule = {"schedule", "growth", "memory", "chunk", "first_memory", "window", "pool_kernel",
                         "pooling", "pruner", "sinks", "original_positions", "repeat_stride", "repeat_prompt",
                         "gates", "score_span"};
const Flags kSampling = {"n", "temp", "top_k", "top_p", "seed"};
const Flags kPrompt = {"chat_template", "system"};
const Flags kMachine = {"model", "device", "threads", "kernels", "pack_decode"};
const Flags kLongRun = {"telemetry", "progress", "dry_run", "max_memory", "checkpoint", "checkpoint_every",
                        "resume"};

// The groups and single flags, in --help order.
Flags Join(std::initializer_list<Flags> parts) {
  Flags all;
  for (const Flags& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

}  // namespace

const std::vector<Command>& Commands() {
  static const std::vector<Command> kCommands = {
      {"run",
       "Read a long input chunk by chunk into a compressed KV cache (guided by --question where one is "
       "given, under an FM, IM or IMDC schedule), then answer --question or continue the text.",
       Join({kLongInput, {"question"}, kQuestionGuided, kRecall, kSchedule, {"keep_last_chunk"}, kSampling, kPrompt,
             kMachine, {"decode_kv_f16"}, kLongRun,
             {"force", "report", "ignore_eos", "timing", "profile", "verbosity"}}),
       &RunRun},
      {"prefill",
       "Read a long input into a compressed KV cache and save it (--out) for snapfill generate "
       "--cache.",
       Join({kLongInput, {"out", "force", "recall_dir", "recall_format"}, kSchedule, {"keep_last_chunk"}, kPrompt,
             kMachine, kLongRun, {"timing", "profile", "verbosity"}}),
       &RunPrefill},
      {"generate",
       "Generate text from a prompt, or from a saved cache (--cache), streaming it to stdout.",
       Join({{"prompt", "prompt_file", "cache", "recall_dir", "recall", "recall_rank", "select", "span", "query_votes"}, kSampling, kPrompt, kMachine,
             {"decode_kv_f16", "batch", "timing", "profile", "verbosity"}}),
       &RunGenerate},
      {"batch",
       "Many documents through one loaded model: a manifest (JSONL) of documents and their questions in, "
       "an answer per JSON line out, flushed as each comes; --resume goes on where a job stopped, --shard "
       "(or a Slurm array) takes a share split by size; under mpirun the ranks take the documents as they "
       "become free and rank 0 merges their answers into --out.",
       Join({{"manifest", "out", "resume", "force", "shard", "guided", "cache_dir", "checkpoint_dir", "checkpoint_every",
              "schedule", "memory", "chunk", "window",
              "pruner", "repeat_stride", "repeat_prompt", "gates", "score_span", "original_positions",
              "keep_last_chunk", "spool_dir",
              "spool_after"},
             kRecall, kSampling, kPrompt, kMachine, {"verbosity"}}),
       &RunBatch},
      {"tokenize",
       "Print a model's token ids for a text (--prompt, or --input streamed from a file of any size), "
       "as llama.cpp's llama-tokenize does: the text as given, special tokens only with --parse_special.",
       {"model", "prompt", "input", "ids", "pieces", "parse_special", "add_special", "verbosity"},
       &RunTokenize},
      {"info", "Print a model's architecture, tensor types, sizes and context.",
       {"model", "device", "kernels", "verbosity"},
       &RunInfo},
      {"ppl",
       "Loss and perplexity of a text read chunk by chunk: every token scored once, given the "
       "memory and chunk before it (--pruner full: the full-attention baseline).",
       Join({kLongInput, {"json"}, kSchedule, kMachine, {"telemetry", "progress", "verbosity"}}),
       &RunPpl},
      {"needle",
       "Needle-in-a-haystack grid: input length x needle depth x task (passkey and RULER's "
       "retrieval tasks), random values per trial, accuracy of the greedy answer; beside full "
       "attention where the input fits.",
       Join({{"input", "tasks", "lengths", "depths", "seeds", "first_seed", "baseline", "json", "resume", "png"},
             kQuestionGuided, kRecall, kSchedule, {"keep_last_chunk"}, kPrompt, kMachine,
             {"decode_kv_f16", "batch", "progress", "verbosity"}}),
       &RunNeedle},
      {"plot",
       "PNG figures with gnuplot: memory and chunk per step, memory origin and retention per "
       "layer (from --telemetry JSONL files), loss per chunk (--ppl JSON files), needle heat "
       "map (--needle JSON).",
       {"telemetry", "ppl", "needle", "out_dir"},
       &RunPlot},
      {"bench",
       "TTFT and peak memory of each schedule on one input (each run in its own process, with "
       "repetitions), the measured speed-ups beside the IMDC paper's eq. 4, and decoding from "
       "the compressed cache against a full cache; a table, --json and a --png chart.",
       Join({kLongInput, {"schedules", "memory", "chunk", "imdc_chunk", "window", "pruner", "gates", "repeat_stride",
                          "score_span", "repetitions",
                          "full_tokens", "n", "question"},
             kMachine, {"decode_kv_f16", "json", "png"}}),
       &RunBench},
      {"train-gate",
       "Train SmartKV's gates for --pruner=gate: runs texts (--input, comma-separated files) through the "
       "model with full attention, records how long each KV entry is attended, and fits a small MLP per "
       "layer and KV head on the keys before RoPE; prints the held-out error per layer and writes --out.",
       {"model", "input", "out", "force", "seq_len", "max_sequences", "tau", "hidden", "epochs", "compare_hidden",
        "seed", "threads", "verbosity"},
       &RunTrainGate},
  };
  return kCommands;
}

}  // namespace snapfill::cli
