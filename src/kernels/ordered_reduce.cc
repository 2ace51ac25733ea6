#include "kernels/ordered_reduce.h"

#include <cstring>

#include "common/check.h"
#include "kernels/convert.h"

namespace gflow::kernels {

bool OrderedReduction::widens(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16 || t == DataType::kFloat8E4M3 ||
         t == DataType::kFloat8E5M2;
}

size_t OrderedReduction::accumulatorBytes(DataType t) {
  return widens(t) ? sizeof(float) : dataTypeSize(t);
}

OrderedReduction::OrderedReduction(DataType dtype, ReduceOp op, int n, size_t count, void* dst,
                                   void* acc, float* tmp)
    : dtype_(dtype),
      op_(op),
      n_(n),
      count_(count),
      wide_(widens(dtype)),
      fn_(reduceFn(wide_ ? DataType::kFloat32 : dtype, op)),
      dst_(static_cast<char*>(dst)),
      acc_(static_cast<char*>(acc)),
      tmp_(tmp) {
  GFLOW_ENFORCE(n >= 1);
}

void OrderedReduction::add(const void* xp) {
  GFLOW_ENFORCE(next_ < n_);
  const char* x = static_cast<const char*>(xp);
  const bool last = ++next_ == n_;
  if (count_ == 0) return;
  if (n_ == 1) {  // the operand itself, bit for bit (no widening of NaN payloads)
    if (x != dst_) std::memcpy(dst_, x, count_ * dataTypeSize(dtype_));
    return;
  }
  if (wide_) {
    auto* acc = reinterpret_cast<float*>(acc_);
    if (next_ == 1) {
      widen(acc, x, count_, dtype_);
    } else {
      widen(tmp_, x, count_, dtype_);
      fn_(acc, acc, tmp_, count_);
    }
  } else if (next_ == 1) {
    prev_ = x;
  } else {
    char* into = last ? dst_ : acc_;
    fn_(into, prev_, x, count_);
    prev_ = into;
  }
  if (last) finish();
}

void OrderedReduction::finish() {
  if (wide_) {
    auto* acc = reinterpret_cast<float*>(acc_);
    if (op_ == ReduceOp::kAvg) divide(acc, count_, DataType::kFloat32, n_);
    narrow(dst_, acc, count_, dtype_);
    return;
  }
  if (op_ == ReduceOp::kAvg) divide(dst_, count_, dtype_, n_);
}

}  // namespace gflow::kernels
