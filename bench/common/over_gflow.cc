#include "common/over_gflow.h"

namespace gflow::bench {

void OverGflow::barrier() {
  comm_->barrier();
}

double OverGflow::maxOverRanks(double v) {
  comm_->allreduce(Tensor(&v, 1, DataType::kFloat64), ReduceOp::kMax);
  return v;
}

int64_t OverGflow::sumOverRanks(int64_t v) {
  comm_->allreduce(Tensor(&v, 1, DataType::kInt64), ReduceOp::kSum);
  return v;
}

void OverGflow::sumOverRanks(std::vector<int64_t>& v) {
  comm_->allreduce(Tensor(v.data(), v.size(), DataType::kInt64), ReduceOp::kSum);
}

}  // namespace gflow::bench
