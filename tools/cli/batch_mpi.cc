#include "tools/cli/batch_mpi.h"

#include <time.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "snapfill/status.h"

#if SNAPFILL_WITH_MPI
// The C API only: OpenMPI's deprecated C++ bindings are a library of their own.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace snapfill::cli {
namespace {

// One process: the documents in order.
class SoloWorld final : public BatchWorld {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void Start(std::vector<int> order) override {
    order_ = std::move(order);
    next_ = 0;
  }
  absl::StatusOr<int> Next() override { return next_ < order_.size() ? order_[next_++] : -1; }
  absl::Status Barrier() override { return absl::OkStatus(); }
  void Abort(int code) override {}

 private:
  std::vector<int> order_;
  size_t next_ = 0;
};

#if SNAPFILL_WITH_MPI
constexpr int kTagAsk = 1;     // a rank asks rank 0 for its next document
constexpr int kTagAnswer = 2;  // rank 0's answer: an index, or -1

void Nap() {
  // Between polls: a rank waiting on others (or rank 0's server between
  // requests) takes no core from the ranks that compute; a request waits at
  // most this long.
  const timespec t{0, 1000000};
  nanosleep(&t, nullptr);
}

absl::Status MpiStatus(int code, const char* what) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return absl::InternalError(absl::StrCat("MPI: ", what, ": ", std::string(text, len)));
}

#define SNAPFILL_MPI_RETURN(call, what)                          \
  do {                                                           \
    if (absl::Status s_ = MpiStatus((call), (what)); !s_.ok()) { \
      return s_;                                                 \
    }                                                            \
  } while (0)

// Rank 0 holds the queue and serves the other ranks' requests from a thread
// of its own (MPI_THREAD_SERIALIZED: while that thread serves, rank 0's main
// thread makes no MPI call; it takes its own documents from the queue under
// the lock).
class MpiWorld final : public BatchWorld {
 public:
  MpiWorld(int rank, int size) : rank_(rank), size_(size) {}
  ~MpiWorld() override {
    if (server_.joinable()) server_.join();
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void Start(std::vector<int> order) override {
    if (rank_ != 0) return;
    order_ = std::move(order);
    next_ = 0;
    server_ = std::thread([this] { Serve(); });
  }

  absl::StatusOr<int> Next() override {
    if (rank_ == 0) return Take();
    const int ask = 0;
    SNAPFILL_MPI_RETURN(MPI_Send(&ask, 1, MPI_INT, 0, kTagAsk, MPI_COMM_WORLD), "asking rank 0 for a document");
    int index = -1;
    SNAPFILL_MPI_RETURN(MPI_Recv(&index, 1, MPI_INT, 0, kTagAnswer, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                        "waiting for rank 0's answer");
    return index;
  }

  absl::Status Barrier() override {
    // Rank 0's server has answered every other rank's last request once
    // they reach here; it makes no more MPI calls.
    if (server_.joinable()) server_.join();
    MPI_Request request;
    SNAPFILL_MPI_RETURN(MPI_Ibarrier(MPI_COMM_WORLD, &request), "barrier");
    for (;;) {
      int done = 0;
      SNAPFILL_MPI_RETURN(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "barrier");
      if (done) return absl::OkStatus();
      Nap();
    }
  }

  void Abort(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }

 private:
  int Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return next_ < order_.size() ? order_[next_++] : -1;
  }

  // Answers requests until every other rank has been told there is nothing
  // left.
  void Serve() {
    int finished = 0;
    while (finished < size_ - 1) {
      int pending = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagAsk, MPI_COMM_WORLD, &pending, &status);
      if (!pending) {
        Nap();
        continue;
      }
      int ask = 0;
      MPI_Recv(&ask, 1, MPI_INT, status.MPI_SOURCE, kTagAsk, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      const int index = Take();
      MPI_Send(&index, 1, MPI_INT, status.MPI_SOURCE, kTagAnswer, MPI_COMM_WORLD);
      if (index < 0) ++finished;
    }
  }

  const int rank_, size_;
  std::mutex mu_;
  std::vector<int> order_;
  size_t next_ = 0;
  std::thread server_;
};
#undef SNAPFILL_MPI_RETURN
#endif  // SNAPFILL_WITH_MPI

}  // namespace

absl::StatusOr<int> LaunchedRanks(const char* (*getenv)(const char*)) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* value = getenv(name);
    if (value == nullptr || *value == '\0') continue;
    int n = 0;
    if (!absl::SimpleAtoi(value, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, "=", value, ": expected a positive number of ranks"));
    }
    return n;
  }
  return 1;
}

bool BuiltWithMpi() { return SNAPFILL_WITH_MPI != 0; }

absl::Status RanksSupported(int launched, bool with_mpi) {
  if (launched <= 1 || with_mpi) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "started as one of ", launched,
      " MPI ranks, but this snapfill was built without MPI: each rank would answer every document. Run one "
      "process (or --shard), or build with OpenMPI (tools/install_deps.sh installs it; CMake then finds it)"));
}

absl::StatusOr<std::unique_ptr<BatchWorld>> BatchWorld::Create(int launched) {
  SNAPFILL_RETURN_IF_ERROR(RanksSupported(launched, BuiltWithMpi()));
  if (launched <= 1) return std::unique_ptr<BatchWorld>(std::make_unique<SoloWorld>());
#if SNAPFILL_WITH_MPI
  int provided = 0;
  if (const int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided); code != MPI_SUCCESS) {
    return MpiStatus(code, "MPI_Init_thread");
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    return absl::FailedPreconditionError(
        "this MPI library does not allow calls from a second thread (MPI_THREAD_SERIALIZED), which rank 0's "
        "document server needs");
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::unique_ptr<BatchWorld>(std::make_unique<MpiWorld>(rank, size));
#else
  return absl::InternalError("unreachable: RanksSupported refuses ranks without MPI");
#endif
}

}  // namespace snapfill::cli
