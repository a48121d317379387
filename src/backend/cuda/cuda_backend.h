// The CUDA backend (built with -DSNAPFILL_WITH_CUDA=ON): CreateBackend's
// kCuda. Internal to the backend layer; callers use CreateBackend and
// CudaDevice (snapfill/backend.h).
#ifndef SNAPFILL_SRC_BACKEND_CUDA_CUDA_BACKEND_H_
#define SNAPFILL_SRC_BACKEND_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "snapfill/backend.h"

namespace snapfill {

// FailedPrecondition naming why where no device can be used (no driver, no
// GPU).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options);
absl::StatusOr<std::string> DescribeCudaDevice();

}  // namespace snapfill

#endif  // SNAPFILL_SRC_BACKEND_CUDA_CUDA_BACKEND_H_
