#include "backend/shm/group.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <random>
#include <sstream>
#include <thread>

#include "common/check.h"
#include "common/logging.h"
#include "common/params.h"
#include "common/peer_memory.h"
#include "common/tick_clock.h"
#include "transport/contract.h"

namespace gflow::backend::shm {

namespace {

constexpr uint64_t kMagic = 0x676677736d310005ull;  // "gflwsm1" + layout version
constexpr size_t kPage = 4096;
// How long a waiter polls (spinning, or yielding when oversubscribed) before
// it sleeps on the futex. Collective phases are short, so most waits end here.
constexpr auto kPollTime = std::chrono::microseconds(2000);
// Futex sleeps are sliced so deadlines, aborts and dead peers are noticed.
constexpr int64_t kSleepSliceUs = 2000;
// How often a sleeping wait runs the companion transport's hook: well within
// the smallest probe grace (50 ms), rarely enough to cost nothing.
constexpr auto kHookPeriod = std::chrono::milliseconds(10);

size_t roundUp(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::string printable(const char* p, size_t cap) {
  std::string s(p, strnlen(p, cap));
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return s;
}

// OpRecord's offsets: ticks per unit.
constexpr int64_t kOffTicks = 1024;

}  // namespace

struct OpRecord {
  std::atomic<uint64_t> number;  // ops this member has started on the group
  uint64_t seq;                  // the op's sequence number (for messages)
  uint64_t env[3];
  // The owner's arrival view of the op (Arrivals::View, in this host's
  // ticks), written with the rest before `number`: in the line its peers
  // read anyway. Overwritten only two ops later, after a sync of the next
  // op that every member must pass, so it is read at endOp without a check.
  int64_t entry;
  // The latest and earliest starts after `entry`, in units of kOffTicks ticks
  // (about 0.4 us for a 2-3 GHz TSC; saturating at 2^31 of them, 12-18
  // minutes).
  int32_t latestOff, firstOff;
  int32_t latest;  // that rank (the Arrivals' numbering)
  int32_t spare;
};
static_assert(sizeof(OpRecord) == 64, "an op record is one cache line");

// The op's buffers in the owner's address space, for single-copy reads.
struct BufferRecord {
  uint64_t in, out;
  uint32_t readable;  // the owner could read both by single copy itself
};

// The control block at the start of every segment. Only its owner writes it,
// except `waiters`, which the members waiting on the owner count in, and
// `pings`, which they raise to probe it.
struct Control {
  uint64_t magic;
  uint64_t nonce;
  uint64_t totalBytes;
  uint64_t slotBytes;
  int32_t pid;
  int32_t members;
  alignas(64) std::atomic<uint64_t> tick;  // last sync point reached
  alignas(64) std::atomic<uint32_t> wakeSeq;
  std::atomic<uint32_t> waiters;
  alignas(64) OpRecord ops[2];          // by op number parity
  alignas(64) BufferRecord buffers[2];  // likewise
  alignas(64) std::atomic<uint32_t> failed;
  std::atomic<uint32_t> left;               // the owner destroyed its group (process may live on)
  alignas(64) std::atomic<uint64_t> pings;  // probes raised by waiters
  std::atomic<uint64_t> pongs;              // the owner's answer: pings seen
  uint32_t code;
  int32_t culprit;     // the rank the owner's error blames (communicator numbering)
  uint64_t failedSeq;  // the op of that error (communicator numbering)
  uint64_t failedOp;   // op number the owner was in when it failed
  char message[1024];
  alignas(64) std::atomic<uint64_t> rejected;  // 1 + seq of the last op the owner rejected
  char rejectedWhy[256];
};

namespace {

size_t controlBytes(int members) {
  return roundUp(roundUp(sizeof(Control), 64) + sizeof(std::atomic<uint64_t>) * members, kPage);
}

std::atomic<uint64_t>* readCounters(Control* c) {
  return reinterpret_cast<std::atomic<uint64_t>*>(reinterpret_cast<char*>(c) +
                                                  roundUp(sizeof(Control), 64));
}

std::vector<uint8_t> bytesOf(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

}  // namespace

namespace {

// Creates this member's segment in *own and writes its control block;
// "" on success, else why this member cannot take part.
std::string createSegment(Mapping* own, size_t total, size_t slotBytes, int members,
                          uint64_t* nonce) {
  try {
    *own = Mapping::create(total);
    std::random_device rd;
    *nonce = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(::getpid()) << 16;
    auto* c = new (own->data()) Control();
    c->magic = kMagic;
    c->nonce = *nonce;
    c->totalBytes = total;
    c->slotBytes = slotBytes;
    c->pid = ::getpid();
    c->members = members;
    for (int i = 0; i < members; ++i) new (&readCounters(c)[i]) std::atomic<uint64_t>(0);
  } catch (const Error& e) {
    return e.detail();
  } catch (const std::exception& e) {  // e.g. std::random_device
    return e.what();
  }
  return "";
}

// What a member publishes of its segment besides the fd: its pid, the
// segment's nonce and where the nonce lies in its address space (for the
// single-copy probe).
struct PeerInfo {
  long pid = 0;
  uint64_t nonce = 0;
  uint64_t nonceAddr = 0;
};

// The store key of member p's segment description.
std::string segmentKey(const GroupOptions& o, int p) {
  return o.prefix + "shm/seg/" + std::to_string(p);
}

// Maps member p's segment, published under segmentKey as "pid fd nonce total
// nonceAddr" (`v`), into *mapping and watches its process; "" on success, else
// why not. The store proves only the token; the segment proves itself: its
// fd opens through /proc/<pid>/fd (ptrace-read rights on that process) as a
// sealed memfd of this group's size, with gflow's magic, the published
// nonce and the member count. Values read from a member's control block
// later are data (op records, reports cut to their arrays and made
// printable), never sizes or indexes.
// Where mapPeer puts what it maps and learns.
struct PeerMapping {
  Mapping* mapping;
  ProcessWatch* watch;
  PeerInfo* info;
};

std::string mapPeer(const GroupOptions& o, int p, const std::vector<uint8_t>& v, size_t total,
                    PeerMapping out) {
  Mapping* mapping = out.mapping;
  ProcessWatch* watch = out.watch;
  PeerInfo* info = out.info;
  std::istringstream is(std::string(v.begin(), v.end()));
  int fd = -1;
  uint64_t peerTotal = 0;
  if (!(is >> info->pid >> fd >> info->nonce >> peerTotal >> info->nonceAddr) ||
      peerTotal != total) {
    return "local rank " + std::to_string(p) + " has no usable segment";
  }
  std::string err;
  *mapping = Mapping::open(static_cast<pid_t>(info->pid), fd, total, &err);
  if (!mapping->data()) return "local rank " + std::to_string(p) + ": " + err;
  auto* c = static_cast<Control*>(mapping->data());
  if (c->magic != kMagic || c->nonce != info->nonce || c->members != o.size) {
    return "the segment of local rank " + std::to_string(p) + " is not gflow's";
  }
  // A member in this process (ranks as threads) dies only with us; its
  // leaving is seen through `left`. No pidfd for it: polling a pidfd of our
  // own process can only mislead (a closed and reused descriptor number
  // reads as "exited").
  if (static_cast<pid_t>(info->pid) != ::getpid())
    *watch = ProcessWatch(static_cast<pid_t>(info->pid));
  return "";
}

// Everyone learns whether everyone could map everything: publishes `mine`
// ("" if this member can take part) and whether it can read every peer's
// memory (`canRead`), and returns the first member's reason not to take
// part, "" when all can. *allCanRead: every member can read every peer.
// A member's "can read" is its word only, and needs no proof: what it
// unlocks is each member's buffer addresses in its own segment, which a
// member has mapped already, and reads this member makes from its own
// verified probes (a liar that cannot read fails its own ops).
std::string firstFailure(const GroupOptions& o, const std::vector<int>& commRanks,
                         const std::string& mine, bool canRead, bool* allCanRead) {
  const std::string okKey = o.prefix + "shm/ok/";
  o.store->set(okKey + std::to_string(o.rank), bytesOf(!mine.empty() ? "0" + mine
                                                       : canRead     ? "1r"
                                                                     : "1"));
  std::vector<std::string> keys;
  for (int p = 0; p < o.size; ++p) keys.push_back(okKey + std::to_string(p));
  const std::vector<std::vector<uint8_t>> words = o.store->multiGet(keys, o.timeout);
  std::string first;
  *allCanRead = true;
  for (int p = 0; p < o.size; ++p) {
    std::string s(words[p].begin(), words[p].end());
    if (s != "1r") *allCanRead = false;
    if (s != "1" && s != "1r" && first.empty()) {
      first = "local rank " + std::to_string(p) + " (rank " + std::to_string(commRanks[p]) +
              "): " + (s.empty() ? std::string("?") : s.substr(1));
    }
  }
  return first;
}

}  // namespace

std::unique_ptr<Group> Group::connect(const GroupOptions& o, std::string* why) {
  std::unique_ptr<Group> g(new Group());
  g->rank_ = o.rank;
  g->size_ = o.size;
  g->describe_ = o.describe;
  g->timeout_ = o.timeout;
  g->commRanks_ = o.commRanks;
  if (g->commRanks_.empty()) {
    for (int i = 0; i < o.size; ++i) g->commRanks_.push_back(i);
  }
  if (o.arrivals && o.arrivals->enabled()) g->arrivals_ = o.arrivals;
  g->arrivalRanks_ = o.arrivalRanks.empty() ? g->commRanks_ : o.arrivalRanks;
  size_t slot = o.slotBytes ? o.slotBytes : params::shmChunk();
  // Reduce-scatter puts one element of every block in a slot at least.
  slot = std::max<size_t>({slot, 4096, static_cast<size_t>(o.size) * 64});
  g->slotBytes_ = roundUp(slot, 64);
  const size_t ctlBytes = controlBytes(o.size);
  const size_t total = ctlBytes + 2 * g->slotBytes_;
  // Cores this process may run on (cpusets, taskset, Slurm), not the machine's.
  cpu_set_t allowed;
  long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) == 0) cores = CPU_COUNT(&allowed);
  g->oversubscribed_ = o.size > std::max(1L, cores);

