// snapfill batch under MPI (`mpirun -np N snapfill batch ...`): the ranks
// take the documents one at a time as they become free, largest first, each
// writing its answers to a file of its own (`--out` + ".rank<r>"); at the end
// rank 0 merges them into --out. Built where OpenMPI is found
// (SNAPFILL_WITH_MPI); a build without it refuses to run as one of several
// ranks rather than do every document once per rank.
#ifndef SNAPFILL_TOOLS_CLI_BATCH_MPI_H_
#define SNAPFILL_TOOLS_CLI_BATCH_MPI_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace snapfill::cli {

// The number of ranks an MPI launcher started this process as one of, read
// from its environment (OpenMPI's OMPI_COMM_WORLD_SIZE, the PMI's PMI_SIZE
// that MPICH's and Slurm's launchers set); 1 where there is none.
// InvalidArgument for a value that is not a positive number.
absl::StatusOr<int> LaunchedRanks(const char* (*getenv)(const char*));

// Whether this snapfill was built with MPI.
bool BuiltWithMpi();

// Whether a process started as one of `launched` ranks can run the batch:
// FailedPrecondition for more than one without MPI (`with_mpi` false), as
// each rank would answer every document; OK otherwise.
absl::Status RanksSupported(int launched, bool with_mpi);

// The ranks of one batch job. One process without a launcher is a world of
// one rank, without MPI.
class BatchWorld {
 public:
  // `launched`: LaunchedRanks(). More than one initializes MPI (its threads
  // serialized: rank 0 serves the others from a thread of its own), and is
  // FailedPrecondition in a build without MPI.
  static absl::StatusOr<std::unique_ptr<BatchWorld>> Create(int launched);
  virtual ~BatchWorld() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Hands out `order` (document indices, in the order to take them), each
  // index to one rank: Next() returns this rank's next one, or -1 when none
  // is left. Only rank 0's `order` is read; every rank calls Start first.
  virtual void Start(std::vector<int> order) = 0;
  virtual absl::StatusOr<int> Next() = 0;
  // Waits for every rank (sleeping, not spinning, while others still work).
  virtual absl::Status Barrier() = 0;
  // Ends every rank of the job with exit code `code` (a rank that fails
  // would otherwise leave the others waiting for it); nothing for one rank.
  virtual void Abort(int code) = 0;
};

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_BATCH_MPI_H_
