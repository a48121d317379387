// Checkpoint and resume at the engine level: a run restored from the state
// saved after any step (through the checkpoint file) ends with the same
// memory and logits, bit for bit, as a run never stopped; and
// PrefillEngine::Footprint() predicts exactly what Create() allocates.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "snapfill/engine.h"
#include "src/compress/gate.h"
#include "src/engine/recall.h"
#include "src/gguf/fingerprint.h"
#include "src/kv/checkpoint_file.h"
#include "src/kv/kv_cache.h"
#include "src/kv/recall_store.h"
#include "src/model/llama_forward.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"

namespace snapfill {
namespace {

struct Case {
  const char* name;
  ScheduleKind kind;
  Growth growth;
  PrunerKind pruner;
  int64_t memory, chunk;
  int64_t repeat_stride = 1;
  // A hybrid model (testing::TinyHybridOptions: sliding-window layers, whose
  // rings the checkpoint carries beside the global layers' memories).
  bool hybrid = false;
  // The stopped and the resumed run on a backend whose buffers the host
  // cannot reach (BackendOptions::guard_buffers: the engine's memory then
  // lives in them, as on a device), the uninterrupted one on a plain one.
  bool guard = false;
};

class ResumeTest : public ::testing::TestWithParam<Case> {};

// Byte equality of two memories over their valid entries (wherever their
// keys and values live).
void ExpectSameMemory(const KvCache& a, const KvCache& b) {
  ASSERT_EQ(a.shape().num_layers, b.shape().num_layers);
  const int64_t d = a.shape().head_dim;
  for (int64_t l = 0; l < a.shape().num_layers; ++l) {
    ASSERT_EQ(a.size(l), b.size(l)) << "layer " << l;
    for (int64_t h = 0; h < a.shape().num_kv_heads; ++h) {
      const int64_t n = a.size(l);
      std::vector<float> ak(n * d), av(n * d), bk(n * d), bv(n * d);
      SNAPFILL_ASSERT_OK(a.CopyOut(l, h, n, ak.data(), av.data()));
      SNAPFILL_ASSERT_OK(b.CopyOut(l, h, n, bk.data(), bv.data()));
      EXPECT_EQ(std::memcmp(ak.data(), bk.data(), n * d * sizeof(float)), 0) << l << "/" << h;
      EXPECT_EQ(std::memcmp(av.data(), bv.data(), n * d * sizeof(float)), 0) << l << "/" << h;
      EXPECT_EQ(std::memcmp(a.pos(l, h), b.pos(l, h), n * sizeof(int32_t)), 0) << l << "/" << h;
      ASSERT_EQ(a.has_scores(), b.has_scores());
      if (a.has_scores()) {
        EXPECT_EQ(std::memcmp(a.score(l, h), b.score(l, h), n * sizeof(float)), 0) << l << "/" << h;
      }
    }
  }
}

TEST_P(ResumeTest, ResumedRunEqualsUninterrupted) {
  const Case& c = GetParam();
  TinyLlamaOptions opts;
  opts.num_layers = 3;
  opts.context_length = 4096;
  if (c.hybrid) opts = testing::TinyHybridOptions(40);
  auto model = testing::LoadTinyModel(opts);
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  BackendOptions guarded;
  guarded.guard_buffers = c.guard;
  auto stopping = CreateBackend(Device::kCpu, guarded);
  SNAPFILL_ASSERT_OK(stopping);
  const auto ids = testing::TestTokens(700, model->config().vocab_size);
  PrefillConfig config;
  config.schedule.kind = c.kind;
  config.schedule.growth = c.growth;
  config.schedule.memory = c.memory;
  config.schedule.chunk = c.chunk;
  config.schedule.window = 8;
  config.pruner.kind = c.pruner;
  config.pruner.repeat_stride = c.repeat_stride;
  // Context reconstruction's entries carry the score their chunk's
  // repetition gave them: the checkpoint must too, or the resumed run
  // would rank the older memory differently.
  if (c.pruner == PrunerKind::kReconstruct) config.repeat_prompt = {5, 9, 2, 11};
  // Gates with random weights, so that entries are ranked apart.
  GateModel gates = GateModel::Create(opts.num_layers, model->config().num_kv_heads, model->config().head_dim, 8).value();
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t l = 0; l < opts.num_layers; ++l) {
    for (int64_t h = 0; h < model->config().num_kv_heads; ++h) {
      for (float& x : gates.params(l, h).w1) x = dist(rng);
      for (float& x : gates.params(l, h).w2) x = dist(rng);
    }
  }
  if (c.pruner == PrunerKind::kGate) config.gate = &gates;

