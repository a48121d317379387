#include "tools/cli/flags.h"

#include <set>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, model, "",
          "Path of a GGUF model (llama, mistral, qwen2, qwen3, gemma3). Default: $SNAPFILL_MODEL, else "
          "models/SmolLM2-135M-Instruct.Q4_1.gguf. A model without a chat template (Gemma 3 270M, "
          "tools/fetch_model.sh gemma3-270m, is a pretrained one) continues the text plainly");
ABSL_FLAG(std::string, device, "auto",
          "cpu | cuda | auto: where the model runs (auto: the GPU where one can be used, else the CPU)");
ABSL_FLAG(int32_t, threads, 0, "CPU threads; 0 = all cores");
ABSL_FLAG(std::string, kernels, "auto",
          "CPU kernels: auto (the prefill attention's and the products' implementations timed here, the "
          "fastest taken; the rates are kept in $XDG_CACHE_HOME/snapfill or ~/.cache/snapfill), flags "
          "(chosen by the CPU's flags alone), or attention=f32|avx512-bf16|amx-bf16|auto and/or "
          "products=amx-bf16|amx-int8|avx512-vnni|avx-vnni|avx2|auto, comma-separated (an op not named is "
          "timed). --resume takes the checkpoint's unless this is given. On cuda only attention=f32 is a choice: "
          "the chunk's attention on the f32 kernel instead of tensor cores");
ABSL_FLAG(bool, pack_decode, true,
          "Rewrite each Q4_0/Q4_1/Q8_0 weight matrix once into a layout the one-token products "
          "stream at memory speed, when decoding starts (faster decode; the copy takes the place "
          "of the model file's pages in memory). With AVX-512 the Q4_0/Q4_1 copies are made "
          "before the first batch instead, and prefill's products read them rather than "
          "repacking the rows on every call. false: every product reads the file's rows");
ABSL_FLAG(bool, decode_kv_f16, true,
          "Decode: attention reads the KV cache in fp16, as llama.cpp's default f16 cache holds "
          "it: half the attention's bytes per step (a full 8K cache: 25-50% faster decode, a "
          "compressed one about 10%). The fp16 entries replace the f32 ones when decoding starts, so "
          "decoding holds less memory, not more; a later batch widens them back (their values "
          "rounded to fp16). false: decode reads the f32 entries");

ABSL_FLAG(std::string, prompt, "", "Prompt text");
ABSL_FLAG(std::string, prompt_file, "", "Read the prompt from this file (- for stdin)");
ABSL_FLAG(int64_t, n, 64, "Number of tokens to generate");
ABSL_FLAG(double, temp, 0.0, "Sampling temperature; 0 = greedy");
ABSL_FLAG(int32_t, top_k, 40, "Keep the k most likely tokens; 0 = all");
ABSL_FLAG(double, top_p, 0.95, "Nucleus sampling: keep tokens up to this cumulative probability");
ABSL_FLAG(uint64_t, seed, 0, "Random seed for sampling");
ABSL_FLAG(std::string, chat_template, "auto",
          "auto (the model's own, if it has one) | none | chatml | llama2 | llama2-sys | llama3 | "
          "zephyr");
ABSL_FLAG(std::string, system, "", "System message for the chat template (default: the template's)");
ABSL_FLAG(int64_t, batch, 512, "Tokens per forward batch when a prompt is read in full");

ABSL_FLAG(std::string, input, "", "The long input: a text file (- for stdin)");
ABSL_FLAG(std::string, question, "",
          "Question appended after the input, so that the final window is the question");
ABSL_FLAG(bool, query_aware, true,
          "With a question: compress every chunk by the question's votes (its tokens run after "
          "each chunk, vote, and are dropped), not by the chunk's own last tokens alone; "
          "=false reads the question only at the end (with --recall_dir, after the input: it brings "
          "back what it attends to most from the store, then is read, as prefill --recall_dir and "
          "generate --cache --recall_dir do)");
ABSL_FLAG(double, query_share, 1.0,
          "Question-guided compression: share of each chunk's picks made by the question's "
          "votes; the rest by the chunk's own window (SnapKV). 0.5 found a prose fact in 32% of "
          "trials at 32K-128K tokens against 23% (docs/RESULTS.md), and lost the main job's at 1M");
