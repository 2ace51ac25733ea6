#include "backend/host/exchange.h"

namespace gflow::backend::host {

RollCall::RollCall(Exchange& ex) : ex_(ex) {
  const int n = ex.size(), root = ex.desc().root;
  if (ex.rank() != root) {
    recvs_.push_back(ex.recv(root, nullptr, 0, kOpen));
    recvs_.push_back(ex.recv(root, nullptr, 0, kClose));
    ex.send(root, nullptr, 0, kHello);
    return;
  }
  for (int p = 0; p < n; ++p) {
    if (p == root) continue;
    recvs_.push_back(ex.recv(p, nullptr, 0, kHello));
    ex.send(p, nullptr, 0, kOpen);
  }
}

void RollCall::finish() {
  for (auto& r : recvs_) ex_.wait(r);
  if (ex_.rank() == ex_.desc().root) {
    for (int p = 0; p < ex_.size(); ++p) {
      if (p != ex_.rank()) ex_.send(p, nullptr, 0, kClose);
    }
  }
  ex_.waitSends();
}

}  // namespace gflow::backend::host
