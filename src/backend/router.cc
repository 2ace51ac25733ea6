// The router: one Backend that hands each op to the backend implementing
// its algorithm (see backend.h).
#include "backend/backend.h"
#include "common/check.h"

#include <vector>

namespace gflow::backend {
namespace {

class Router final : public Backend {
 public:
  Router(std::unique_ptr<Backend> flat, std::unique_ptr<Backend> shm, std::unique_ptr<Backend> hier)
      : flat_(std::move(flat)), shm_(std::move(shm)), hier_(std::move(hier)) {}

  void allreduce(const Op& op, const void* in, void* out) override {
    pick(op).allreduce(op, in, out);
  }
  void reduceScatter(const Op& op, const void* in, void* out) override {
    pick(op).reduceScatter(op, in, out);
  }
  void allgather(const Op& op, const void* in, void* out) override {
    pick(op).allgather(op, in, out);
  }
  void broadcast(const Op& op, void* buf) override { pick(op).broadcast(op, buf); }
  void barrier(const Op& op) override { pick(op).barrier(op); }

  void abort(const Error& error) override {
    for (Backend* b : all()) b->abort(error);
  }
  void notifyPeers(const Error& error) override {
    for (Backend* b : all()) b->notifyPeers(error);
  }
  PeerStats peerStats(int peer) const override {
    PeerStats s;
    for (Backend* b : all()) accumulate(s, b->peerStats(peer));
    return s;
  }
  void registerMemory(void* data, size_t bytes,
                      std::vector<std::unique_ptr<transport::MemoryRegion>>* out) override {
    for (Backend* b : all()) b->registerMemory(data, bytes, out);
  }

 private:
  Backend& pick(const Op& op) {
    Backend* b = op.desc.algo == Algorithm::kShm            ? shm_.get()
                 : op.desc.algo == Algorithm::kHierarchical ? hier_.get()
                                                            : flat_.get();
    GFLOW_ENFORCE(b != nullptr);
    return *b;
  }
  std::vector<Backend*> all() const {
    std::vector<Backend*> v;
    for (Backend* b : {flat_.get(), shm_.get(), hier_.get()}) {
      if (b) v.push_back(b);
    }
    return v;
  }

  std::unique_ptr<Backend> flat_;
  std::unique_ptr<Backend> shm_;
  std::unique_ptr<Backend> hier_;
};

}  // namespace

std::unique_ptr<Backend> createRouter(std::unique_ptr<Backend> flat, std::unique_ptr<Backend> shm,
                                      std::unique_ptr<Backend> hierarchical) {
  return std::make_unique<Router>(std::move(flat), std::move(shm), std::move(hierarchical));
}

}  // namespace gflow::backend