ABSL_FLAG(std::string, select, "span",
          "Question-guided compression: the question picks single tokens (token) or spans "
          "around its strongest votes (span), so that a kept fact keeps all its tokens");
ABSL_FLAG(int64_t, span, 32, "--select=span: tokens per span around each picked peak");
ABSL_FLAG(std::string, query_heads, "each",
          "Question-guided compression: the question's votes summed over each layer's KV heads, "
          "so every head keeps what any found (shared), or each head by its own (each)");
ABSL_FLAG(std::string, query_votes, "sum",
          "Question-guided compression and recall: an entry's vote is the question's tokens' "
          "attention to it summed (sum), or the largest any one of them gives it (max), so that "
          "what one token (a name) attends to strongly ranks with what all attend to a little");
ABSL_FLAG(std::string, recall_dir, "",
          "The recall tier: keep every evicted entry in a store in this directory (absent or "
          "empty; removed at the end), and bring back what the question attends to most");
ABSL_FLAG(int64_t, recall, 256,
          "--recall_dir: entries per layer and KV head the question brings back, beside the memory");
ABSL_FLAG(std::string, recall_rank, "summed",
          "A recall after the compression (generate --cache, or a question that did not guide it): "
          "every layer brings back the input positions the question attends to most over all layers "
          "and KV heads, each head's attention squared and summed (summed; finds a needle at 1M "
          "tokens), or each layer and KV head its own best (heads)");
ABSL_FLAG(std::string, recall_format, "q8",
          "--recall_dir: how the store keeps keys and values: q8 (8 bits and a scale per vector; finds "
          "the needles f16 finds, in half the disk) or f16 (exact to fp16)");
ABSL_FLAG(std::string, schedule, "imdc",
          "Size schedule: fm (fixed memory) | im (incremental memory) | imdc (incremental "
          "memory, decremental chunk)");
ABSL_FLAG(std::string, growth, "linear",
          "Memory growth for im/imdc: linear | sqrt | square | square_sqrt | adaptive");
ABSL_FLAG(int64_t, memory, 1024, "Final memory m_max: KV entries kept per layer and KV head");
ABSL_FLAG(int64_t, chunk, 1024, "Chunk size c in tokens (the average chunk for imdc)");
ABSL_FLAG(int64_t, first_memory, 0, "First memory m0 for im/imdc; 0 = max(window, memory / chunks)");
ABSL_FLAG(int64_t, window, 32, "SnapKV observation window: the last w queries of a chunk vote");
ABSL_FLAG(int64_t, pool_kernel, 7, "SnapKV pooling kernel over the votes (odd; 1 = none)");
ABSL_FLAG(std::string, pooling, "avg", "SnapKV pooling: avg | max");
ABSL_FLAG(std::string, pruner, "auto",
          "What the memory keeps: auto | snapkv | gate | reconstruct | streaming (sinks + most recent) | full "
          "(everything). gate: the entries SmartKV's gates predict to live longest; reconstruct: what the model "
          "attends to when asked to repeat each chunk (neither needs the question). auto: snapkv where a question "
          "guides the compression, else gate where the model's gates are found (--gates, or the model's path with "
          ".gates for .gguf), else snapkv");
ABSL_FLAG(std::string, gates, "",
          "--pruner=gate: the gate file (snapfill train-gate; tools/train_gates.sh makes the default model's); "
          "default: the model's path with .gates for .gguf");
ABSL_FLAG(int64_t, seq_len, 1024, "train-gate: tokens per training sequence (at most the model's context)");
ABSL_FLAG(int64_t, max_sequences, 48, "train-gate: training sequences taken from the inputs, spread over them");
ABSL_FLAG(double, tau, 2.0,
          "train-gate: an entry is attended while its weight exceeds tau times uniform attention's");
ABSL_FLAG(int64_t, hidden, 8, "train-gate: hidden units of each gate (8, 16 and 32 fitted as well as each other, 128 and 256 worse: docs/RESULTS.md)");
ABSL_FLAG(int64_t, epochs, 30, "train-gate: passes over the training samples");
ABSL_FLAG(std::string, compare_hidden, "",
          "train-gate: also fit gates of these hidden sizes (e.g. 8,128) on the same samples and print "
          "their held-out error beside --hidden's (only --hidden's are saved)");
