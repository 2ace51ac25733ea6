// Checks of one collective on a BackendWorld (tests/backend/loopback.h),
// shared by the direct tests of the host, hierarchical and router backends.
// Each runs one op on every rank and compares every rank's result with an
// independent reference: exact small integers (testing/values.h) for the
// reductions, a closed form for distinct values, the senders' bytes for
// data movement. Allreduce results must also be bitwise equal on every
// rank and leave the input alone; no op may write past its output (guard
// bytes).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/loopback.h"
#include "testing/values.h"

namespace gflow::testing {

// One buffer per rank, each followed by guard bytes no op may touch.
class RankBuffers {
 public:
  static constexpr size_t kGuardBytes = 16;
  static constexpr char kFill = 0x5a;  // what a fresh buffer and its guard hold

  RankBuffers(int ranks, size_t bytes)
      : bytes_(bytes), bufs_(ranks, std::vector<char>(bytes + kGuardBytes, kFill)) {}

  char* operator[](int rank) { return bufs_[rank].data(); }
  const char* operator[](int rank) const { return bufs_[rank].data(); }

  // Fails the test when an op wrote past the end of a rank's buffer.
  void expectGuardsIntact() const {
    for (size_t r = 0; r < bufs_.size(); ++r) {
      for (size_t i = bytes_; i < bufs_[r].size(); ++i) {
        if (bufs_[r][i] != kFill) {
          ADD_FAILURE() << "rank " << r << " wrote " << (i - bytes_) << " bytes past its buffer";
          return;
        }
      }
    }
  }

  // Fails the test unless every rank holds the bytes of rank 0.
  void expectIdentical() const {
    for (size_t r = 1; r < bufs_.size(); ++r) {
      if (std::memcmp(bufs_[r].data(), bufs_[0].data(), bytes_) != 0) {
        ADD_FAILURE() << "rank " << r << " holds other bytes than rank 0";
      }
    }
  }

 private:
  size_t bytes_;
  std::vector<std::vector<char>> bufs_;
};

inline backend::OpDesc opDesc(backend::OpKind kind, DataType t, ReduceOp op,
                              backend::Algorithm algo, uint64_t count, int root = 0) {
  backend::OpDesc d;
  d.kind = kind;
  d.dtype = t;
  d.op = op;
  d.route = algo;
  d.count = count;
  d.root = root;
  return d;
}

inline std::string describe(const backend::OpDesc& d) {
  return backend::describe(backend::encode(d));
}

// Pattern bytes for the data-movement collectives: distinct per rank and
// position, never the buffers' fill byte.
inline char patternByte(int rank, size_t i) {
  const char b = static_cast<char>((rank * 131 + i * 7 + 1) & 0xff);
  return b == RankBuffers::kFill ? 0 : b;
}

// Fails the test at the first element i < count of a rank's buffer that is
// not want(rank, i) (values read as dtype `t`); true when all are.
inline bool expectValues(const RankBuffers& bufs, int ranks, size_t count, DataType t,
                         const std::function<double(int, size_t)>& want, const char* what) {
  for (int r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < count; ++i) {
      const double got = getValue(bufs[r], i, t), expected = want(r, i);
      if (got != expected) {
        ADD_FAILURE() << "rank " << r << " " << what << " element " << i << ": " << got
                      << ", expected " << expected;
        return false;
      }
    }
  }
  return true;
}

// Allreduce `d` of input(rank, i): every rank must hold want(i), bitwise
// the same on every rank, with its input untouched.
inline void checkAllreduce(BackendWorld& w, const backend::OpDesc& d, bool inPlace,
                           const std::function<double(int, size_t)>& input,
                           const std::function<double(size_t)>& want) {
  const int n = w.size();
  const DataType t = d.dtype;
  const size_t count = d.count, es = dataTypeSize(t);
  RankBuffers in(n, count * es), out(n, count * es);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) setValue(in[r], i, t, input(r, i));
    if (inPlace) std::memcpy(out[r], in[r], count * es);
  }
  SCOPED_TRACE(describe(d) + (inPlace ? " in place" : ""));
  const backend::Op op = w.op(d);
  if (!w.run(
          [&](int r, backend::Backend& b) { b.allreduce(op, inPlace ? out[r] : in[r], out[r]); })) {
    return;
  }
  expectValues(
      out, n, count, t, [&](int, size_t i) { return want(i); }, "output");
  if (!inPlace) expectValues(in, n, count, t, input, "input");
  out.expectIdentical();
  out.expectGuardsIntact();
}

// Allreduce of exactInput values (any dtype and op) against exactExpected.
inline void checkExactAllreduce(BackendWorld& w, const backend::OpDesc& d, bool inPlace) {
  const int n = w.size();
  checkAllreduce(
      w, d, inPlace, [&](int r, size_t i) { return exactInput(r, i, d.op, d.dtype); },
      [&](size_t i) { return exactExpected(n, i, d.op, d.dtype); });
}

