#include "common/arrivals.h"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace gflow {

namespace {

// The stamp's words:
//   0: elapsed us (bits 0-31, saturating), the latest rank known (bits
//      32-62), 1 (bit 63: a stamp at all);
//   1: the latest rank's start and the earliest start, each in us after the
//      sender's start (int32, saturating), in bits 0-31 and 32-63;
//   2: the sender's verdict on its previous op: last rank + 1 (bits 0-30,
//      0: none), whether it was measured (bit 31) and its skew in us (bits
//      32-63, saturating).
constexpr uint64_t kValid = uint64_t(1) << 63;

uint32_t usU32(int64_t ns) {
  const int64_t us = ns / 1000;
  return static_cast<uint32_t>(std::clamp<int64_t>(us, 0, std::numeric_limits<uint32_t>::max()));
}

uint32_t usI32(int64_t ns) {
  const int64_t us = std::clamp<int64_t>(ns / 1000, std::numeric_limits<int32_t>::min(),
                                         std::numeric_limits<int32_t>::max());
  return static_cast<uint32_t>(static_cast<int32_t>(us));
}

int64_t nsOfI32(uint64_t bits) {
  return static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(bits))) * 1000;
}

// The record's words, written by one thread: no read-modify-write.
void add(std::atomic<uint64_t>& w, uint64_t d) {
  w.store(w.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
}

// A packed verdict: last + 1 (bits 0-23, 0: none), informed (bit 24), the
// skew in ns (bits 25-63, saturating at about 9 minutes).
constexpr int kLastBits = 24;
constexpr uint64_t kSkewMax = (uint64_t(1) << 39) - 1;

}  // namespace

Arrivals::Arrivals(int rank, int size, bool enabled)
    : rank_(rank), size_(size), enabled_(enabled && size > 1) {
  if (!enabled_) return;
  const auto n = static_cast<size_t>(size);
  est_.assign(n, 0);
  touched_.reserve(n);  // note() never allocates
  estOp_.assign(n, 0);
  hour_ = TickClock::fromNs(3600LL * 1000 * 1000 * 1000);
  timesLast_ = std::make_unique<Word[]>(n);
  lateNs_ = std::make_unique<Word[]>(n);
  recent_ = std::make_unique<Word[]>(kRecent);
  summarizedTotals_ = readTotals();
}

