// The fixed tree of reproducible mode (docs/algorithms.md, "Reproducible
// mode"), written here independently of kernels::OrderedReduction (a
// recursion where that is a stack), for the tests' references: with p the
// largest power of two <= N and rem = N - p, leaf v is x[2v] op x[2v+1] for
// v < rem and x[v + rem] otherwise, and the p leaves are combined in a
// perfect binary tree, the lower half's result the left operand.
#pragma once

#include <vector>

namespace gflow::testing {

template <typename T, typename Op>
T fixedTreeNode(const std::vector<T>& x, Op op, int rem, int lo, int hi) {
  if (hi - lo == 1) return lo < rem ? op(x[2 * lo], x[2 * lo + 1]) : x[lo + rem];
  const int mid = (lo + hi) / 2;
  const T left = fixedTreeNode(x, op, rem, lo, mid);
  return op(left, fixedTreeNode(x, op, rem, mid, hi));
}

// x: one value per rank, in rank order (at least one).
template <typename T, typename Op>
T fixedTree(const std::vector<T>& x, Op op) {
  const int n = static_cast<int>(x.size());
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return fixedTreeNode(x, op, n - p, 0, p);
}

template <typename T>
T fixedTreeSum(const std::vector<T>& x) {
  return fixedTree(x, [](T a, T b) { return a + b; });
}

}  // namespace gflow::testing