// Allreduce (sum or avg, float64 or int32) of values distinct per rank and
// element, rank * 1000 + i, against the closed form.
inline void checkDistinctAllreduce(BackendWorld& w, const backend::OpDesc& d) {
  const int64_t n = w.size();
  checkAllreduce(
      w, d, false, [](int r, size_t i) { return r * 1000.0 + i; },
      [&](size_t i) {
        // The sum over r of (1000 r + i) is 1000 n(n-1)/2 + n i.
        const int64_t sum = 1000 * n * (n - 1) / 2 + n * static_cast<int64_t>(i);
        if (d.op != ReduceOp::kAvg) return static_cast<double>(sum);
        return d.dtype == DataType::kInt32 ? static_cast<double>(sum / n)
                                           : static_cast<double>(sum) / static_cast<double>(n);
      });
}

// Reduce-scatter of `d.count` elements per rank: rank r gets the exact
// reduction of block r of every rank's input.
inline void checkExactReduceScatter(BackendWorld& w, const backend::OpDesc& d) {
  const int n = w.size();
  const DataType t = d.dtype;
  const size_t block = d.count, es = dataTypeSize(t);
  RankBuffers in(n, n * block * es), out(n, block * es);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < n * block; ++i) setValue(in[r], i, t, exactInput(r, i, d.op, t));
  }
  SCOPED_TRACE(describe(d));
  const backend::Op op = w.op(d);
  if (!w.run([&](int r, backend::Backend& b) { b.reduceScatter(op, in[r], out[r]); })) return;
  expectValues(
      out, n, block, t, [&](int r, size_t i) { return exactExpected(n, r * block + i, d.op, t); },
      "output");
  out.expectGuardsIntact();
}

// Allgather of `d.count` elements per rank: every rank holds every rank's
// bytes at that rank's place (in place: the input is already there).
inline void checkAllgather(BackendWorld& w, const backend::OpDesc& d, bool inPlace) {
  const int n = w.size();
  const size_t bytes = d.count * dataTypeSize(d.dtype);
  RankBuffers in(n, bytes), out(n, n * bytes);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < bytes; ++i) in[r][i] = patternByte(r, i);
    if (inPlace) std::memcpy(out[r] + r * bytes, in[r], bytes);
  }
  SCOPED_TRACE(describe(d) + (inPlace ? " in place" : ""));
  const backend::Op op = w.op(d);
  if (!w.run([&](int r, backend::Backend& b) {
        b.allgather(op, inPlace ? out[r] + r * bytes : in[r], out[r]);
      })) {
    return;
  }
  for (int r = 0; r < n; ++r) {
    for (int from = 0; from < n; ++from) {
      for (size_t i = 0; i < bytes; ++i) {
        if (out[r][from * bytes + i] != patternByte(from, i)) {
          ADD_FAILURE() << "rank " << r << ", block of rank " << from << ", byte " << i;
          return;
        }
      }
    }
  }
  out.expectGuardsIntact();
}

// Broadcast from d.root: every rank ends with the root's bytes.
inline void checkBroadcast(BackendWorld& w, const backend::OpDesc& d) {
  const int n = w.size();
  const size_t bytes = d.count * dataTypeSize(d.dtype);
  RankBuffers buf(n, bytes);
  for (size_t i = 0; i < bytes; ++i) buf[d.root][i] = patternByte(d.root, i);
  SCOPED_TRACE(describe(d));
  const backend::Op op = w.op(d);
  if (!w.run([&](int r, backend::Backend& b) { b.broadcast(op, buf[r]); })) return;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < bytes; ++i) {
      if (buf[r][i] != patternByte(d.root, i)) {
        ADD_FAILURE() << "rank " << r << " byte " << i << " differs from the root's";
        return;
      }
    }
  }
  buf.expectGuardsIntact();
}

// `rounds` barriers in a row: no rank leaves one before every rank has
// entered it.
inline void checkBarrier(BackendWorld& w, const backend::OpDesc& d, int rounds) {
  const int n = w.size();
  std::atomic<int> entered{0};
  std::vector<int> early(n, 0);
  std::vector<backend::Op> ops;
  for (int k = 0; k < rounds; ++k) ops.push_back(w.op(d));
  if (!w.run([&](int r, backend::Backend& b) {
        for (int k = 0; k < rounds; ++k) {
          entered.fetch_add(1);
          b.barrier(ops[k]);
          if (entered.load() < (k + 1) * n) ++early[r];
        }
      })) {
    return;
  }
  for (int r = 0; r < n; ++r) EXPECT_EQ(early[r], 0) << "rank " << r << " left barriers early";
}

}  // namespace gflow::testing
