// Ring algorithms: reduce-scatter, allgather and allreduce. Allreduce is one
// fused routine, not a call of the other two: in each round it first posts
// every allgather receive straight into `out` (so no allgather data arrives
// unexpected), then runs the reduce-scatter steps reducing each received
// piece into `out`, and the last reduce-scatter step's send of the finished
// segment is the allgather's first step; no copy between the two phases.
// Each segment is cut into pieces so that receiving piece k+1, reducing
// piece k and forwarding piece k-1 overlap. Large buffers are processed in
// rounds so staging memory stays bounded (2 segments per round), and the
// rounds overlap: the next round's first step (its receives posted, this
// rank's own segment sent) starts before this round's allgather, so the
// pipeline does not drain at every round boundary (which on a slow link
// costs a pipeline fill per round).
//
// Determinism: each segment is reduced once, by a fixed chain of ranks, then
// copied around the ring, so every rank ends with the same bits.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/host/exchange.h"
#include "kernels/reduce.h"

namespace gflow::backend::host {
namespace {

struct Layout {
  size_t elemSize;
  size_t pieceElems;
  size_t segCapElems;  // elements per segment per round

  size_t pieces(size_t segElems) const {
    return segElems == 0 ? 1 : (segElems + pieceElems - 1) / pieceElems;
  }
  size_t pieceBegin(size_t k) const { return k * pieceElems; }
  size_t pieceLen(size_t segElems, size_t k) const {
    size_t b = k * pieceElems;
    return b >= segElems ? 0 : std::min(pieceElems, segElems - b);
  }
};

Layout makeLayout(DataType dtype, const RingTuning& t) {
  Layout l;
  l.elemSize = dataTypeSize(dtype);
  l.pieceElems = std::max<size_t>(1, t.pieceBytes / l.elemSize);
  l.segCapElems = l.pieceElems * t.window;
  l.pieceElems = std::max(l.pieceElems, (l.segCapElems + kMaxPieces - 1) / kMaxPieces);
  return l;
}

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

// One rank's fused ring allreduce (see the file comment) over n > 1 ranks,
// run round by round; each round covers at most n segments of
// Layout::segCapElems elements.
class RingAllreduce {
 public:
  RingAllreduce(Exchange& ex, Scratch& scratch, const Layout& layout, kernels::ReduceFn fn,
                const void* in, void* out)
      : ex_(ex),
        d_(ex.desc()),
        n_(ex.size()),
        r_(ex.rank()),
        left_(mod(r_ - 1, n_)),
        right_(mod(r_ + 1, n_)),
        L_(layout),
        es_(L_.elemSize),
        fn_(fn),
        in_(static_cast<const char*>(in)),
        out_(static_cast<char*>(out)),
        roundElems_(L_.segCapElems * n_) {
    for (Round& r : rounds_) {
      r.segOff.resize(n_);
      r.segCnt.resize(n_);
      r.agReq.resize(n_ - 1);
    }
    stage_[0] = scratch.get(2 * L_.segCapElems * es_);
    stage_[1] = stage_[0] + L_.segCapElems * es_;
  }

  void run() {
    const size_t rounds = d_.count == 0 ? 1 : (d_.count + roundElems_ - 1) / roundElems_;
    start(0);
    for (size_t round = 0; round < rounds; ++round) {
      select(round);
      reduceScatter();
      // The stage buffers are free again: the next round may begin.
      if (round + 1 < rounds) start(round + 1);
      select(round);
      allgather();
    }
    ex_.waitSends();
  }

 private:
  // What a round needs while the next one begins (two rounds in flight).
  struct Round {
    std::vector<size_t> segOff, segCnt;
    std::vector<std::vector<transport::RequestPtr>> agReq;
  };

  void select(size_t round) {
    round_ = round;
    cur_ = &rounds_[round % 2];
  }

  // A round's first step: its receives posted, this rank's segment sent.
  void start(size_t round) {
    select(round);
    cutSegments();
    postAllgatherRecvs();
    postReduceScatterRecvs(0);
    sendOwnSegment();
  }

  // The round's elements cut into n segments, the first total % n one
  // element longer.
  void cutSegments() {
    const size_t base = round_ * roundElems_;
    const size_t total = std::min(roundElems_, d_.count - std::min(d_.count, base));
    size_t off = base;
    for (int i = 0; i < n_; ++i) {
      cur_->segCnt[i] = total / n_ + (static_cast<size_t>(i) < total % n_ ? 1 : 0);
      cur_->segOff[i] = off;
      off += cur_->segCnt[i];
    }
  }

  // Allgather receives land in `out` directly; posting them now means no
  // allgather data ever arrives unexpected (staged).
  void postAllgatherRecvs() {
    for (int t = 0; t < n_ - 1; ++t) {
      const int seg = mod(r_ - t, n_);
      cur_->agReq[t].clear();
      for (size_t k = 0; k < L_.pieces(cur_->segCnt[seg]); ++k) {
        cur_->agReq[t].push_back(
            ex_.recv(left_, out_ + at(seg, k), bytes(seg, k), messageIndex(round_, n_ - 1 + t, k)));
      }
    }
  }

