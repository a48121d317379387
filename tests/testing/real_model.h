// A test suite over a real model file: the model and a CPU backend loaded
// once for the suite (CRTP: Derived::Path() names the file, Derived::Fetch()
// how to get it), every test skipped, saying so, where the file is absent.
#ifndef SNAPFILL_TESTS_TESTING_REAL_MODEL_H_
#define SNAPFILL_TESTS_TESTING_REAL_MODEL_H_

#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "snapfill/backend.h"
#include "snapfill/status.h"
#include "src/model/llama_model.h"

namespace snapfill::testing {

template <typename Derived>
class RealModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(Derived::Path())) return;
    auto m = LlamaModel::Open(Derived::Path());
    SNAPFILL_CHECK(m.ok()) << m.status();
    model_ = m->release();
    auto b = CreateBackend(Device::kCpu, {});
    SNAPFILL_CHECK(b.ok());
    backend_ = b->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
    model_ = nullptr;
    backend_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "model not found at " << Derived::Path() << " (" << Derived::Fetch() << ")";
  }
  static inline LlamaModel* model_ = nullptr;
  static inline Backend* backend_ = nullptr;
};

}  // namespace snapfill::testing

#endif  // SNAPFILL_TESTS_TESTING_REAL_MODEL_H_