  uint64_t nonce = 0;
  // Why this member cannot take part ("" if it can).
  std::string mine = createSegment(&g->own_, total, g->slotBytes_, o.size, &nonce);
  std::ostringstream desc;
  desc << ::getpid() << " " << g->own_.fd() << " " << nonce << " " << total << " "
       << reinterpret_cast<uintptr_t>(mine.empty() ? &static_cast<Control*>(g->own_.data())->nonce
                                                   : nullptr);
  o.store->set(segmentKey(o, o.rank), bytesOf(mine.empty() ? desc.str() : "x"));

  g->peers_.resize(o.size);
  g->ctl_.assign(o.size, nullptr);
  g->slots_.assign(o.size, nullptr);
  g->watch_.resize(o.size);
  g->pids_.assign(o.size, ::getpid());
  bool canRead = o.probeSingleCopy;
  std::string noRead;  // why this member cannot read its peers' memory
  // Every member's description in one store request.
  std::vector<std::string> keys;
  for (int p = 0; p < o.size; ++p) keys.push_back(segmentKey(o, p));
  const std::vector<std::vector<uint8_t>> descs = o.store->multiGet(keys, o.timeout);
  for (int p = 0; p < o.size && mine.empty(); ++p) {
    PeerInfo info;
    if (p != o.rank) mine = mapPeer(o, p, descs[p], total, {&g->peers_[p], &g->watch_[p], &info});
    if (!mine.empty()) break;
    if (p != o.rank) {
      g->pids_[p] = static_cast<pid_t>(info.pid);
      if (canRead && !probePeerMemory(g->pids_[p], info.nonceAddr, info.nonce, &noRead)) {
        noRead = "local rank " + std::to_string(p) + ": " + noRead;
        canRead = false;
      }
    }
    Mapping& m = p == o.rank ? g->own_ : g->peers_[p];
    g->ctl_[p] = static_cast<Control*>(m.data());
    g->slots_[p] = static_cast<char*>(m.data()) + ctlBytes;
  }

