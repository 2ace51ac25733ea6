// The host backend: gflow's own algorithms over a Transport context.
#include <cstring>

#include "backend/host/exchange.h"
#include "common/check.h"
#include "common/params.h"

namespace gflow::backend::host {

RingTuning ringTuning(const TuningOptions& given) {
  RingTuning r;
  r.pieceBytes =
      std::max<uint64_t>(given.pieceBytes ? *given.pieceBytes : params::pieceBytes(), 64);
  r.window = static_cast<size_t>(
      std::max<int64_t>(given.ringWindow ? *given.ringWindow : params::ringWindow(), 1));
  return r;
}

namespace {

class HostBackend final : public Backend {
 public:
  HostBackend(std::unique_ptr<transport::Context> ctx, const TuningOptions& tuning)
      : ctx_(std::move(ctx)), tuning_(ringTuning(tuning)), scratch_(*ctx_) {
    ctx_->setEnvelopeFormatter(describe);
  }

  void allreduce(const Op& op, const void* in, void* out) override {
    Exchange ex(*ctx_, op, tuning_);
    switch (op.desc.route.algo) {
      case Algorithm::kFixedOrder: return allreduceFixedOrder(ex, scratch_, in, out);
      case Algorithm::kRecursiveDoubling: return allreduceRecursiveDoubling(ex, scratch_, in, out);
      case Algorithm::kHalvingDoubling: return allreduceHalvingDoubling(ex, scratch_, in, out);
      default: return allreduceRing(ex, scratch_, in, out);
    }
  }
  void reduceScatter(const Op& op, const void* in, void* out) override {
    Exchange ex(*ctx_, op, tuning_);
    if (op.desc.route.algo == Algorithm::kFixedOrder)
      return reduceScatterFixedOrder(ex, scratch_, in, out);
    reduceScatterRing(ex, scratch_, in, out);
  }
  void allgather(const Op& op, const void* in, void* out) override {
    Exchange ex(*ctx_, op, tuning_);
    allgatherRing(ex, in, out);
  }
  void broadcast(const Op& op, void* buf) override {
    Exchange ex(*ctx_, op, tuning_);
    broadcastChain(ex, buf);
  }
  void barrier(const Op& op) override {
    Exchange ex(*ctx_, op, tuning_);
    barrierDissemination(ex);
  }
  void reduce(const Op& op, const void* in, void* out) override {
    rooted(op, [&](Exchange& ex) {
      if (op.desc.route.algo == Algorithm::kChain) return reduceChain(ex, scratch_, in, out);
      reduceBinomial(ex, scratch_, in, out);
    });
  }
  void gather(const Op& op, const void* in, void* out) override {
    rooted(op, [&](Exchange& ex) {
      if (op.desc.route.algo == Algorithm::kLinear) return gatherLinear(ex, in, out);
      gatherBinomial(ex, scratch_, in, out);
    });
  }
  void scatter(const Op& op, const void* in, void* out) override {
    rooted(op, [&](Exchange& ex) {
      if (op.desc.route.algo == Algorithm::kLinear) return scatterLinear(ex, in, out);
      scatterBinomial(ex, scratch_, in, out);
    });
  }
  void alltoall(const Op& op, const void* in, void* out) override {
    Exchange ex(*ctx_, op, tuning_);
    alltoallPairwise(ex, in, out);
  }
  void alltoallv(const Op& op, const void* in, const Blocks& inBlocks, void* out,
                 const Blocks& outBlocks) override {
    Exchange ex(*ctx_, op, tuning_);
    alltoallvPairwise(ex, in, inBlocks, out, outBlocks);
  }
  void gatherv(const Op& op, const void* in, void* out, const Blocks& blocks) override {
    rooted(op, [&](Exchange& ex) { gathervLinear(ex, in, out, blocks); });
  }
  void scatterv(const Op& op, const void* in, const Blocks& blocks, void* out) override {
    rooted(op, [&](Exchange& ex) { scattervLinear(ex, in, blocks, out); });
  }
  std::unique_ptr<P2PInFlight> startPointToPoint(const Op& op,
                                                 std::vector<P2PMessage> msgs) override {
    return startPointToPointDirect(*ctx_, op, p2pOrder_, std::move(msgs));
  }
  const char* name() const override { return "host"; }

  void abort(const Error& error) override { ctx_->abort(error); }
  void notifyPeers(const Error& error) override { ctx_->notifyPeers(error); }
  std::vector<Error> awaitReports(Deadline until, int exclude) override {
    return ctx_->awaitReports(until, exclude);
  }
  bool reject(uint64_t seq, const std::string& why) override {
    ctx_->reject(seq, why);
    return true;
  }
  PeerStats peerStats(int peer) const override { return ctx_->peerStats(peer); }
  void answerProbes() override { ctx_->poll(); }
  void setWhileWaiting(std::function<void()> hook) override {
    ctx_->setWhileWaiting(std::move(hook));
  }
  void registerMemory(void* data, size_t bytes,
                      std::vector<std::unique_ptr<transport::MemoryRegion>>* out) override {
    out->push_back(ctx_->registerMemory(data, bytes));
  }

 private:
  // A rooted op: its algorithm inside the roll call (exchange.h).
  template <typename F>
  void rooted(const Op& op, F&& run) {
    Exchange ex(*ctx_, op, tuning_);
    RollCall call(ex);
    run(ex);
    call.finish();
  }

  std::unique_ptr<transport::Context> ctx_;
  const RingTuning tuning_;
  Scratch scratch_;
  P2POrder p2pOrder_;
};

}  // namespace
}  // namespace gflow::backend::host

namespace gflow::backend {
std::unique_ptr<Backend> createHostBackend(std::unique_ptr<transport::Context> context,
                                           const TuningOptions& tuning) {
  return std::make_unique<host::HostBackend>(std::move(context), tuning);
}
}  // namespace gflow::backend