  // Reduce-scatter step s receives segment r-s-1 into stage s % 2.
  void postReduceScatterRecvs(int s) {
    const int seg = mod(r_ - s - 1, n_);
    auto& reqs = rsReq_[s % 2];
    reqs.clear();
    for (size_t k = 0; k < L_.pieces(cur_->segCnt[seg]); ++k) {
      reqs.push_back(ex_.recv(left_, stage_[s % 2] + L_.pieceBegin(k) * es_, bytes(seg, k),
                              messageIndex(round_, s, k)));
    }
  }

  // Reduce-scatter step 0's send: this rank's own input segment.
  void sendOwnSegment() {
    for (size_t k = 0; k < L_.pieces(cur_->segCnt[r_]); ++k) {
      ex_.send(right_, in_ + at(r_, k), bytes(r_, k), messageIndex(round_, 0, k));
    }
  }

  // Reduce-scatter: the piece received at step s is reduced into `out` and
  // forwarded at step s+1; after the last step this rank owns segment r+1,
  // which it forwards as allgather step 0.
  void reduceScatter() {
    for (int s = 0; s < n_ - 1; ++s) {
      if (s + 1 < n_ - 1) postReduceScatterRecvs(s + 1);
      const int seg = mod(r_ - s - 1, n_);
      const bool last = (s == n_ - 2);
      for (size_t k = 0; k < rsReq_[s % 2].size(); ++k) {
        ex_.wait(rsReq_[s % 2][k]);
        const size_t cnt = L_.pieceLen(cur_->segCnt[seg], k);
        const size_t off = at(seg, k);
        if (cnt > 0) fn_(out_ + off, in_ + off, stage_[s % 2] + L_.pieceBegin(k) * es_, cnt);
        if (last && d_.op == ReduceOp::kAvg && cnt > 0) {
          kernels::divide(out_ + off, cnt, d_.dtype, n_);
        }
        ex_.send(right_, out_ + off, cnt * es_, messageIndex(round_, last ? n_ - 1 : s + 1, k));
      }
    }
  }

  // Allgather: forward each received piece until it has gone round.
  void allgather() {
    for (int t = 0; t < n_ - 1; ++t) {
      const int seg = mod(r_ - t, n_);
      for (size_t k = 0; k < cur_->agReq[t].size(); ++k) {
        ex_.wait(cur_->agReq[t][k]);
        if (t + 1 < n_ - 1) {
          ex_.send(right_, out_ + at(seg, k), bytes(seg, k),
                   messageIndex(round_, n_ - 1 + t + 1, k));
        }
      }
    }
  }

  // Piece k of segment `seg`: its byte offset in `in`/`out`, its bytes.
  size_t at(int seg, size_t k) const { return (cur_->segOff[seg] + L_.pieceBegin(k)) * es_; }
  size_t bytes(int seg, size_t k) const { return L_.pieceLen(cur_->segCnt[seg], k) * es_; }