  std::string first = firstFailure(o, g->commRanks_, mine, canRead, &g->singleCopy_);
  if (!first.empty()) {
    *why = first;
    return nullptr;
  }
  if (!noRead.empty()) {
    GFLOW_LOG(INFO) << "shared memory: no single-copy reads (shared segments only): " << noRead;
  }
  // Every member has opened our memfd; the mappings keep it alive.
  g->own_.closeFd();
  g->readFrom_.resize(o.size);
  for (int p = 0; p < o.size; ++p) g->readFrom_[p] = &readCounters(g->ctl_[o.rank])[p];
  return g;
}

Group::~Group() {
  // Peers waiting on this member in a later op fail now (kPeerLost) instead
  // of waiting for their deadline.
  if (ctl_.empty() || ctl_[rank_] == nullptr) return;
  Control* c = ctl_[rank_];
  c->left.store(1, std::memory_order_release);
  c->wakeSeq.fetch_add(1, std::memory_order_seq_cst);
  futexWake(reinterpret_cast<uint32_t*>(&c->wakeSeq));
}

void Group::beginOp(uint64_t seq, const Envelope& env, Deadline deadline) {
  if (auto e = error()) throw *e;
  seq_ = seq;
  env_ = env;
  deadline_ = deadline;
  ++ops_;
  OpRecord& r = ctl_[rank_]->ops[ops_ & 1];
  r.seq = seq;
  std::memcpy(r.env, env.words, sizeof(r.env));
  publishArrival(r);
  r.number.store(ops_, std::memory_order_release);
  opChecked_ = false;
  inOp_ = true;
}

void Group::endOp() {
  if (inOp_) mergeArrivals();
  inOp_ = false;
}

void Group::publishArrival(OpRecord& r) const {
  const Arrivals::View v = arrivals_ ? arrivals_->view() : Arrivals::View{};
  auto off = [&](int64_t at) {
    return static_cast<int32_t>(
        std::clamp<int64_t>((at - v.entry) / kOffTicks, INT32_MIN, INT32_MAX));
  };
  r.entry = v.entry;
  r.latestOff = off(v.latestAt);
  r.firstOff = off(v.firstAt);
  r.latest = v.latest;  // -1: no view (no op running, or off)
}

// After the op's last sync every member has published its view of it.
void Group::mergeArrivals() {
  if (!arrivals_ || !arrivals_->active()) return;
  for (int m = 0; m < size_; ++m) {
    if (m == rank_) continue;
    const OpRecord& r = ctl_[m]->ops[ops_ & 1];
    if (r.number.load(std::memory_order_acquire) != ops_ || r.latest < 0) continue;
    Arrivals::View v;
    v.entry = r.entry;
    v.latest = r.latest;
    v.latestAt = r.entry + int64_t{r.latestOff} * kOffTicks;
    v.firstAt = r.entry + int64_t{r.firstOff} * kOffTicks;
    arrivals_->merge(arrivalRanks_[m], v);
  }
}

void Group::publishBuffers(const void* in, size_t inBytes, const void* out, size_t outBytes) {
  BufferRecord& r = ctl_[rank_]->buffers[ops_ & 1];
  r.in = reinterpret_cast<uintptr_t>(in);
  r.out = reinterpret_cast<uintptr_t>(out);
  r.readable = ownBuffersReadable(in, inBytes, out, outBytes) ? 1 : 0;
  if (!r.readable && !warnedUnreadable_) {
    warnedUnreadable_ = true;
    GFLOW_LOG(INFO) << "rank " << commRanks_[rank_]
                    << ": process_vm_readv cannot read this op's buffers (memory the kernel "
                       "cannot pin, e.g. a driver's mapping); ops on such buffers go through "
                       "the shared segments";
  }
}

bool Group::publishedReadable() const {
  for (int m = 0; m < size_; ++m) {
    if (!ctl_[m]->buffers[ops_ & 1].readable) return false;
  }
  return true;
}

ErrorContext Group::context(int member) const {
  return ErrorContext().withSeq(seq_).withRank(commRanks_[rank_]).withPeer(commRanks_[member]);
}

void Group::readPeer(int member, Buffer which, size_t offset, void* dst, size_t bytes) {
  if (bytes == 0) return;
  const BufferRecord& r = ctl_[member]->buffers[ops_ & 1];
  const uint64_t base = which == Buffer::kIn ? r.in : r.out;
  const int err = readPeerMemory(pids_[member], base + offset, dst, bytes);
  if (err == 0) {
    countRead(member, bytes);
    return;
  }
  if (err == ESRCH || watch_[member].exited()) {
    raise(Error(ErrorCode::kPeerLost,
                "rank " + std::to_string(commRanks_[member]) +
                    " (same host, shared memory) exited or was killed during the op",
                context(member)));
  }
  raise(Error(ErrorCode::kInternal,
              "reading the " + std::string(which == Buffer::kIn ? "input" : "output") +
                  " buffer of rank " + std::to_string(commRanks_[member]) +
                  " (same host) with process_vm_readv failed: " + std::strerror(err),
              context(member)));
}

void Group::publish(uint64_t tick) {
  Control* c = ctl_[rank_];
  c->tick.store(tick, std::memory_order_seq_cst);
  if (c->waiters.load(std::memory_order_seq_cst) > 0) {
    c->wakeSeq.fetch_add(1, std::memory_order_seq_cst);
    futexWake(reinterpret_cast<uint32_t*>(&c->wakeSeq));
  }
}

void Group::sync() {
  publish(++tick_);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    waitFor(p, tick_);
    if (!opChecked_) checkOp(p);
  }
  opChecked_ = true;
}

