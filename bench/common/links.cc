#include "common/links.h"

#include <algorithm>

#include "common/sweep.h"

namespace gflow::bench {

namespace {

double maxOf(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

}  // namespace

double LinkBytes::maxNetworkSent() const {
  return maxOf(networkSent);
}

double LinkBytes::maxLocalSent() const {
  return maxOf(localSent);
}

bool LinkBytes::busbwAboveBusiest(double busbw, double timeUs) const {
  if (timeUs <= 0) return false;
  const double linkGBs = busiest / (timeUs * 1e3);  // bytes/us/1e3 = GB/s
  return busbw > linkGBs * 1.01;
}

LinkBytes gatherLinks(Backend& be, const std::vector<PeerLink>& before,
                      const std::vector<PeerLink>& after, int iters) {
  const int n = be.size(), me = be.rank();
  const size_t cells = static_cast<size_t>(n) * static_cast<size_t>(n);
  // This rank fills its column: what each rank sent to it, then whether
  // that rank shares its host. One sum gives every rank the whole matrix.
  std::vector<int64_t> v(2 * cells, 0);
  for (int from = 0; from < n && static_cast<size_t>(from) < after.size(); ++from) {
    const size_t at = static_cast<size_t>(from) * static_cast<size_t>(n) + static_cast<size_t>(me);
    const uint64_t a = after[from].received, b = before[from].received;
    v[at] = a > b ? static_cast<int64_t>(a - b) : 0;
    v[cells + at] = after[from].sameHost ? 1 : 0;
  }
  be.sumOverRanks(v);
  LinkBytes l;
  l.ranks = n;
  l.pair.resize(cells);
  l.sameHost.resize(cells);
  for (auto* sums : {&l.networkSent, &l.localSent, &l.networkReceived, &l.localReceived}) {
    sums->assign(static_cast<size_t>(n), 0);
  }
  for (size_t i = 0; i < cells; ++i) {
    const int from = static_cast<int>(i / static_cast<size_t>(n));
    const int to = static_cast<int>(i % static_cast<size_t>(n));
    l.pair[i] = static_cast<double>(v[i]) / std::max(1, iters);
    l.sameHost[i] = static_cast<uint8_t>(v[cells + i] != 0);
    if (from != to) {
      (l.sameHost[i] ? l.localSent : l.networkSent)[static_cast<size_t>(from)] += l.pair[i];
      (l.sameHost[i] ? l.localReceived : l.networkReceived)[static_cast<size_t>(to)] += l.pair[i];
    }
  }
  const struct {
    const std::vector<double>* moved;
    bool network, send;
  } links[] = {{&l.networkSent, true, true},
               {&l.networkReceived, true, false},
               {&l.localSent, false, true},
               {&l.localReceived, false, false}};
  for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
    for (const auto& link : links) {
      if ((*link.moved)[r] <= l.busiest) continue;
      l.busiest = (*link.moved)[r];
      l.busiestRank = static_cast<int>(r);
      l.busiestIsNetwork = link.network;
      l.busiestIsSend = link.send;
    }
  }
  return l;
}

}  // namespace gflow::bench
