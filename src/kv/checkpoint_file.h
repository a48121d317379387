// The prefill checkpoint: the state of a chunk loop stopped between two
// steps, written by `--checkpoint FILE` every `--checkpoint_every` chunks
// and on SIGINT/SIGTERM, and read back by `--resume`.
//
// The file is the KV container of cache_file.h with the magic
// "SNAPFILL-CK\0" (so neither kind of file is mistaken for the other) and:
//   fingerprint    ModelFingerprint() of the model
//   text block     "snapfill-checkpoint 1\n" then one "key=value" line each:
//                    config=<the run configuration, one line>
//                    input_digest=<16 hex digits: XXH3-64 of the token ids>
//                    plan_digest=<16 hex digits: PrefillEngine::plan_digest()>
//                    threads=<threads of the run that wrote it>
//                    steps_done=<chunks read>
//                    total_steps=<chunks in the plan>
//                    retention=<one C99 hex float per layer, comma-separated>
//                    recall_slots=<entries per layer in the recall store,
//                                  comma-separated; only with --recall_dir>
//   next_position  the input position of the next chunk's first token
//   input_tokens   the input's length in tokens
//   payload        the memory of every layer: keys before RoPE, values and
//                  original positions
// Hex floats round-trip exactly, so a resumed run continues bit for bit.
//
// Parsing applies every check of the cache file (truncation, counts against
// the file size before allocation, XXH3 trailer) and then the text block's:
// every key present once, numbers in range, one retention value in [0, 1]
// per layer, 1 <= steps_done < total_steps, next_position <= input_tokens.
// Whether the checkpoint fits the run being resumed (same model, input,
// configuration, plan) is the caller's check (CheckpointMismatch).
#ifndef SNAPFILL_KV_CHECKPOINT_FILE_H_
#define SNAPFILL_KV_CHECKPOINT_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/kv/kv_cache.h"

namespace snapfill {

inline constexpr char kCheckpointFileMagic[12] = {'S', 'N', 'A', 'P', 'F', 'I',
                                                  'L', 'L', '-', 'C', 'K', '\0'};
inline constexpr uint32_t kCheckpointFileVersion = 2;

struct CheckpointState {
  std::string model_fingerprint;
  std::string kernels;        // Backend::kernels() of the run that wrote it (a record; a
                              // resume on others only warns, as for threads)
  std::string config;         // one line; compared verbatim on resume
  uint64_t input_digest = 0;  // XXH3-64 of the input's token ids
  int64_t input_tokens = 0;
  uint64_t plan_digest = 0;
  int32_t threads = 0;
  int64_t steps_done = 0;
  int64_t total_steps = 0;
  int64_t next_token = 0;  // input position of the next chunk's first token
  std::vector<double> retention;  // [num_layers]
  // [num_layers] slots of the recall store when the checkpoint was saved
  // (RecallStore::Reopen cuts back to them); empty without one.
  std::vector<int64_t> recall_slots;
};

struct PrefillCheckpoint {
  CheckpointState state;
  std::unique_ptr<KvCache> memory;  // keys before RoPE
};

// XXH3-64 of the token ids, as stored in input_digest.
uint64_t TokenDigest(const int32_t* tokens, size_t n);

// Writes the checkpoint atomically, replacing an older one at `path`:
// after a crash at any moment the file is the previous checkpoint or the
// new one. InvalidArgument for a state the reader would refuse.
absl::Status SaveCheckpointFile(const std::string& path, const CheckpointState& state,
                                const KvCache& memory);

absl::StatusOr<PrefillCheckpoint> LoadCheckpointFile(const std::string& path);
// The same over bytes in memory (tests and fuzzers); `name` stands for the
// path in messages.
absl::StatusOr<PrefillCheckpoint> ParseCheckpointFile(std::string_view bytes,
                                                      std::string_view name);

// Why `saved` cannot be resumed by a run whose own state is `run` (model,
// input, configuration, plan, in that order), as FailedPrecondition naming
// both values; OK if it can. A different thread count is allowed (the
// result is then equal to rounding, not bit for bit) and reported through
// `warning`.
absl::Status CheckpointMismatch(const CheckpointState& saved, const CheckpointState& run,
                                std::string_view path, std::string* warning);

}  // namespace snapfill

#endif  // SNAPFILL_KV_CHECKPOINT_FILE_H_