void Group::checkOp(int member) {
  // The member reached this op's first sync point, so it published its op
  // record; it cannot be two ops ahead (that needs our next sync point).
  const OpRecord& r = ctl_[member]->ops[ops_ & 1];
  const uint64_t number = r.number.load(std::memory_order_acquire);
  const uint64_t peerSeq = r.seq;
  Envelope peerEnv;
  std::memcpy(peerEnv.words, r.env, sizeof(peerEnv.words));
  if (number == ops_ && peerEnv == env_ && peerSeq == seq_) return;
  // A member that rejected this op can reach this sync in its next op.
  if (ctl_[member]->rejected.load(std::memory_order_acquire) == seq_ + 1) raise(rejection(member));
  const int peer = commRanks_[member];
  std::ostringstream os;
  os << "rank " << peer << " called " << (describe_ ? describe_(peerEnv) : "<op>") << " as op #"
     << peerSeq << " while this rank called " << (describe_ ? describe_(env_) : "<op>")
     << " as op #" << seq_;
  const Control* own = ctl_[rank_];
  if (peerSeq != seq_ && own->rejected.load(std::memory_order_relaxed) == peerSeq + 1) {
    os << "; this rank rejected its call of op #" << peerSeq << " ("
       << printable(own->rejectedWhy, sizeof(own->rejectedWhy)) << ")";
  }
  raise(Error(ErrorCode::kMismatch, os.str(),
              ErrorContext().withSeq(seq_).withRank(commRanks_[rank_]).withPeer(peer)));
}

