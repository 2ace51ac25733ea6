// The collective a sweep times (--op, nccl-tests' binaries as one flag), its
// bus-bandwidth factor, and the exact check of its result. Sizes follow
// nccl-tests: the size column is the whole buffer (allreduce, reduce,
// broadcast), the gathered buffer (allgather, gather), the scattered one
// (reducescatter, scatter) or each rank's send buffer (alltoall); the
// block ops move size/N per rank (or per pair).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/pattern.h"
#include "gflow/types.h"

namespace gflow::bench {

enum class Collective {
  kAllreduce,
  kReduce,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kGather,
  kScatter,
  kAlltoall,
  kSendRecv,  // nccl-tests' sendrecv: the whole buffer to the next rank, from the previous
};

// "allreduce", "reduce", "broadcast", "allgather", "reducescatter",
// "gather", "scatter", "alltoall", "sendrecv". False on anything else.
bool parseCollective(const std::string& s, Collective* out);
const char* toString(Collective c);
// The ops that apply a ReduceOp (the others run once per dtype).
bool reduces(Collective c);
// Block ops split the buffer into N blocks: their counts are multiples of N.
bool blocked(Collective c);
// nccl-tests' factor from algorithm to bus bandwidth.
double busFactor(Collective c, int worldSize);

// The rank every rooted op of a sweep uses.
constexpr int kSweepRoot = 0;

// Fills the inputs of one run of `c` on `count` elements (the sweep's
// size) for the check, and counts the wrong elements of its result:
// reductions against CheckPattern's exact results, data movement against
// the senders' values (small integers, exact in every dtype).
class CollectiveCheck {
 public:
  CollectiveCheck(Collective c, DataType dtype, ReduceOp op, int rank, int worldSize);
  void fillInputs(void* in, void* out, size_t count) const;
  int64_t countWrong(const void* out, size_t count) const;

 private:
  void fillMoved(void* buf, size_t n, int source) const;
  int64_t wrongMoved(const void* buf, size_t n, int source) const;

  Collective c_;
  DataType dtype_;
  size_t esize_;
  int rank_, n_;
  CheckPattern pattern_;
};

}  // namespace gflow::bench
