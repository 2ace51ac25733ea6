#include "kernels/ordered_reduce.h"

#include <cstring>

#include "common/check.h"
#include "kernels/convert.h"

namespace gflow::kernels {
namespace {

// The largest power of two <= n (n >= 1), and its log2.
int leavesOf(int n) {
  int p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}
int levelsOf(int n) {
  int levels = 0;
  for (int p = leavesOf(n); p > 1; p /= 2) ++levels;
  return levels;
}

}  // namespace

bool OrderedReduction::widens(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16 || t == DataType::kFloat8E4M3 ||
         t == DataType::kFloat8E5M2;
}

size_t OrderedReduction::accumulatorBytes(DataType t, int n) {
  const size_t es = widens(t) ? sizeof(float) : dataTypeSize(t);
  return (static_cast<size_t>(levelsOf(n < 1 ? 1 : n)) + 2) * es;
}

OrderedReduction::OrderedReduction(DataType dtype, ReduceOp op, int n, size_t count, void* dst,
                                   void* acc)
    : dtype_(dtype),
      op_(op),
      n_(n),
      count_(count),
      wide_(widens(dtype)),
      accEs_(wide_ ? sizeof(float) : dataTypeSize(dtype)),
      fn_(reduceFn(wide_ ? DataType::kFloat32 : dtype, op)),
      pairs_(n >= 1 ? n - leavesOf(n) : 0),
      leaves_(n >= 1 ? leavesOf(n) : 1),
      dst_(static_cast<char*>(dst)),
      acc_(static_cast<char*>(acc)) {
  GFLOW_ENFORCE(n >= 1);
}

size_t OrderedReduction::blockScratchBytes(DataType dtype, int n, size_t count) {
  return accumulatorBytes(dtype, n) * (count < kBlock ? count : kBlock);
}

void OrderedReduction::reduceAll(DataType dtype, ReduceOp op,
                                 const std::vector<const void*>& operands, size_t count, void* dst,
                                 void* acc) {
  const int n = static_cast<int>(operands.size());
  const size_t es = dataTypeSize(dtype);
  for (size_t i = 0; i < count; i += kBlock) {
    const size_t m = count - i < kBlock ? count - i : kBlock;
    OrderedReduction red(dtype, op, n, m, static_cast<char*>(dst) + i * es, acc);
    for (int r = 0; r < n; ++r) red.add(static_cast<const char*>(operands[r]) + i * es);
  }
}

void OrderedReduction::add(const void* xp) {
  GFLOW_ENFORCE(next_ < n_);
  const char* x = static_cast<const char*>(xp);
  const int r = next_++;
  if (count_ == 0) return;
  if (n_ == 1) {  // the operand itself, bit for bit (no widening of NaN payloads)
    if (x != dst_) std::memcpy(dst_, x, count_ * dataTypeSize(dtype_));
    return;
  }
  // Where this leaf will sit: stack position `at`, its data slot(at).
  const size_t at = depth_;
  auto wideAt = [&](size_t i) { return reinterpret_cast<float*>(slot(i)); };
  if (r < 2 * pairs_ && r % 2 == 0) {  // the left half of a leaf pair
    if (wide_) widen(wideAt(at), x, count_, dtype_);
    pending_ = wide_ ? slot(at) : x;
    return;
  }
  if (r < 2 * pairs_) {  // the right half: the pair is the leaf
    const char* right = x;
    if (wide_) {
      widen(wideAt(at + 1), x, count_, dtype_);
      right = slot(at + 1);
    }
    fn_(slot(at), pending_, right, count_);
    push(slot(at));
    return;
  }
  if (wide_) {
    widen(wideAt(at), x, count_, dtype_);
    x = slot(at);
  }
  push(x);
}

// A leaf onto the stack, combined with its left neighbours while they are
// complete subtrees of its size (a binary counter over the p leaves). The
// result of a node goes to its left child's slot; the root's, for the
// types that do not widen, to dst.
void OrderedReduction::push(const char* leaf) {
  Node node{0, leaf};
  const bool lastLeaf = ++pushed_ == leaves_;
  while (depth_ > 0 && stack_[depth_ - 1].level == node.level) {
    const Node left = stack_[--depth_];
    const bool root = lastLeaf && depth_ == 0;
    char* into = root && !wide_ ? dst_ : slot(depth_);
    fn_(into, left.data, node.data, count_);
    node = Node{left.level + 1, into};
  }
  stack_[depth_++] = node;
  if (lastLeaf) finish();
}

// The root is in slot 0 (widening types) or already in dst.
void OrderedReduction::finish() {
  if (wide_) {
    auto* acc = reinterpret_cast<float*>(slot(0));
    if (op_ == ReduceOp::kAvg) divide(acc, count_, DataType::kFloat32, n_);
    narrow(dst_, acc, count_, dtype_);
    return;
  }
  if (op_ == ReduceOp::kAvg) divide(dst_, count_, dtype_, n_);
}

}  // namespace gflow::kernels
