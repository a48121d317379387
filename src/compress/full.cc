// The no-eviction baseline behind the pruner interface: every candidate is
// kept, whatever the budget (the engine gives it a budget of the whole
// input, so its memory simply grows).
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "snapfill/status.h"
#include "src/compress/pruner.h"
#include "src/compress/pruner_internal.h"

namespace snapfill::compress_internal {
namespace {

class FullPruner final : public Pruner {
 public:
  explicit FullPruner(const PrunerConfig& config) {}

  PrunerKind kind() const override { return PrunerKind::kFull; }
  bool needs_votes() const override { return false; }

  absl::Status Select(const SelectionInput& in, std::vector<std::vector<int32_t>>* keep) override {
    SNAPFILL_RETURN_IF_ERROR(CheckSelectionInput(in, /*needs_votes=*/false,
                                                 /*needs_positions=*/false));
    KeepAll(in, keep);
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pruner> NewFullPruner(const PrunerConfig& config) {
  return std::make_unique<FullPruner>(config);
}

}  // namespace snapfill::compress_internal