void Group::raise(const Error& e) {
  throw *error_.set(e);
}

void Group::checkSlow(int member, uint64_t tick, transport::LivenessProbe& probe) {
  error_.throwIfFailed();
  // The member may have reached `tick` (and moved on or left) since the
  // waiter last looked, e.g. while the waiter was preempted: that is
  // success, whatever happened after it.
  if (ctl_[member]->tick.load(std::memory_order_acquire) >= tick) return;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const Control* c = ctl_[p];
    if (c->failed.load(std::memory_order_acquire) && c->failedOp <= ops_) raise(reportOf(p));
  }
  if (skippedThisOp(member, tick)) raise(rejection(member));
  if (watch_[member].exited() || ctl_[member]->left.load(std::memory_order_acquire)) {
    // It may have reached `tick` between the look above and its leaving
    // (it publishes the tick before it leaves): then the op is done here.
    if (ctl_[member]->tick.load(std::memory_order_acquire) >= tick) return;
    raise(Error(ErrorCode::kPeerLost,
                "rank " + std::to_string(commRanks_[member]) +
                    " (same host, shared memory) exited, was killed or destroyed its "
                    "communicator during the op",
                context(member)));
  }
  switch (probe.step(deadline_, ctl_[member]->pongs.load(std::memory_order_acquire))) {
    case transport::LivenessProbe::Step::kPing:
      ctl_[member]->pings.fetch_add(1, std::memory_order_acq_rel);
      break;
    case transport::LivenessProbe::Step::kTimeout: raise(timeoutError(member, probe.peerAlive()));
    case transport::LivenessProbe::Step::kWait: break;
  }
}

