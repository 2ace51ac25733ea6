// PMIx: the process-management interface of the launchers that start ranks on
// clusters (Open MPI's mpirun, Slurm's `srun --mpi=pmix`, PRRTE). A process
// they start finds its rank, the job size, its local rank and its host from
// the launcher's PMIx server, and the job's processes exchange small values
// through it (put, commit, fence, get). libpmix is loaded at run time, like
// libibverbs, so libgflow runs where it is absent.
#pragma once

#include <chrono>
#include <string>

namespace gflow::bootstrap::pmix {

// This process was started by a PMIx server: PMIX_NAMESPACE and PMIX_RANK
// are set. Says nothing about whether libpmix can be loaded.
bool launched();

struct Job {
  int rank = -1;
  int size = -1;
  int localRank = -1;  // -1: the server did not say
  int localSize = -1;
  std::string host;  // the launcher's name for this process's node ("" if not given)
};

// Connects to the server (once per process; disconnects at exit) and reads
// this process's place in the job. Throws Error(kInvalidArgument) naming what
// failed: libpmix not loadable, PMIx_Init refused, rank or size not given.
Job job();

// Collective over every process of the job, in the same order on each:
// rank 0 publishes `rootValue` under `key`; every process, rank 0 included,
// returns rank 0's value. Fails with Error(kTimeout) after `timeout`, and
// with Error(kInvalidArgument) when the server refuses.
std::string shareFromRankZero(const std::string& key, const std::string& rootValue,
                              std::chrono::milliseconds timeout);

}  // namespace gflow::bootstrap::pmix
