#include "common/collective.h"

#include <cstring>
#include <vector>

namespace gflow::bench {
namespace {

struct Name {
  Collective c;
  const char* name;
};
constexpr Name kNames[] = {
    {Collective::kAllreduce, "allreduce"},
    {Collective::kReduce, "reduce"},
    {Collective::kBroadcast, "broadcast"},
    {Collective::kAllgather, "allgather"},
    {Collective::kReduceScatter, "reducescatter"},
    {Collective::kGather, "gather"},
    {Collective::kScatter, "scatter"},
    {Collective::kAlltoall, "alltoall"},
    {Collective::kSendRecv, "sendrecv"},
};

// What rank `source` sends as element i: a small integer (1..97), exact in
// every dtype, that differs between neighbouring sources and elements.
double movedValue(int source, size_t i) {
  return static_cast<double>((static_cast<size_t>(source) * 31 + i) % 97 + 1);
}

}  // namespace

bool parseCollective(const std::string& s, Collective* out) {
  for (const Name& n : kNames) {
    if (s == n.name) {
      *out = n.c;
      return true;
    }
  }
  return false;
}

const char* toString(Collective c) {
  for (const Name& n : kNames) {
    if (n.c == c) return n.name;
  }
  return "?";
}

bool reduces(Collective c) {
  return c == Collective::kAllreduce || c == Collective::kReduce || c == Collective::kReduceScatter;
}

bool blocked(Collective c) {
  return c == Collective::kAllgather || c == Collective::kReduceScatter ||
         c == Collective::kGather || c == Collective::kScatter || c == Collective::kAlltoall;
}

double busFactor(Collective c, int n) {
  if (n <= 1) return 0;
  if (c == Collective::kAllreduce) return 2.0 * (n - 1) / n;
  if (c == Collective::kReduce || c == Collective::kBroadcast || c == Collective::kSendRecv) {
    return 1.0;
  }
  return static_cast<double>(n - 1) / n;
}

CollectiveCheck::CollectiveCheck(Collective c, DataType dtype, ReduceOp op, int rank, int worldSize)
    : c_(c),
      dtype_(dtype),
      esize_(dataTypeSize(dtype)),
      rank_(rank),
      n_(worldSize),
      pattern_(dtype, op, worldSize) {}

void CollectiveCheck::fillMoved(void* buf, size_t n, int source) const {
  auto* p = static_cast<uint8_t*>(buf);
  for (size_t i = 0; i < n; ++i) encodeValue(dtype_, movedValue(source, i), p + i * esize_);
}

int64_t CollectiveCheck::wrongMoved(const void* buf, size_t n, int source) const {
  const auto* p = static_cast<const uint8_t*>(buf);
  std::vector<uint8_t> want(esize_);
  int64_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    encodeValue(dtype_, movedValue(source, i), want.data());
    if (std::memcmp(p + i * esize_, want.data(), esize_) != 0) ++wrong;
  }
  return wrong;
}

void CollectiveCheck::fillInputs(void* in, void* out, size_t count) const {
  const size_t block = count / static_cast<size_t>(n_);
  auto* bytes = static_cast<uint8_t*>(in);
  switch (c_) {
    case Collective::kAllreduce:
    case Collective::kReduce:
    case Collective::kReduceScatter: pattern_.fillInput(rank_, in, count); break;
    case Collective::kBroadcast:
      // In place on `out`: the root's data, zeros (never a right answer) elsewhere.
      if (rank_ == kSweepRoot) {
        fillMoved(out, count, kSweepRoot);
      } else {
        std::memset(out, 0, count * esize_);
      }
      break;
    case Collective::kAllgather:
    case Collective::kGather: fillMoved(in, block, rank_); break;
    case Collective::kScatter:
      for (int j = 0; j < n_ && rank_ == kSweepRoot; ++j) {
        fillMoved(bytes + j * block * esize_, block, j);
      }
      break;
    case Collective::kAlltoall:
      for (int j = 0; j < n_; ++j) fillMoved(bytes + j * block * esize_, block, rank_ * n_ + j);
      break;
    case Collective::kSendRecv: fillMoved(in, count, rank_); break;
  }
}

int64_t CollectiveCheck::countWrong(const void* out, size_t count) const {
  const size_t block = count / static_cast<size_t>(n_);
  const auto* bytes = static_cast<const uint8_t*>(out);
  int64_t wrong = 0;
  switch (c_) {
    case Collective::kAllreduce: return pattern_.countWrong(out, count, 0);
    case Collective::kReduce: return rank_ == kSweepRoot ? pattern_.countWrong(out, count, 0) : 0;
    case Collective::kReduceScatter:
      return pattern_.countWrong(out, block, static_cast<size_t>(rank_) * block);
    case Collective::kBroadcast: return wrongMoved(out, count, kSweepRoot);
    case Collective::kGather:
      if (rank_ != kSweepRoot) return 0;
      [[fallthrough]];
    case Collective::kAllgather:
      for (int j = 0; j < n_; ++j) wrong += wrongMoved(bytes + j * block * esize_, block, j);
      return wrong;
    case Collective::kScatter: return wrongMoved(out, block, rank_);
    case Collective::kAlltoall:
      for (int j = 0; j < n_; ++j) {
        wrong += wrongMoved(bytes + j * block * esize_, block, j * n_ + rank_);
      }
      return wrong;
    case Collective::kSendRecv: return wrongMoved(out, count, (rank_ + n_ - 1) % n_);
  }
  return wrong;
}

}  // namespace gflow::bench
