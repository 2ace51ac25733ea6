#include "backend/staged/staged_backend.h"

#include "backend/device_buffers.h"

namespace gflow::backend {
namespace {

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
