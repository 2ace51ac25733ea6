// Binomial trees for the rooted ops at small sizes: log2(N) steps instead of
// N-1 messages at the root. Ranks are renumbered so the root is virtual rank
// 0 (v = (rank - root) mod N); virtual rank v's parent is v minus its lowest
// set bit, its children are v + m for every power of two m below that bit
// (every m for the root) with v + m < N, and its subtree is the virtual
// ranks [v, v + span(v)).
//
// reduce: each rank reduces its children's partial results into its own
// (children in increasing m, own data first), then sends to its parent; the
// root divides once for kAvg. The tree is fixed, so the bits are too.
// gather: each rank collects its subtree's blocks in virtual-rank order and
// sends them up in one message; scatter is the same run downwards.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/host/exchange.h"
#include "kernels/reduce.h"

namespace gflow::backend::host {
namespace {

struct Tree {
  Tree(int n, int r, int root) : n(n), v((r - root + n) % n), root(root) {}
  int real(int vr) const { return (vr + root) % n; }
  int lowbit() const { return v == 0 ? n : (v & -v); }
  int span() const { return std::min(lowbit(), n - v); }  // subtree size
  int parent() const { return real(v - (v & -v)); }
  // Children's masks in increasing order.
  std::vector<int> childMasks() const {
    std::vector<int> m;
    for (int mask = 1; mask < lowbit() && v + mask < n; mask <<= 1) m.push_back(mask);
    return m;
  }
  int n, v, root;
};

// Blocks [0, n) of `from` in virtual-rank order, copied to `to` in real
// rank order (block v is real rank v + root), or the reverse (toVirtual).
void rotate(const char* from, char* to, size_t block, int n, int root, bool toVirtual) {
  const size_t head = static_cast<size_t>(n - root) * block,
               tail = static_cast<size_t>(root) * block;
  if (toVirtual) {
    std::memcpy(to, from + tail, head);
    std::memcpy(to + head, from, tail);
  } else {
    std::memcpy(to + tail, from, head);
    std::memcpy(to, from + head, tail);
  }
}

}  // namespace

void reduceBinomial(Exchange& ex, Scratch& scratch, const void* inp, void* outp) {
  const OpDesc& d = ex.desc();
  const Tree t(ex.size(), ex.rank(), d.root);
  const size_t bytes = d.count * dataTypeSize(d.dtype);
  const auto fn = kernels::reduceFn(d.dtype, d.op);
  const std::vector<int> kids = t.childMasks();
  const char* in = static_cast<const char*>(inp);
  // Scratch: one receive buffer per child, then (off the root) the partial.
  char* mem = scratch.get(std::max<size_t>((kids.size() + 1) * bytes, 1));
  char* acc = t.v == 0 ? static_cast<char*>(outp) : mem + kids.size() * bytes;
  std::vector<transport::RequestPtr> reqs;
  for (size_t i = 0; i < kids.size(); ++i) {
    reqs.push_back(ex.recv(t.real(t.v + kids[i]), mem + i * bytes, bytes, kids[i]));
  }
  const char* cur = in;
  for (size_t i = 0; i < kids.size(); ++i) {
    ex.wait(reqs[i]);
    if (d.count > 0) fn(acc, cur, mem + i * bytes, d.count);
    cur = acc;
  }
  if (t.v == 0) {
    if (cur != acc && bytes > 0) std::memcpy(acc, cur, bytes);  // n == 1
    if (d.op == ReduceOp::kAvg && d.count > 0) kernels::divide(acc, d.count, d.dtype, t.n);
  } else {
    ex.send(t.parent(), cur, bytes, t.v & -t.v);
  }
  ex.waitSends();
}

void gatherBinomial(Exchange& ex, Scratch& scratch, const void* inp, void* outp) {
  const OpDesc& d = ex.desc();
  const Tree t(ex.size(), ex.rank(), d.root);
  const size_t block = d.count * dataTypeSize(d.dtype);
  // The subtree's blocks in virtual-rank order; at a root 0 that is `out`.
  const bool direct = t.v == 0 && d.root == 0;
  char* buf = direct ? static_cast<char*>(outp)
                     : scratch.get(std::max<size_t>(static_cast<size_t>(t.span()) * block, 1));
  if (block > 0 && buf != inp) std::memcpy(buf, inp, block);
  std::vector<transport::RequestPtr> reqs;
  for (int mask : t.childMasks()) {
    const size_t blocks = static_cast<size_t>(std::min(mask, t.n - t.v - mask));
    reqs.push_back(ex.recv(t.real(t.v + mask), buf + mask * block, blocks * block, mask));
  }
  for (auto& r : reqs) ex.wait(r);
  if (t.v != 0) {
    ex.send(t.parent(), buf, static_cast<size_t>(t.span()) * block, t.v & -t.v);
  } else if (!direct && block > 0) {
    rotate(buf, static_cast<char*>(outp), block, t.n, d.root, false);
  }
  ex.waitSends();
}

void scatterBinomial(Exchange& ex, Scratch& scratch, const void* inp, void* outp) {
  const OpDesc& d = ex.desc();
  const Tree t(ex.size(), ex.rank(), d.root);
  const size_t block = d.count * dataTypeSize(d.dtype);
  const char* buf;  // the subtree's blocks in virtual-rank order
  if (t.v == 0 && d.root == 0) {
    buf = static_cast<const char*>(inp);
  } else {
    char* mem = scratch.get(std::max<size_t>(static_cast<size_t>(t.span()) * block, 1));
    if (t.v == 0) {
      if (block > 0) rotate(static_cast<const char*>(inp), mem, block, t.n, d.root, true);
    } else {
      ex.wait(ex.recv(t.parent(), mem, static_cast<size_t>(t.span()) * block, t.v & -t.v));
    }
    buf = mem;
  }
  // Largest subtree first: it has the most steps ahead of it.
  const std::vector<int> kids = t.childMasks();
  for (auto it = kids.rbegin(); it != kids.rend(); ++it) {
    const size_t blocks = static_cast<size_t>(std::min(*it, t.n - t.v - *it));
    ex.send(t.real(t.v + *it), buf + *it * block, blocks * block, *it);
  }
  if (block > 0 && outp != buf) std::memcpy(outp, buf, block);
  ex.waitSends();
}

}  // namespace gflow::backend::host
