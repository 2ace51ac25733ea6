#include "backend/nccl/op_check.h"

#include <vector>

#include "common/check.h"
#include "common/hash.h"

namespace gflow::backend {
namespace {

// 64 bits of everything in an op's description that must agree.
uint64_t digest(const OpDesc& d) {
  uint64_t h = hash::kFnvOffset;
  for (uint64_t v : {uint64_t(d.kind), uint64_t(d.dtype), uint64_t(d.op),
                     uint64_t(d.route.path) << 8 | uint64_t(d.route.algo),
                     uint64_t(int64_t(d.root)), d.count, d.parent}) {
    h = hash::mix(h, v);
    h ^= h >> 29;
  }
  return h;
}

// A well-mixed 64-bit digest of "rank `from` sends `count` elements to rank
// `to`" (splitmix64's finalizer over the three).
uint64_t pairDigest(uint64_t from, uint64_t to, uint64_t count) {
  uint64_t z = hash::mix(hash::mix(hash::mix(hash::kFnvOffset, from), to), count);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

NcclOpCheck::NcclOpCheck(int rank, int size, Backend& host,
                         std::function<Route(const OpDesc&)> route)
    : rank_(rank), size_(size), host_(host), route_(std::move(route)) {}

void NcclOpCheck::run(const Op& op, const CheckedCounts& c) const {
  const size_t n = static_cast<size_t>(size_);
  const bool counts = c.in && c.out, full = counts && size_ <= kCountsInCheck;
  std::vector<int64_t> mine = {static_cast<int64_t>(digest(op.desc))};
  if (full) {
    for (size_t r = 0; r < n; ++r) mine.push_back(static_cast<int64_t>(c.in->counts[r]));
    for (size_t r = 0; r < n; ++r) mine.push_back(static_cast<int64_t>(c.out->counts[r]));
  } else if (counts) {
    uint64_t sends = 0, receives = 0;
    for (size_t r = 0; r < n; ++r) {
      sends += pairDigest(uint64_t(rank_), r, c.in->counts[r]);
      receives += pairDigest(r, uint64_t(rank_), c.out->counts[r]);
    }
    mine.push_back(static_cast<int64_t>(sends));
    mine.push_back(static_cast<int64_t>(receives));
  }
  const size_t width = mine.size();
  Op check;
  check.seq = op.seq;
  check.desc = {OpKind::kAllgather, DataType::kInt64, ReduceOp::kSum, {}, 0, width};
  check.desc.route = route_(check.desc);
  check.desc.parent = fingerprint(op.desc);
  check.deadline = op.deadline;
  std::vector<int64_t> all(width * n);
  host_.allgather(check, mine.data(), all.data());
  uint64_t sends = 0, receives = 0;
  for (size_t r = 0; r < n; ++r) {
    if (all[r * width] != mine[0]) {
      GFLOW_THROW(kMismatch, ErrorContext().withSeq(op.seq).withRank(rank_).withPeer(int(r)))
          << "rank " << r << " called another op on NCCL than this rank ("
          << describe(encode(op.desc)) << ")";
    }
    if (counts && !full) {
      sends += static_cast<uint64_t>(all[r * width + 1]);
      receives += static_cast<uint64_t>(all[r * width + 2]);
    }
  }
  for (size_t i = 0; full && i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const int64_t sent = all[i * width + 1 + j], expects = all[j * width + 1 + n + i];
      if (sent == expects) continue;
      GFLOW_THROW(kMismatch, ErrorContext().withSeq(op.seq).withRank(rank_).withPeer(int(i)))
          << "rank " << i << " sends " << sent << " elements to rank " << j << ", which expects "
          << expects << " from it (alltoallv counts)";
    }
  }
  if (sends != receives) {
    GFLOW_THROW(kMismatch, ErrorContext().withSeq(op.seq).withRank(rank_))
        << "the ranks' alltoallv counts disagree: some rank sends a block of another size than "
           "its receiver expects";
  }
}

}  // namespace gflow::backend