bool Group::skippedThisOp(int member, uint64_t tick) const {
  const Control* c = ctl_[member];
  const uint64_t rejected = c->rejected.load(std::memory_order_acquire);
  const uint64_t latest = latestSeq(member);
  using transport::isPast;
  const bool skipped = rejected == seq_ + 1 ||                          // it rejected this op
                       (latest != seq_ && !isPast(latest, seq_)) ||     // it started a later op
                       (rejected != 0 && isPast(seq_, rejected - 1) &&  // it rejected a later one
                        isPast(latest, seq_));  // and never started this one
  // A member that reached `tick` and went on (while this waiter was
  // preempted between its reads) ran this op: not skipped.
  return skipped && c->tick.load(std::memory_order_acquire) < tick;
}

uint64_t Group::latestSeq(int member) const {
  const OpRecord* r = ctl_[member]->ops;
  const bool newer =
      r[1].number.load(std::memory_order_acquire) > r[0].number.load(std::memory_order_acquire);
  return r[newer ? 1 : 0].seq;
}

Error Group::rejection(int member) const {
  const Control* c = ctl_[member];
  const std::string why = printable(c->rejectedWhy, sizeof(c->rejectedWhy));
  return transport::rejectionReport(commRanks_[rank_], seq_, commRanks_[member], why.data(),
                                    why.size());
}

Error Group::timeoutError(int member, bool alive) const {
  const int who = commRanks_[member];
  std::ostringstream os;
  os << "Timed out waiting for rank " << who << " (same host, shared memory); it last started op #"
     << latestSeq(member) << ", this rank is in #" << seq_ << "; rank " << who;
  if (alive) {
    os << " is alive but waiting itself: the stalled rank is further along the chain";
  } else {
    os << " is not responding (stopped, hung or not calling this collective)";
  }
  return Error(ErrorCode::kTimeout, os.str(), context(member));
}

bool Group::answerProbes() {
  Control* c = ctl_[rank_];
  const uint64_t pings = c->pings.load(std::memory_order_acquire);
  uint64_t pongs = c->pongs.load(std::memory_order_relaxed);
  const bool pending = pongs < pings;
  // Only ever raised: answers from two threads never take one back.
  while (pongs < pings &&
         !c->pongs.compare_exchange_weak(pongs, pings, std::memory_order_acq_rel)) {
  }
  return pending;
}