  auto whole = PrefillEngine::Create(*model, backend->get(), config, ids.size());
  SNAPFILL_ASSERT_OK(whole);
  SNAPFILL_ASSERT_OK((*whole)->Run(ids, nullptr));
  const int64_t steps = (*whole)->plan().steps.size();
  ASSERT_GE(steps, 4) << "the case must have steps to stop between";

  const std::string path = ::testing::TempDir() + "/resume_" + c.name + ".ck";
  for (int64_t stop : {int64_t{1}, steps / 2, steps - 1}) {
    SCOPED_TRACE("stopped after step " + std::to_string(stop));
    // A first run stops after `stop` steps and saves its state...
    auto first = PrefillEngine::Create(*model, stopping->get(), config, ids.size());
    SNAPFILL_ASSERT_OK(first);
    absl::Status status = (*first)->Run(ids, [&](const StepTelemetry& t) {
      return t.step + 1 < stop;
    });
    ASSERT_TRUE(absl::IsCancelled(status)) << status;
    ASSERT_EQ((*first)->steps_done(), stop);
    CheckpointState state;
    state.model_fingerprint = ModelFingerprint(model->gguf());
    state.config = "test";
    state.input_tokens = ids.size();
    state.input_digest = TokenDigest(ids.data(), ids.size());
    state.plan_digest = (*first)->plan_digest();
    state.threads = (*backend)->num_threads();
    state.steps_done = stop;
    state.total_steps = steps;
    state.next_token = (*first)->plan().steps[stop].start_token;
    state.retention = (*first)->retention();
    SNAPFILL_ASSERT_OK(SaveCheckpointFile(path, state, (*first)->memory()));
    first->reset();

    // ...and a new engine continues from the file.
    auto loaded = LoadCheckpointFile(path);
    SNAPFILL_ASSERT_OK(loaded);
    EXPECT_EQ(loaded->state.retention, state.retention);  // hex floats: exact
    auto second = PrefillEngine::Create(*model, stopping->get(), config, ids.size());
    EXPECT_EQ((*second)->memory().on_host(), !c.guard);
    SNAPFILL_ASSERT_OK(second);
    EXPECT_EQ((*second)->plan_digest(), state.plan_digest);
    SNAPFILL_ASSERT_OK((*second)->Restore(stop, loaded->state.retention, *loaded->memory));
    int64_t first_seen = -1;
    SNAPFILL_ASSERT_OK((*second)->Run(ids, [&](const StepTelemetry& t) {
      if (first_seen < 0) first_seen = t.step;
      return true;
    }));
    EXPECT_EQ(first_seen, stop) << "the resumed run must start at the next step";
    ExpectSameMemory((*whole)->memory(), (*second)->memory());
    EXPECT_EQ(std::memcmp((*whole)->last_logits().data(), (*second)->last_logits().data(),
                          (*whole)->last_logits().size() * sizeof(float)),
              0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, ResumeTest,
    ::testing::Values(Case{"fm", ScheduleKind::kFixed, Growth::kLinear, PrunerKind::kSnapKv, 64, 64},
                      Case{"im_adaptive", ScheduleKind::kIncremental, Growth::kAdaptive,
                           PrunerKind::kSnapKv, 96, 64},
                      Case{"imdc", ScheduleKind::kIncrementalDecremental, Growth::kLinear, PrunerKind::kSnapKv,
                           96, 96},
                      Case{"streaming", ScheduleKind::kFixed, Growth::kLinear,
                           PrunerKind::kStreaming, 64, 100},
                      Case{"reconstruct_imdc", ScheduleKind::kIncrementalDecremental, Growth::kLinear,
                           PrunerKind::kReconstruct, 96, 96},
                      Case{"reconstruct_fm_stride2", ScheduleKind::kFixed, Growth::kLinear,
                           PrunerKind::kReconstruct, 64, 64, 2},
                      Case{"gate_imdc", ScheduleKind::kIncrementalDecremental, Growth::kLinear, PrunerKind::kGate,
                           96, 96},
                      Case{"hybrid_fm", ScheduleKind::kFixed, Growth::kLinear, PrunerKind::kSnapKv, 32, 64, 1, true},
                      Case{"hybrid_im_adaptive", ScheduleKind::kIncremental, Growth::kAdaptive, PrunerKind::kSnapKv,
                           96, 64, 1, true},
                      Case{"hybrid_reconstruct_imdc", ScheduleKind::kIncrementalDecremental, Growth::kLinear,
                           PrunerKind::kReconstruct, 96, 96, 1, true},
                      Case{"imdc_guarded", ScheduleKind::kIncrementalDecremental, Growth::kLinear,
                           PrunerKind::kSnapKv, 96, 96, 1, false, true},
                      Case{"hybrid_reconstruct_imdc_guarded", ScheduleKind::kIncrementalDecremental,
                           Growth::kLinear, PrunerKind::kReconstruct, 96, 96, 1, true, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(RestoreTest, RefusesAMemoryOfAnotherShapeOrStep) {
  TinyLlamaOptions opts;
  opts.context_length = 4096;
  auto model = testing::LoadTinyModel(opts);
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  PrefillConfig config;
  config.schedule.kind = ScheduleKind::kFixed;
  config.schedule.memory = 64;
  config.schedule.chunk = 64;
  config.schedule.window = 8;
  auto engine = PrefillEngine::Create(*model, backend->get(), config, 400);
  SNAPFILL_ASSERT_OK(engine);
  const LlamaConfig& mc = model->config();
  const std::vector<double> retention(mc.num_layers, 0.5);
  auto right = KvCache::Create({mc.num_layers, mc.num_kv_heads, mc.head_dim, 64});
  auto wrong = KvCache::Create({mc.num_layers + 1, mc.num_kv_heads, mc.head_dim, 64});
  SNAPFILL_ASSERT_OK(right);
  SNAPFILL_ASSERT_OK(wrong);
  EXPECT_TRUE(absl::IsInvalidArgument((*engine)->Restore(1, retention, **wrong)));
  const int64_t steps = (*engine)->plan().steps.size();
  EXPECT_TRUE(absl::IsInvalidArgument((*engine)->Restore(steps, retention, **right)));
  EXPECT_TRUE(absl::IsInvalidArgument((*engine)->Restore(-1, retention, **right)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      (*engine)->Restore(1, std::vector<double>(mc.num_layers, 1.5), **right)));
  EXPECT_TRUE(absl::IsInvalidArgument((*engine)->Restore(1, {0.5}, **right)));
  SNAPFILL_EXPECT_OK((*engine)->Restore(1, retention, **right));
  EXPECT_EQ((*engine)->steps_done(), 1);
}

// A hybrid model's sliding-window layer resumes with at most its window.
TEST(RestoreTest, RefusesASlidingLayerPastItsWindow) {
  auto model = testing::LoadTinyModel(testing::TinyHybridOptions(24));
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  PrefillConfig config;
  config.schedule.memory = 64;
  config.schedule.chunk = 64;
  config.schedule.window = 8;
  auto engine = PrefillEngine::Create(*model, backend->get(), config, 400);
  SNAPFILL_ASSERT_OK(engine);
  const LlamaConfig& mc = model->config();
  const std::vector<double> retention(mc.num_layers, 0.5);
  auto memory = KvCache::Create({mc.num_layers, mc.num_kv_heads, mc.head_dim, 64});
  SNAPFILL_ASSERT_OK(memory);
  for (int64_t l = 0; l < mc.num_layers; ++l) (*memory)->set_size(l, 24);
  SNAPFILL_EXPECT_OK((*engine)->Restore(1, retention, **memory));
  (*memory)->set_size(1, 60);  // a global layer: within its memory
  SNAPFILL_EXPECT_OK((*engine)->Restore(1, retention, **memory));
  (*memory)->set_size(0, 25);  // a local layer: one past its window
  const absl::Status s = (*engine)->Restore(1, retention, **memory);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("sliding window holds 24"), std::string::npos) << s;
}

// Footprint() is what --dry_run and --max_memory predict from: it must be
// the engine's allocation to the byte.
TEST(FootprintTest, MatchesWhatCreateAllocates) {
  TinyLlamaOptions opts;
  opts.context_length = 4096;
  for (bool hybrid : {false, true}) {
  SCOPED_TRACE(hybrid ? "hybrid" : "llama");
  // (The hybrid model's sliding-window layers hold 200 entries, more than
  // the global layers' 128.)
  auto model = testing::LoadTinyModel(hybrid ? testing::TinyHybridOptions(200) : opts);
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  // (Gate and reconstruct: the memory's stored scores in the selection's
  // buffer too, and the gates' parameters in one of their own.)
  const GateModel gates =
      GateModel::Create(model->config().num_layers, model->config().num_kv_heads, model->config().head_dim, 8).value();
  for (ScheduleKind kind : {ScheduleKind::kFixed, ScheduleKind::kIncremental, ScheduleKind::kIncrementalDecremental}) {
    for (PrunerKind pruner : {PrunerKind::kSnapKv, PrunerKind::kFull, PrunerKind::kReconstruct, PrunerKind::kGate}) {
      for (int64_t sinks : {0, 4}) {
        PrefillConfig config;
        config.schedule.kind = kind;
        config.schedule.memory = 128;
        config.schedule.chunk = 96;
        config.schedule.window = 8;
        config.schedule.sink_tokens = sinks;
        config.pruner.kind = pruner;
        if (pruner == PrunerKind::kGate) config.gate = &gates;
        if (pruner == PrunerKind::kReconstruct) config.repeat_prompt = {5, 9, 2, 11};
        auto fp = PrefillEngine::Footprint(model->config(), config, 1000);
        SNAPFILL_ASSERT_OK(fp);
        auto engine = PrefillEngine::Create(*model, backend->get(), config, 1000);
        SNAPFILL_ASSERT_OK(engine);
        SCOPED_TRACE(std::string(ScheduleKindName(kind)) + " " + PrunerKindName(pruner));
        EXPECT_EQ(fp->memory_bytes, (*engine)->memory_bytes());
        EXPECT_EQ(fp->candidate_bytes + fp->activation_bytes, (*engine)->scratch_bytes());
        EXPECT_EQ(fp->memory_capacity, (*engine)->memory().capacity(1));
        EXPECT_EQ(hybrid ? 200 : fp->memory_capacity, (*engine)->memory().capacity(0));
        EXPECT_EQ(fp->window_entries, hybrid ? 200 : 0);
        // The memory at the end never holds more than final_entries.
        SNAPFILL_ASSERT_OK((*engine)->Run(testing::TestTokens(1000, model->config().vocab_size),
                                          nullptr));
        EXPECT_LE((*engine)->memory().max_size(), fp->final_entries);
        if (pruner == PrunerKind::kFull) {
          EXPECT_EQ(fp->final_entries, 1000);
        }
      }
    }
  }
  }
}

// On a device the engine's keys, values and activations are the backend's
// buffers: Footprint(buffers_on_device) counts them to the byte, as the
// device prediction (--dry_run, --max_memory on cuda) adds them, and leaves
// them out of the host's resident peak. The CPU backend under
// guard_buffers stands in for the device: it counts its buffers' peak as a
// device counts its memory.
TEST(FootprintTest, BuffersOnADeviceAreWhatTheBackendHolds) {
  TinyLlamaOptions opts;
  opts.context_length = 4096;
  for (bool hybrid : {false, true}) {
    auto model = testing::LoadTinyModel(hybrid ? testing::TinyHybridOptions(200) : opts);
    const int64_t vocab = model->config().vocab_size;
    const GateModel gates =
        GateModel::Create(model->config().num_layers, model->config().num_kv_heads, model->config().head_dim, 8)
            .value();
    for (int variant = 0; variant < 7; ++variant) {
      PrefillConfig config;
      config.schedule.kind = variant == 1 ? ScheduleKind::kFixed : ScheduleKind::kIncrementalDecremental;
      config.schedule.memory = 128;
      config.schedule.chunk = 96;
      config.schedule.window = 8;
      config.schedule.sink_tokens = 4;
      config.decode_reserve = 16;
      // The question's rows; with a recall store, the evicted rows on their
      // way to the host.
      if (variant == 2 || variant == 6) config.query_tokens = testing::TestTokens(12, vocab);
      if (variant == 6) config.recall_budget = 8;
      if (variant == 3) config.score_tokens = true;
      if (variant == 4) {  // the stored scores' copy, and the gates' parameters
        config.pruner.kind = PrunerKind::kGate;
        config.gate = &gates;
      }
      if (variant == 5) {  // the stored scores' copy, and the repetition's log-denominators
        config.pruner.kind = PrunerKind::kReconstruct;
        config.repeat_prompt = {5, 9, 2, 11};
      }
      SCOPED_TRACE(::testing::Message() << (hybrid ? "hybrid" : "llama") << ", variant " << variant);
      BackendOptions o;
      o.guard_buffers = true;
      auto backend = CreateBackend(Device::kCpu, o);
      SNAPFILL_ASSERT_OK(backend);
      ASSERT_FALSE((*backend)->HostReachesBuffers());
      auto on_device = PrefillEngine::Footprint(model->config(), config, 1000, false, /*buffers_on_device=*/true);
      auto on_host = PrefillEngine::Footprint(model->config(), config, 1000);
      SNAPFILL_ASSERT_OK(on_device);
      SNAPFILL_ASSERT_OK(on_host);
      auto engine = PrefillEngine::Create(*model, backend->get(), config, 1000);
      SNAPFILL_ASSERT_OK(engine);
      std::unique_ptr<RecallStore> store;
      if (variant == 6) {
        RecallStoreInfo info = RecallShape(model->config(), RecallFormat::kF16);
        info.input_tokens = 1000;
        auto made = RecallStore::Create(testing::MakeTempDir("footprint") + "/store", info);
        SNAPFILL_ASSERT_OK(made);
        store = std::move(*made);
        SNAPFILL_ASSERT_OK((*engine)->AttachRecallStore(store.get()));
      }
      EXPECT_EQ((*backend)->DevicePeakBytes(), on_device->buffer_bytes);
      SNAPFILL_ASSERT_OK((*engine)->Run(testing::TestTokens(1000, vocab), nullptr));
      EXPECT_EQ((*backend)->DevicePeakBytes(), on_device->buffer_bytes) << "the run allocated more";
      // The memory's keys and values are the difference between the two placements.
      const LlamaConfig& mc = model->config();
      uint64_t kv_bytes = 0;
      for (int64_t l = 0; l < mc.num_layers; ++l) {
        kv_bytes += static_cast<uint64_t>((*engine)->memory().capacity(l)) * mc.num_kv_heads * mc.head_dim * 8;
      }
      if (variant == 6) {
        // (The selection's buffers and the evicted rows besides: the CPU's
        // own buffers select on the host, which hands the store its rows.)
        EXPECT_GT(on_device->buffer_bytes - on_host->buffer_bytes, kv_bytes);
        int64_t stored = 0;
        for (int64_t l = 0; l < mc.num_layers; ++l) stored += store->slots(l);
        EXPECT_GT(stored, 0);
      } else {
        EXPECT_EQ(on_device->buffer_bytes - on_host->buffer_bytes, kv_bytes);
      }
      EXPECT_LT(on_device->resident_peak, on_host->resident_peak);
      EXPECT_LT(on_device->kept_bytes, on_host->kept_bytes);  // the decoder's cache stays on the device
      if (variant == 5) {                                     // (the repetition's rows: the prompt and the chunk again)
        EXPECT_GT(on_device->ops.tokens, (*engine)->plan().max_chunk_tokens + 4);
      } else {
        EXPECT_EQ(on_device->ops.tokens, (*engine)->plan().max_chunk_tokens + (variant == 2 || variant == 6 ? 12 : 0));
      }
      // The decoder's caches stay in the device's memory: the copy and the
      // memory itself, rotated alike.
      auto copy = (*engine)->MakeDecoderCache(4);
      SNAPFILL_ASSERT_OK(copy);
      auto taken = (*engine)->TakeDecoderCache();
      SNAPFILL_ASSERT_OK(taken);
      EXPECT_FALSE((*copy)->on_host());
      EXPECT_FALSE((*taken)->on_host());
      for (int64_t l = 0; l < mc.num_layers; ++l) {
        const int64_t n = (*taken)->size(l);
        ASSERT_EQ((*copy)->size(l), n);
        std::vector<float> ck(n * mc.head_dim), cv(ck.size()), tk(ck.size()), tv(ck.size());
        SNAPFILL_ASSERT_OK((*copy)->CopyOut(l, 0, n, ck.data(), cv.data()));
        SNAPFILL_ASSERT_OK((*taken)->CopyOut(l, 0, n, tk.data(), tv.data()));
        EXPECT_EQ(ck, tk) << "layer " << l;
        EXPECT_EQ(cv, tv) << "layer " << l;
      }
    }
  }
}

// TakeDecoderCache() rotates in place what MakeDecoderCache() copies; with
// decode_reserve the memory has the room the decoder appends into.
TEST(TakeDecoderCacheTest, EqualsTheCopyAndHasTheReserve) {
  TinyLlamaOptions opts;
  opts.context_length = 4096;
  for (bool hybrid : {false, true}) {
  auto model = testing::LoadTinyModel(hybrid ? testing::TinyHybridOptions(24) : opts);
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  for (bool original : {false, true}) {
    SCOPED_TRACE(std::string(hybrid ? "hybrid" : "llama") + (original ? ", original" : ", re-encoded"));
    PrefillConfig config;
    config.schedule.memory = 96;
    config.schedule.chunk = 96;
    config.schedule.window = 8;
    config.keep_original_positions = original;
    config.decode_reserve = 10;
    auto engine = PrefillEngine::Create(*model, backend->get(), config, 500);
    SNAPFILL_ASSERT_OK(engine);
    SNAPFILL_ASSERT_OK((*engine)->Run(testing::TestTokens(500, model->config().vocab_size),
                                      nullptr));
    const int64_t next = (*engine)->next_position();
    auto copy = (*engine)->MakeDecoderCache(10);
    SNAPFILL_ASSERT_OK(copy);
    auto taken = (*engine)->TakeDecoderCache();
    SNAPFILL_ASSERT_OK(taken);
    ExpectSameMemory(**copy, **taken);
    EXPECT_GE((*taken)->room(), 10);
    EXPECT_EQ((*engine)->next_position(), next);
    EXPECT_FALSE((*engine)->TakeDecoderCache().ok()) << "the memory can be taken once";
  }
  }
}

}  // namespace
}  // namespace snapfill
