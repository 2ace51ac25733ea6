// The host backend: gflow's own algorithms over a Transport context.
#include <cstring>

#include "backend/host/exchange.h"
#include "common/check.h"
#include "common/params.h"

namespace gflow::backend::host {

RingTuning ringTuning() {
  static const RingTuning t = [] {
    RingTuning r;
    r.pieceBytes = std::max<uint64_t>(params::pieceBytes(), 64);
    r.window = static_cast<size_t>(std::max<int64_t>(params::ringWindow(), 1));
    return r;
  }();
  return t;
}

namespace {

class HostBackend final : public Backend {
 public:
  explicit HostBackend(std::unique_ptr<transport::Context> ctx)
      : ctx_(std::move(ctx)), scratch_(*ctx_) {
    ctx_->setEnvelopeFormatter(describe);
  }

  void allreduce(const Op& op, const void* in, void* out) override {
    Exchange ex(*ctx_, op);
    if (op.desc.algo == Algorithm::kRecursiveDoubling) {
      allreduceRecursiveDoubling(ex, scratch_, in, out);
    } else {
      allreduceRing(ex, scratch_, in, out);
    }
  }
  void reduceScatter(const Op& op, const void* in, void* out) override {
    Exchange ex(*ctx_, op);
    reduceScatterRing(ex, scratch_, in, out);
  }
  void allgather(const Op& op, const void* in, void* out) override {
    Exchange ex(*ctx_, op);
    allgatherRing(ex, in, out);
  }
  void broadcast(const Op& op, void* buf) override {
    Exchange ex(*ctx_, op);
    broadcastChain(ex, buf);
  }
  void barrier(const Op& op) override {
    Exchange ex(*ctx_, op);
    barrierDissemination(ex);
  }
  void abort(const Error& error) override { ctx_->abort(error); }
  void notifyPeers(const Error& error) override { ctx_->notifyPeers(error); }
  PeerStats peerStats(int peer) const override { return ctx_->peerStats(peer); }
  void registerMemory(void* data, size_t bytes,
                      std::vector<std::unique_ptr<transport::MemoryRegion>>* out) override {
    out->push_back(ctx_->registerMemory(data, bytes));
  }

 private:
  std::unique_ptr<transport::Context> ctx_;
  Scratch scratch_;
};

}  // namespace
}  // namespace gflow::backend::host

namespace gflow::backend {
std::unique_ptr<Backend> createHostBackend(std::unique_ptr<transport::Context> context) {
  return std::make_unique<host::HostBackend>(std::move(context));
}
}  // namespace gflow::backend
