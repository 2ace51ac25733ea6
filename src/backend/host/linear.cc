// Linear gather and scatter, for large equal blocks and for uneven ones
// (gatherv, scatterv): the root exchanges one message with every other rank
// directly (all posted at once, so the transfers share the root's link), and
// the blocks land in their final place with no staging. Past the tree's
// latency advantage this is what bounds a rooted op anyway: the root's link
// carries (N-1) blocks.
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

void gatherLinear(Exchange& ex, const void* in, void* out) {
  gathervLinear(ex, in, out, Blocks::equal(ex.size(), ex.desc().count));
}

void scatterLinear(Exchange& ex, const void* in, void* out) {
  scattervLinear(ex, in, Blocks::equal(ex.size(), ex.desc().count), out);
}

void gathervLinear(Exchange& ex, const void* in, void* outp, const Blocks& blocks) {
  const OpDesc& d = ex.desc();
  const size_t es = dataTypeSize(d.dtype);
  const int me = ex.rank();
  if (me != d.root) {
    ex.send(d.root, in, blocks.counts[me] * es, 0);
    ex.waitSends();
    return;
  }
  char* out = static_cast<char*>(outp);
  std::vector<transport::RequestPtr> reqs;
  eachPeer(ex.size(), d.root, [&](int p) {
    reqs.push_back(ex.recv(p, out + blocks.offsets[p] * es, blocks.counts[p] * es, 0));
  });
  char* own = out + blocks.offsets[me] * es;
  if (blocks.counts[me] > 0 && own != in) std::memcpy(own, in, blocks.counts[me] * es);
  for (auto& r : reqs) ex.wait(r);
}

void scattervLinear(Exchange& ex, const void* inp, const Blocks& blocks, void* out) {
  const OpDesc& d = ex.desc();
  const size_t es = dataTypeSize(d.dtype);
  const int me = ex.rank();
  if (me != d.root) {
    ex.wait(ex.recv(d.root, out, blocks.counts[me] * es, 0));
    return;
  }
  const char* in = static_cast<const char*>(inp);
  eachPeer(ex.size(), d.root,
           [&](int p) { ex.send(p, in + blocks.offsets[p] * es, blocks.counts[p] * es, 0); });
  const char* own = in + blocks.offsets[me] * es;
  if (blocks.counts[me] > 0 && own != out) std::memcpy(out, own, blocks.counts[me] * es);
  ex.waitSends();
}

}  // namespace gflow::backend::host
