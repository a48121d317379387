// libFuzzer entry functions for snapfill's input parsers (issue 5).
//
// This module owns what each fuzz target feeds to the real code and which
// invariants it asserts on success. Each function takes arbitrary bytes,
// never aborts on bad input (a parser that refuses it with a Status is
// working as designed) and aborts with SNAPFILL_CHECK (file:line and the
// broken invariant) when the code accepts an input and then breaks a
// documented guarantee. They return 0 as libFuzzer requires.
//
// The same functions run in three places: the libFuzzer executables
// (tests/fuzz/*_fuzzer.cc, built with -DSNAPFILL_FUZZ=ON and clang), the
// regression test fuzz_regression_test (replays the seed corpus and every
// kept crash reproducer in the normal build and under ASan/UBSan), and
// tools/fuzz.sh which drives the fuzzers for a set time.
//
// Input formats (the first bytes steer the target; the rest is data):
//   gguf_reader       a whole GGUF file.
//   tokenizer         byte 0: bit0 add_special, bit1 parse_special,
//                     bit2 vocabulary (0: the tiny model's byte-level BPE,
//                     1: a small SentencePiece vocabulary); the rest is text.
//   cache_file        byte 0: bit0 = recompute the XXH3 trailer (so mutations
//                     reach the payload checks), bits 1..2 = extra_capacity;
//                     the rest is the file.
//   checkpoint_file   byte 0: bit0 = recompute the XXH3 trailer; the rest is
//                     the file.
//   schedule_planner  a ScheduleConfig decoded field by field (see
//                     DecodeScheduleConfig in fuzz_targets.cc), then
//                     retention ratios for AdaptiveBudgets.
#ifndef SNAPFILL_TESTS_FUZZ_FUZZ_TARGETS_H_
#define SNAPFILL_TESTS_FUZZ_FUZZ_TARGETS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace snapfill::fuzz {

int FuzzGgufReader(const uint8_t* data, size_t size);
int FuzzTokenizer(const uint8_t* data, size_t size);
int FuzzCacheFile(const uint8_t* data, size_t size);
int FuzzCheckpointFile(const uint8_t* data, size_t size);
int FuzzSchedulePlanner(const uint8_t* data, size_t size);

using FuzzFunction = int (*)(const uint8_t* data, size_t size);

struct FuzzTarget {
  const char* name;  // directory name under tests/fuzz/{corpus,regressions}/
  FuzzFunction function;
};

// All targets, in the order tools/fuzz.sh runs them.
std::span<const FuzzTarget> FuzzTargets();

// The verdict of the target's parser on `data` (GgufFile::FromBytes, then
// LlamaModel::Load for a file with token_embd.weight; ParseCacheFile;
// ParseCheckpointFile; PlanSchedule; OK for the tokenizer, whose Encode
// cannot fail), decoded as the entry function decodes it. The
// regression test uses it to tell accepted inputs from refused ones.
absl::Status ParseStatus(std::string_view target, const uint8_t* data, size_t size);

// One seed input: a file name and its bytes.
struct FuzzSeed {
  std::string name;
  std::string bytes;
};

// The seed corpus of `target` (a FuzzTarget name), built from the project's
// own writers (tiny GGUF builder, SaveCacheFile, SaveCheckpointFile) so the
// seeds are valid files the mutations start from. Empty for an unknown name.
// fuzz_regression_test writes them to tests/fuzz/corpus/<target>/ when
// SNAPFILL_WRITE_FUZZ_CORPUS=1.
std::vector<FuzzSeed> MakeSeeds(std::string_view target);

}  // namespace snapfill::fuzz

#endif  // SNAPFILL_TESTS_FUZZ_FUZZ_TARGETS_H_