ABSL_FLAG(int64_t, score_span, 8,
          "--pruner=gate|reconstruct: keep spans of this many entries around the highest scores "
          "(1: single entries)");
ABSL_FLAG(int64_t, repeat_stride, 1,
          "--pruner=reconstruct: repeat every k-th token of each chunk (1: all; 2: the cheaper "
          "variant, half the extra rows)");
ABSL_FLAG(std::string, repeat_prompt, "Repeat the previous text exactly.",
          "--pruner=reconstruct: the request that precedes each chunk's repetition (inside the chat "
          "template's user turn)");
ABSL_FLAG(int64_t, sinks, 4,
          "Always keep the first s input tokens (attention sinks), outside the memory budget; "
          "without them a small memory loses the sink and the loss jumps (docs/RESULTS.md)");
ABSL_FLAG(bool, keep_last_chunk, true,
          "Where the question is read after the prefill (prefill; run, needle and an unguided batch "
          "document with a question that does not guide): the last step keeps its chunk whole beside "
          "the memory, so the question reads the input's end uncompressed, as a question in the "
          "prompt does (the final cache grows by the last chunk, at most --chunk entries)");
ABSL_FLAG(bool, original_positions, false,
          "Rotate memory at its original input positions instead of re-encoding 0..m+c");
ABSL_FLAG(bool, dry_run, false,
          "Print the plan (chunk and memory per step) and the predicted peak memory, and exit");
ABSL_FLAG(std::string, max_memory, "",
          "Peak resident memory to stay within, e.g. 800M or 1.5G: picks the largest --memory "
          "and --chunk (those not given) whose predicted peak fits, or refuses before starting");
ABSL_FLAG(std::string, checkpoint, "",
          "Save the prefill's state to this file every --checkpoint_every chunks and on "
          "SIGINT/SIGTERM (atomically); removed when the prefill completes");
ABSL_FLAG(int64_t, checkpoint_every, 50, "Chunks between two checkpoints (with --checkpoint or --checkpoint_dir)");
ABSL_FLAG(bool, resume, false,
          "Continue from --checkpoint: same model, input and settings; the result is bit for "
          "bit that of an uninterrupted run with the same --threads. batch: give only the answers "
          "--out lacks. needle: run only the trials the grid in --json lacks");

ABSL_FLAG(std::string, out, "",
          "prefill: file to save the compressed cache to; batch: the answers, a JSON line each");
ABSL_FLAG(std::string, cache, "", "generate: answer from a cache file saved by snapfill prefill");
ABSL_FLAG(bool, force, false, "Overwrite an output file that exists");
ABSL_FLAG(std::string, telemetry, "",
          "Write one JSON record per step to this file (plot: read these files, comma-separated)");
ABSL_FLAG(bool, progress, true, "Show a progress line on stderr during long prefills");
ABSL_FLAG(bool, timing, true, "Print TTFT, tokens/s and peak memory to stderr");
ABSL_FLAG(bool, profile, false, "Time every backend operation and print a table at the end");
ABSL_FLAG(int32_t, verbosity, 0, "0: results only; 1: also the resolved configuration");

ABSL_FLAG(std::string, json, "",
          "ppl, needle, bench: write the results as JSON to this file (needle: after every trial, so "
          "that --resume can continue the grid)");
ABSL_FLAG(std::string, manifest, "",
          "batch: the documents, a JSON line each: {\"id\", \"input\", \"questions\": [...] or \"task\": "
          "\"summarize\"; optional sha256, schedule, memory, chunk, n, seed, guided}");
ABSL_FLAG(std::string, shard, "",
          "batch: i/N, this process's share of the documents (split by size); default: the Slurm array "
          "task (SLURM_ARRAY_TASK_ID of _COUNT, or of _MIN.._MAX), else all");
ABSL_FLAG(std::string, cache_dir, "",
          "batch: keep each document's compressed cache as DIR/ID.kv, for later generate --cache questions");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "batch: save the prefill in progress as DIR/ID.ck (a guided document's: DIR/ID.q<k>.ck, its k-th "
          "question's) every --checkpoint_every chunks and on SIGINT/SIGTERM; --resume goes on from it; "
          "removed once its answers are written");
