#include "backend/staged/staged_backend.h"

#include "backend/device_buffers.h"

namespace gflow::backend {
namespace {

// A point-to-point op that already completed.
class Done final : public P2PInFlight {
 public:
  explicit Done(std::vector<P2PMessage> msgs) : msgs_(std::move(msgs)) {}
  bool test() override { return true; }
  void wait() override {}
  const std::vector<P2PMessage>& messages() const override { return msgs_; }

 private:
  std::vector<P2PMessage> msgs_;
};

class StagedBackend final : public Backend {
 public:
  explicit StagedBackend(Backend& inner) : inner_(inner) {}

  void allreduce(const Op& op, const void* in, void* out) override {
    staged(op, [&](DeviceBuffers& b) { inner_.allreduce(op, b.host(in), b.host(out)); });
  }
  void reduceScatter(const Op& op, const void* in, void* out) override {
    staged(op, [&](DeviceBuffers& b) { inner_.reduceScatter(op, b.host(in), b.host(out)); });
  }
  void allgather(const Op& op, const void* in, void* out) override {
    staged(op, [&](DeviceBuffers& b) { inner_.allgather(op, b.host(in), b.host(out)); });
  }
  void broadcast(const Op& op, void* buf) override {
    staged(op, [&](DeviceBuffers& b) { inner_.broadcast(op, b.host(buf)); });
  }
  void barrier(const Op& op) override { inner_.barrier(op); }
  void reduce(const Op& op, const void* in, void* out) override {
    staged(op, [&](DeviceBuffers& b) { inner_.reduce(op, b.host(in), b.host(out)); });
  }
  void gather(const Op& op, const void* in, void* out) override {
    staged(op, [&](DeviceBuffers& b) { inner_.gather(op, b.host(in), b.host(out)); });
  }
  void scatter(const Op& op, const void* in, void* out) override {
    staged(op, [&](DeviceBuffers& b) { inner_.scatter(op, b.host(in), b.host(out)); });
  }
  void alltoall(const Op& op, const void* in, void* out) override {
    staged(op, [&](DeviceBuffers& b) { inner_.alltoall(op, b.host(in), b.host(out)); });
  }
  void alltoallv(const Op& op, const void* in, const Blocks& inBlocks, void* out,
                 const Blocks& outBlocks) override {
    staged(op, [&](DeviceBuffers& b) {
      inner_.alltoallv(op, b.host(in), inBlocks, b.host(out), outBlocks);
    });
  }
  void gatherv(const Op& op, const void* in, void* out, const Blocks& blocks) override {
    staged(op, [&](DeviceBuffers& b) { inner_.gatherv(op, b.host(in), b.host(out), blocks); });
  }
  void scatterv(const Op& op, const void* in, const Blocks& blocks, void* out) override {
    staged(op, [&](DeviceBuffers& b) { inner_.scatterv(op, b.host(in), blocks, b.host(out)); });
  }
  // Runs to completion: the results go back to the device before it
  // returns (an async op on device buffers completes in order).
  std::unique_ptr<P2PInFlight> startPointToPoint(const Op& op,
                                                 std::vector<P2PMessage> msgs) override {
    staged(op, [&](DeviceBuffers& b) {
      std::vector<P2PMessage> onHost = msgs;
      for (P2PMessage& m : onHost) m.data = b.host(m.data);
      auto inFlight = inner_.startPointToPoint(op, std::move(onHost));
      inFlight->wait();
      for (size_t i = 0; i < msgs.size(); ++i) msgs[i].source = inFlight->messages()[i].source;
    });
    return std::make_unique<Done>(std::move(msgs));
  }
  const char* name() const override { return "staged"; }

  // The inner backend is the caller's; it aborts, notifies and counts it.
  void abort(const Error&) override {}
  void notifyPeers(const Error&) override {}
  PeerStats peerStats(int) const override { return {}; }
  void registerMemory(void*, size_t,
                      std::vector<std::unique_ptr<transport::MemoryRegion>>*) override {}

 private:
  template <typename F>
  void staged(const Op& op, F&& run) {
    DeviceBuffers& b = *op.buffers;
    if (!pool_) pool_ = std::make_unique<StagingPool>(b.plugin());
    b.toHost(*pool_);
    run(b);
    b.toDevice(*pool_);
  }

  Backend& inner_;
  std::unique_ptr<StagingPool> pool_;  // on the first device op
};

}  // namespace

std::unique_ptr<Backend> createStagedBackend(Backend& inner) {
  return std::make_unique<StagedBackend>(inner);
}

}  // namespace gflow::backend