void Group::waitFor(int member, uint64_t tick) {
  Control* c = ctl_[member];
  if (c->tick.load(std::memory_order_acquire) >= tick) return;
  transport::LivenessProbe probe(timeout_);
  const auto pollUntil = Deadline::Clock::now() + kPollTime;
  while (true) {
    for (int i = 0; i < 128; ++i) {
      if (c->tick.load(std::memory_order_acquire) >= tick) return;
      cpuRelax();
    }
    if (oversubscribed_) sched_yield();
    if (error_.failed() || c->failed.load(std::memory_order_relaxed) != 0 ||
        c->left.load(std::memory_order_relaxed) != 0 ||
        c->rejected.load(std::memory_order_relaxed) == seq_ + 1) {
      checkSlow(member, tick, probe);
      if (c->tick.load(std::memory_order_acquire) >= tick) return;
    }
    if (Deadline::Clock::now() >= pollUntil) break;
  }
  auto hookAt = Deadline::Clock::now();
  while (true) {
    checkSlow(member, tick, probe);
    answerProbes();
    if (whileWaiting_ && Deadline::Clock::now() >= hookAt) {
      whileWaiting_();
      hookAt = Deadline::Clock::now() + kHookPeriod;
    }
    c->waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t v = c->wakeSeq.load(std::memory_order_seq_cst);
    if (c->tick.load(std::memory_order_seq_cst) >= tick) {
      c->waiters.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    futexWait(reinterpret_cast<uint32_t*>(&c->wakeSeq), v, kSleepSliceUs);
    c->waiters.fetch_sub(1, std::memory_order_relaxed);
    if (c->tick.load(std::memory_order_acquire) >= tick) return;
  }
}

Error Group::reportOf(int member) const {
  const Control* c = ctl_[member];
  ErrorCode code = ErrorCode::kPeerLost;
  if (c->code == static_cast<uint32_t>(ErrorCode::kMismatch) ||
      c->code == static_cast<uint32_t>(ErrorCode::kTimeout) ||
      c->code == static_cast<uint32_t>(ErrorCode::kPeerLost)) {
    code = static_cast<ErrorCode>(c->code);
  }
  return Error(code,
               "rank " + std::to_string(commRanks_[member]) +
                   " failed: " + printable(c->message, sizeof(c->message)),
               context(member).withCulprit(c->culprit, c->failedSeq));
}

std::vector<Error> Group::awaitReports(Deadline until, int exclude) {
  for (;;) {
    std::vector<Error> reports;
    bool complete = true;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (ctl_[p]->failed.load(std::memory_order_acquire)) {
        reports.push_back(reportOf(p));
      } else if (p != exclude && !watch_[p].exited() &&
                 !ctl_[p]->left.load(std::memory_order_acquire)) {
        complete = false;
      }
    }
    if (complete || until.expired()) return reports;
    answerProbes();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Group::notifyPeers(const Error& error) {
  Control* c = ctl_[rank_];
  if (c->failed.load(std::memory_order_relaxed)) return;
  const std::string text = error.what();
  const size_t n = std::min(text.size(), sizeof(c->message) - 1);
  std::memcpy(c->message, text.data(), n);
  c->message[n] = '\0';
  c->code = static_cast<uint32_t>(error.code());
  c->culprit = error.peer() >= 0 ? error.peer() : error.rank();
  c->failedSeq = error.seq();
  // A failure between ops concerns the next op: the last one completed.
  c->failedOp = inOp_ ? ops_ : ops_ + 1;
  c->failed.store(1, std::memory_order_release);
  c->wakeSeq.fetch_add(1, std::memory_order_seq_cst);
  futexWake(reinterpret_cast<uint32_t*>(&c->wakeSeq));
}

void Group::reject(uint64_t seq, const std::string& why) {
  Control* c = ctl_[rank_];
  const size_t n = std::min(why.size(), sizeof(c->rejectedWhy) - 1);
  std::memcpy(c->rejectedWhy, why.data(), n);
  c->rejectedWhy[n] = '\0';
  c->rejected.store(seq + 1, std::memory_order_release);
  c->wakeSeq.fetch_add(1, std::memory_order_seq_cst);
  futexWake(reinterpret_cast<uint32_t*>(&c->wakeSeq));
}

void Group::countRead(int member, uint64_t bytes) {
  readFrom_[member]->fetch_add(bytes, std::memory_order_relaxed);
}

PeerStats Group::peerStats(int member) const {
  PeerStats s;
  if (member == rank_ || member < 0 || member >= size_) return s;
  s.bytesReceived = readFrom_[member]->load(std::memory_order_relaxed);
  s.bytesSent = readCounters(ctl_[member])[rank_].load(std::memory_order_relaxed);
  return s;
}

}  // namespace gflow::backend::shm
