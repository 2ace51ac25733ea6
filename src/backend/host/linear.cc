// Linear gather and scatter for large blocks: the root exchanges one
// message with every other rank directly (all posted at once, so the
// transfers share the root's link), and the blocks land in their final
// place with no staging. Past the tree's latency advantage this is what
// bounds a rooted op anyway: the root's link carries (N-1) blocks.
#include <cstring>
#include <vector>

#include "backend/host/exchange.h"

namespace gflow::backend::host {
namespace {

// The peers in the order the root serves them: root+1, root+2, ...
template <typename F>
void eachPeer(int n, int root, F&& f) {
  for (int s = 1; s < n; ++s) f((root + s) % n);
}

}  // namespace

void gatherLinear(Exchange& ex, const void* in, void* outp) {
  const OpDesc& d = ex.desc();
  const size_t block = d.count * dataTypeSize(d.dtype);
  if (ex.rank() != d.root) {
    ex.send(d.root, in, block, 0);
    ex.waitSends();
    return;
  }
  char* out = static_cast<char*>(outp);
  std::vector<transport::RequestPtr> reqs;
  eachPeer(ex.size(), d.root, [&](int p) {
    reqs.push_back(ex.recv(p, out + static_cast<size_t>(p) * block, block, 0));
  });
  char* own = out + static_cast<size_t>(d.root) * block;
  if (block > 0 && own != in) std::memcpy(own, in, block);
  for (auto& r : reqs) ex.wait(r);
}

void scatterLinear(Exchange& ex, const void* inp, void* out) {
  const OpDesc& d = ex.desc();
  const size_t block = d.count * dataTypeSize(d.dtype);
  if (ex.rank() != d.root) {
    ex.wait(ex.recv(d.root, out, block, 0));
    return;
  }
  const char* in = static_cast<const char*>(inp);
  eachPeer(ex.size(), d.root,
           [&](int p) { ex.send(p, in + static_cast<size_t>(p) * block, block, 0); });
  const char* own = in + static_cast<size_t>(d.root) * block;
  if (block > 0 && own != out) std::memcpy(out, own, block);
  ex.waitSends();
}

}  // namespace gflow::backend::host