void Arrivals::begin() {
  if (!enabled_) return;
  const OpLock lock(*this);
  heard_ = false;
  sameClock_ = false;
  // Written by this thread alone (under the op lock when concurrent).
  op_.store(op_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  entry_ = first_ = latestAt_ = now();
  latest_ = rank_;
  // note(rank_, entry_), which has nothing else to do yet.
  const auto me = static_cast<size_t>(rank_);
  estOp_[me] = op_.load(std::memory_order_relaxed);
  est_[me] = entry_;
  touched_.clear();
  touched_.push_back(rank_);
  active_.store(true, std::memory_order_release);
}

void Arrivals::note(int rank, int64_t t) {
  const auto r = static_cast<size_t>(rank);
  const uint64_t op = op_.load(std::memory_order_relaxed);
  if (estOp_[r] != op) {
    estOp_[r] = op;
    est_[r] = t;
    touched_.push_back(rank);
  } else if (t < est_[r]) {
    est_[r] = t;
  } else {
    return;
  }
  first_ = std::min(first_, t);
  if (rank == latest_ && est_[r] < latestAt_) {
    rescanLatest();
  } else if (est_[r] > latestAt_) {  // ties: the rank noted first stays
    latest_ = rank;
    latestAt_ = est_[r];
  }
}

void Arrivals::rescanLatest() {
  latest_ = rank_;
  latestAt_ = entry_;
  for (int r : touched_) {
    if (est_[static_cast<size_t>(r)] > latestAt_) {
      latest_ = r;
      latestAt_ = est_[static_cast<size_t>(r)];
    }
  }
}

ArrivalVerdict Arrivals::current() const {
  const OpLock lock(*this);
  return currentLocked();
}

ArrivalVerdict Arrivals::currentLocked() const {
  if (!active() || !heard_) return {};
  return {latest_, TickClock::toNs(latestAt_ - first_), latest_ != rank_ || sameClock_};
}

ArrivalStamp Arrivals::stamp() const {
  ArrivalStamp s;
  if (!active()) return s;
  const OpLock lock(*this);
  s.words[0] =
      usU32(TickClock::toNs(now() - entry_)) | static_cast<uint64_t>(latest_) << 32 | kValid;
  s.words[1] = usI32(TickClock::toNs(latestAt_ - entry_)) |
               static_cast<uint64_t>(usI32(TickClock::toNs(first_ - entry_))) << 32;
  if (previous_.last >= 0) {
    s.words[2] = static_cast<uint64_t>(previous_.last + 1) |
                 static_cast<uint64_t>(previous_.informed) << 31 |
                 static_cast<uint64_t>(usU32(previous_.skewNs)) << 32;
  }
  return s;
}

void Arrivals::observe(int peer, int64_t at, const ArrivalStamp& s, bool timed) {
  if (!active() || !(s.words[0] & kValid) || peer < 0 || peer >= size_ || peer == rank_) return;
  const OpLock lock(*this);
  if (!active()) return;
  const int64_t start =
      at - TickClock::fromNs(static_cast<int64_t>(static_cast<uint32_t>(s.words[0])) * 1000);
  const int64_t latestAt = start + TickClock::fromNs(nsOfI32(s.words[1]));
  const int64_t firstAt = start + TickClock::fromNs(nsOfI32(s.words[1] >> 32));
  // Read while catching up, it may have waited for this rank to look: what
  // it says happened before it was sent, so no later than this rank began.
  const int64_t bound = timed ? std::numeric_limits<int64_t>::max() : entry_;
  heard_ = true;
  note(peer, std::min(start, bound));
  const auto latest = static_cast<int>((s.words[0] >> 32) & 0x7fffffff);
  if (latest < size_ && latest != rank_) note(latest, std::min(latestAt, bound));
  first_ = std::min(first_, std::min(firstAt, bound));
  const auto prevLast = static_cast<int64_t>(s.words[2] & 0x7fffffff) - 1;
  if (prevLast >= 0 && prevLast < size_) {
    amendPrevious({static_cast<int>(prevLast),
                   static_cast<int64_t>(static_cast<uint32_t>(s.words[2] >> 32)) * 1000,
                   ((s.words[2] >> 31) & 1) != 0});
  }
}

Arrivals::View Arrivals::view() const {
  View v;
  const OpLock lock(*this);
  if (!active()) return v;
  v.entry = entry_;
  v.latest = latest_;
  v.latestAt = latestAt_;
  v.firstAt = first_;
  return v;
}

void Arrivals::merge(int rank, const View& v) {
  if (rank < 0 || rank >= size_ || rank == rank_) return;
  const OpLock lock(*this);
  if (!active()) return;
  heard_ = true;
  sameClock_ = true;
  // Another process's memory: times within an hour of this rank's start.
  auto near = [&](int64_t t) { return std::clamp(t, entry_ - hour_, entry_ + hour_); };
  note(rank, near(v.entry));
  if (v.latest >= 0 && v.latest < size_ && v.latest != rank_) note(v.latest, near(v.latestAt));
  first_ = std::min(first_, near(v.firstAt));
}

void Arrivals::count(const ArrivalVerdict& v, int sign) {
  if (v.last < 0) return;
  const auto r = static_cast<size_t>(v.last);
  add(timesLast_[r], static_cast<uint64_t>(sign));
  add(lateNs_[r], static_cast<uint64_t>(sign * v.skewNs));
  add(countedOps_, static_cast<uint64_t>(sign));
}

uint64_t Arrivals::pack(const ArrivalVerdict& v) {
  if (v.last < 0) return 0;
  const uint64_t skew =
      std::min<uint64_t>(static_cast<uint64_t>(std::max<int64_t>(v.skewNs, 0)), kSkewMax);
  return static_cast<uint64_t>(v.last + 1) | static_cast<uint64_t>(v.informed) << kLastBits |
         skew << (kLastBits + 1);
}

ArrivalVerdict Arrivals::unpack(uint64_t w) {
  const auto last = static_cast<int>(w & ((uint64_t(1) << kLastBits) - 1)) - 1;
  if (last < 0) return {};
  return {last, static_cast<int64_t>(w >> (kLastBits + 1)), ((w >> kLastBits) & 1) != 0};
}

void Arrivals::put(uint64_t op, const ArrivalVerdict& v) {
  recent_[(op - 1) % kRecent].store(pack(v), std::memory_order_relaxed);
}

bool Arrivals::better(const ArrivalVerdict& a, const ArrivalVerdict& b) {
  if (a.last < 0 || b.last < 0) return b.last < 0 && a.last >= 0;
  if (a.informed != b.informed) return a.informed;
  return a.skewNs > b.skewNs;
}

void Arrivals::amendPrevious(const ArrivalVerdict& theirs) {
  if (previousOp_ == 0 || previousOp_ + 1 != op_.load(std::memory_order_relaxed) ||
      !better(theirs, previous_)) {
    return;
  }
  count(previous_, -1);
  count(theirs, +1);
  previous_ = theirs;
  put(previousOp_, theirs);
}

void Arrivals::end() {
  const OpLock opLock(*this);
  if (!active()) return;
  const ArrivalVerdict v = currentLocked();  // measured: a later rank, or one host's clock
  active_.store(false, std::memory_order_release);
  const uint64_t op = op_.load(std::memory_order_relaxed);
  count(v, +1);
  put(op, v);
  recorded_.store(op, std::memory_order_release);
  previous_ = v;
  previousOp_ = op;
}

void Arrivals::abandon() {
  const OpLock opLock(*this);
  if (!active()) return;
  active_.store(false, std::memory_order_release);
  const uint64_t op = op_.load(std::memory_order_relaxed);
  put(op, {});
  recorded_.store(op, std::memory_order_release);
  previous_ = {};
  previousOp_ = 0;
}

void Arrivals::clearRecord() {
  if (!enabled_) return;
  const OpLock opLock(*this);
  for (int r = 0; r < size_; ++r) {
    timesLast_[static_cast<size_t>(r)].store(0, std::memory_order_relaxed);
    lateNs_[static_cast<size_t>(r)].store(0, std::memory_order_relaxed);
  }
  countedOps_.store(0, std::memory_order_relaxed);
  for (size_t i = 0; i < kRecent; ++i) recent_[i].store(0, std::memory_order_relaxed);
  recorded_.store(0, std::memory_order_release);
  previous_ = {};
  previousOp_ = 0;
  const std::lock_guard<std::mutex> lock(summaryMu_);
  summarized_ = 0;
  summarizedTotals_ = readTotals();
}

Arrivals::Totals Arrivals::readTotals() const {
  Totals t;
  if (!enabled_) return t;
  for (int r = 0; r < size_; ++r) {
    t.timesLast.push_back(timesLast_[static_cast<size_t>(r)].load(std::memory_order_relaxed));
    t.lateNs.push_back(lateNs_[static_cast<size_t>(r)].load(std::memory_order_relaxed));
  }
  t.ops = countedOps_.load(std::memory_order_relaxed);
  return t;
}

Arrivals::Totals Arrivals::totals() const {
  return readTotals();
}

std::vector<ArrivalVerdict> Arrivals::recent() const {
  std::vector<ArrivalVerdict> out;
  if (!enabled_) return out;
  const uint64_t recorded = recorded_.load(std::memory_order_acquire);
  const uint64_t n = std::min<uint64_t>(recorded, kRecent);
  for (uint64_t op = recorded - n + 1; op <= recorded; ++op) {
    out.push_back(unpack(recent_[(op - 1) % kRecent].load(std::memory_order_relaxed)));
  }
  return out;
}

std::string Arrivals::summary(bool sinceLast) {
  if (!enabled_) return "";
  const std::lock_guard<std::mutex> lock(summaryMu_);
  const uint64_t recorded = recorded_.load(std::memory_order_acquire);
  const Totals now = readTotals();
  const Totals& base = summarizedTotals_;
  const uint64_t from = sinceLast ? summarized_ : 0;
  const uint64_t ops =
      std::max<int64_t>(0, static_cast<int64_t>(now.ops - (sinceLast ? base.ops : 0)));
  // A verdict amended after the last summary may move a count below it.
  size_t top = 0;
  uint64_t topCount = 0;
  for (size_t r = 0; r < now.timesLast.size(); ++r) {
    const auto c = static_cast<int64_t>(now.timesLast[r] - (sinceLast ? base.timesLast[r] : 0));
    if (c > static_cast<int64_t>(topCount)) top = r, topCount = static_cast<uint64_t>(c);
  }
  if (sinceLast) summarized_ = recorded, summarizedTotals_ = now;
  if (ops == 0 || topCount == 0) return "";
  topCount = std::min(topCount, ops);
  std::vector<int64_t> skews;  // the top rank's, over the ops still in the ring
  for (uint64_t op = std::max(from, recorded - std::min<uint64_t>(recorded, kRecent)) + 1;
       op <= recorded; ++op) {
    const ArrivalVerdict v = unpack(recent_[(op - 1) % kRecent].load(std::memory_order_relaxed));
    if (v.last == static_cast<int>(top)) skews.push_back(v.skewNs);
  }
  double median = 0;
  if (!skews.empty()) {
    std::nth_element(skews.begin(), skews.begin() + static_cast<std::ptrdiff_t>(skews.size() / 2),
                     skews.end());
    median = static_cast<double>(skews[skews.size() / 2]) / 1e6;
  }
  const double pct = 100.0 * static_cast<double>(topCount) / static_cast<double>(ops);
  char buf[200];
  if (2 * topCount > ops) {
    std::snprintf(buf, sizeof(buf), "rank %zu was last in %.0f%% of %llu ops, median skew %.2f ms",
                  top, pct, static_cast<unsigned long long>(ops), median);
  } else {
    std::snprintf(buf, sizeof(buf),
                  "no rank was last in most of %llu ops (most often rank %zu, %.0f%%, median "
                  "skew %.2f ms)",
                  static_cast<unsigned long long>(ops), top, pct, median);
  }
  return buf;
}

}  // namespace gflow