  Exchange& ex_;
  const OpDesc& d_;
  const int n_, r_, left_, right_;
  const Layout L_;
  const size_t es_;
  const kernels::ReduceFn fn_;
  const char* const in_;
  char* const out_;
  const size_t roundElems_;
  char* stage_[2];
  size_t round_ = 0;
  Round rounds_[2];
  Round* cur_ = &rounds_[0];
  std::vector<transport::RequestPtr> rsReq_[2];
};

}  // namespace

void allreduceRing(Exchange& ex, Scratch& scratch, const void* in, void* out) {
  const OpDesc& d = ex.desc();
  const Layout L = makeLayout(d.dtype, ex.tuning());
  const kernels::ReduceFn fn = kernels::reduceFn(d.dtype, d.op);
  if (ex.size() == 1) {
    if (in != out && d.count > 0) std::memcpy(out, in, d.count * L.elemSize);
    return;
  }
  RingAllreduce(ex, scratch, L, fn, in, out).run();
}

void reduceScatterRing(Exchange& ex, Scratch& scratch, const void* inp, void* outp) {
  const OpDesc& d = ex.desc();
  const int n = ex.size(), r = ex.rank();
  const int left = mod(r - 1, n), right = mod(r + 1, n);
  const Layout L = makeLayout(d.dtype, ex.tuning());
  const size_t es = L.elemSize;
  const auto fn = kernels::reduceFn(d.dtype, d.op);
  const char* in = static_cast<const char*>(inp);
  char* out = static_cast<char*>(outp);
  const size_t block = d.count;  // elements per rank
  if (n == 1) {
    if (in != out && block > 0) std::memcpy(out, in, block * es);
    return;
  }
  // Rounds take a column slice [base, base+cols) of every block.
  const size_t cols = L.segCapElems;
  const size_t rounds = block == 0 ? 1 : (block + cols - 1) / cols;
  char* mem = scratch.get(4 * cols * es);
  char* stage[2] = {mem, mem + cols * es};
  char* acc[2] = {mem + 2 * cols * es, mem + 3 * cols * es};
  std::vector<transport::RequestPtr> req[2];
  std::vector<transport::RequestPtr> accSends[2];

  for (size_t round = 0; round < rounds; ++round) {
    const size_t base = round * cols;
    const size_t width = std::min(cols, block - std::min(block, base));
    const size_t np = L.pieces(width);
    auto post = [&](int s) {
      req[s % 2].clear();
      for (size_t k = 0; k < np; ++k) {
        req[s % 2].push_back(ex.recv(left, stage[s % 2] + L.pieceBegin(k) * es,
                                     L.pieceLen(width, k) * es, messageIndex(round, s, k)));
      }
    };
    post(0);
    {
      const size_t blk = static_cast<size_t>(mod(r - 1, n));
      for (size_t k = 0; k < np; ++k) {
        ex.send(right, in + (blk * block + base + L.pieceBegin(k)) * es, L.pieceLen(width, k) * es,
                messageIndex(round, 0, k));
      }
    }
    // Step s receives block r-s-2 and reduces it with the local block; the
    // result is forwarded at step s+1, or is this rank's output at the end.
    for (int s = 0; s < n - 1; ++s) {
      if (s + 1 < n - 1) post(s + 1);
      const size_t blk = static_cast<size_t>(mod(r - s - 2, n));
      const bool last = (s == n - 2);
      char* dstBase = last ? out + base * es : acc[s % 2];
      // acc[s%2] was last sent at step s-1; those sends must be done.
      for (auto& sr : accSends[s % 2]) ex.wait(sr);
      accSends[s % 2].clear();
      for (size_t k = 0; k < np; ++k) {
        ex.wait(req[s % 2][k]);
        const size_t cnt = L.pieceLen(width, k);
        char* dst = dstBase + L.pieceBegin(k) * es;
        if (cnt > 0) {
          fn(dst, in + (blk * block + base + L.pieceBegin(k)) * es,
             stage[s % 2] + L.pieceBegin(k) * es, cnt);
        }
        if (!last) {
          accSends[s % 2].push_back(ex.send(right, dst, cnt * es, messageIndex(round, s + 1, k)));
        } else if (d.op == ReduceOp::kAvg && cnt > 0) {
          kernels::divide(dst, cnt, d.dtype, n);
        }
      }
    }
    ex.waitSends();
    accSends[0].clear();
    accSends[1].clear();
  }
}

void allgatherRing(Exchange& ex, const void* inp, void* outp) {
  const OpDesc& d = ex.desc();
  const int n = ex.size(), r = ex.rank();
  const int left = mod(r - 1, n), right = mod(r + 1, n);
  const Layout L = makeLayout(d.dtype, ex.tuning());
  const size_t es = L.elemSize;
  const char* in = static_cast<const char*>(inp);
  char* out = static_cast<char*>(outp);
  const size_t block = d.count;
  char* own = out + static_cast<size_t>(r) * block * es;
  if (n == 1) {
    if (in != own && block > 0) std::memmove(own, in, block * es);
    return;
  }
  // No staging: every piece lands in its final place, so all receives are
  // posted up front. Pieces are enlarged for huge blocks to bound the count.
  Layout G = L;
  G.pieceElems = std::max(L.pieceElems, (block + kMaxPieces - 1) / kMaxPieces);
  const size_t np = G.pieces(block);
  std::vector<std::vector<transport::RequestPtr>> req(n - 1);
  for (int t = 0; t < n - 1; ++t) {
    const size_t blk = static_cast<size_t>(mod(r - t - 1, n));
    for (size_t k = 0; k < np; ++k) {
      req[t].push_back(ex.recv(left, out + (blk * block + G.pieceBegin(k)) * es,
                               G.pieceLen(block, k) * es, messageIndex(0, t, k)));
    }
  }
  for (size_t k = 0; k < np; ++k) {
    ex.send(right, in + G.pieceBegin(k) * es, G.pieceLen(block, k) * es, messageIndex(0, 0, k));
  }
  if (in != own && block > 0) std::memmove(own, in, block * es);
  for (int t = 0; t < n - 1; ++t) {
    const size_t blk = static_cast<size_t>(mod(r - t - 1, n));
    for (size_t k = 0; k < np; ++k) {
      ex.wait(req[t][k]);
      if (t + 1 < n - 1) {
        ex.send(right, out + (blk * block + G.pieceBegin(k)) * es, G.pieceLen(block, k) * es,
                messageIndex(0, t + 1, k));
      }
    }
  }
  ex.waitSends();
}

}  // namespace gflow::backend::host