ABSL_FLAG(bool, guided, false,
          "batch: each question guides its document's compression (a prefill per question); else one "
          "prefill serves all of a document's questions");
ABSL_FLAG(bool, ids, false, "tokenize: print the ids as one list, [1, 2, 3]");
ABSL_FLAG(bool, pieces, false, "tokenize: print each token's text on a line of its own");
ABSL_FLAG(bool, parse_special, false,
          "tokenize: special-token texts in the text (<|im_start|>) become their ids; else they are text");
ABSL_FLAG(bool, add_special, true, "tokenize: BOS (and EOS) where the vocabulary adds them");
ABSL_FLAG(std::string, spool_dir, "",
          "Where the input's token ids go once they pass --spool_after: a temporary file, unlinked "
          "as it is made. Default: $TMPDIR, else /tmp");
ABSL_FLAG(int64_t, spool_after, int64_t{1} << 22,
          "Token ids kept in memory (4 bytes each) before they go to a file in --spool_dir");
ABSL_FLAG(int64_t, max_tokens, 0,
          "Read only the first N tokens of the input (ppl: score them); 0 = all");
ABSL_FLAG(std::string, report, "",
          "run: write TTFT, prefill and decode times, peak RSS and the profile as JSON here");
ABSL_FLAG(bool, ignore_eos, false, "run: generate exactly -n tokens, past end-of-generation");
ABSL_FLAG(std::string, lengths, "1024,2048,4096",
          "needle: input lengths in tokens (prompt, needle and question included), comma-separated");
ABSL_FLAG(std::string, depths, "0,0.25,0.5,0.75,1",
          "needle: needle depths in [0, 1] (0 = start of the text, 1 = just before the question)");
ABSL_FLAG(std::string, tasks, "passkey",
          "needle: the retrieval tasks, comma-separated: passkey (one special magic number), "
          "multikey (4 names' numbers, one asked), multivalue (4 numbers of one name, all "
          "asked), vartrack (the variables a chain of 5 assignments gives a value, beside a "
          "distractor chain), fact (a fact in a prose sentence, asked about)");
ABSL_FLAG(int32_t, seeds, 3,
          "needle: trials per cell, each with its own key and haystack offset");
ABSL_FLAG(int32_t, first_seed, 0,
          "needle: run the trials from this one of the --seeds on (the same keys and offsets as in the "
          "whole grid), to split a long grid over several runs");
ABSL_FLAG(bool, baseline, true,
          "needle: also run full attention in one pass where the length fits the model's context");
ABSL_FLAG(std::string, png, "",
          "needle: the accuracy heat map; bench: TTFT and peak memory per schedule; as a PNG "
          "(needs gnuplot)");
ABSL_FLAG(std::string, ppl, "",
          "plot: ppl JSON files (comma-separated) whose loss per chunk to overlay");
ABSL_FLAG(std::string, needle, "", "plot: a needle JSON file to draw as a heat map");
ABSL_FLAG(std::string, out_dir, "plots", "plot: folder to write the PNGs into");

ABSL_FLAG(std::string, schedules, "fm,im:linear,im:sqrt,im:square,im:square_sqrt,im:adaptive,imdc",
          "bench: the schedules to compare, schedule[:growth][@chunk] separated by commas; each "
          "is compared with the FM run of its chunk (added as fm@CHUNK where the list has fm at "
          "another chunk; a list without fm runs no comparison)");
ABSL_FLAG(int64_t, imdc_chunk, 0,
          "bench: the chunk for imdc (IMDC's last chunks shrink; it needs a chunk above about "
          "(memory - first memory) / 2); 0 = --chunk");
ABSL_FLAG(int32_t, repetitions, 3, "bench: runs of each configuration (the median is reported)");
ABSL_FLAG(int64_t, full_tokens, 8192,
          "bench: decode over a full cache of this many tokens as the reference (0 = skip)");

namespace snapfill::cli {
namespace {

std::set<std::string>& Given() {
  static std::set<std::string> given;
  return given;
}

}  // namespace

void RecordGivenFlags(const std::vector<std::string>& names) { Given().insert(names.begin(), names.end()); }

bool FlagGiven(const std::string& name) { return Given().count(name) > 0; }

}  // namespace snapfill::cli
