// A Backend whose sweep bookkeeping (rank, size, barriers, the timing and
// check reductions) runs over a gflow communicator on host memory: gflow's
// own driver (allreduce_bw), and nccl_allreduce_bw, which uses gflow only to
// start NCCL and to time it.
#pragma once

#include <memory>
#include <vector>

#include "common/sweep.h"
#include "gflow/gflow.h"

namespace gflow::bench {

class OverGflow : public Backend {
 public:
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  void barrier() override;
  double maxOverRanks(double v) override;
  int64_t sumOverRanks(int64_t v) override;
  void sumOverRanks(std::vector<int64_t>& v) override;

 protected:
  explicit OverGflow(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  std::shared_ptr<Communicator> comm_;
};

}  // namespace gflow::bench
