// The software NCCL (soft_nccl.h).
//
// Simplified against real NCCL:
// - One mutex and one condition variable for all communicators; a
//   collective's work copies whole buffers (no rings, channels or protocols)
//   into a private result and writes it after every rank has read its inputs.
// - Ranks of one communicator must be threads of this process (the unique id
//   is only a key in a table); no bootstrap network, no timeouts.
// - The collective's in-flight state is per communicator (all comms of one
//   init or split), so commAbort of any of them ends the blocked work of all.
// - Point-to-point: the sends and receives of one group on one comm are one
//   work item on the stream (a send or receive outside a group is a group
//   of one); collectives inside a group are refused (kInvalidUsage).
// - Api::version is fixed (kVersion); no ncclConfig_t, user buffer
//   registration or NCCL_* environment.
#include "testing/soft_nccl.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <type_traits>

#include "gflow/types.h"
#include "kernels/reduce.h"
#include "testing/soft_cuda.h"

namespace gflow::testing::softnccl {
namespace {

using gflow::nccl::Api;
using gflow::nccl::UniqueId;
using namespace gflow::nccl;  // Result codes

enum Kind : int { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce };
const char* kindName(int k) {
  static const char* names[] = {"allReduce", "reduceScatter", "allGather", "broadcast", "reduce"};
  return names[k];
}

struct Args : gflow::nccl::Collective {
  int kind = 0;
};

bool sameCall(const Args& a, const Args& b) {
  return a.kind == b.kind && a.count == b.count && a.dtype == b.dtype && a.op == b.op &&
         a.root == b.root;
}

std::string describe(const Args& a) {
  return std::string(kindName(a.kind)) + "(count " + std::to_string(a.count) + ", dtype " +
         std::to_string(a.dtype) + ", op " + std::to_string(a.op) + ", root " +
         std::to_string(a.root) + ")";
}

struct Round {  // the k-th collective of a communicator
  std::vector<Args> args;
  int arrived = 0, computed = 0, finished = 0;
  bool go = false;  // every rank arrived with matching arguments
};

struct Comm;
struct SplitEntry {
  int color = -1;
  int key = 0;
  std::shared_ptr<Comm> child;
};
struct SplitRound {
  std::vector<SplitEntry> entries;
  int arrived = 0;
};

struct ShrinkRound {                            // the k-th shrink of the ranks that take part
  std::vector<std::shared_ptr<Comm>> children;  // by parent rank (null: excluded or not yet)
  std::vector<int> excluded;                    // the first arrival's list
  int arrived = 0;
  bool agree = true;
};

// The ranks formed together by one init or one split color.
struct Group {
  int nranks = 0;
  std::vector<std::weak_ptr<Comm>> members;  // by rank
  bool aborted = false;
  std::map<uint64_t, Round> rounds;
  std::map<uint64_t, SplitRound> splitRounds;
  std::map<uint64_t, ShrinkRound> shrinkRounds;
  // Point-to-point: the sends from rank a to rank b not yet received, in
  // the order they were posted (key a * nranks + b).
  std::map<int, std::deque<std::shared_ptr<struct Sent>>> channels;
};

// A send posted by a p2p work item, waiting for its receive.
struct Sent {
  const void* buf = nullptr;
  size_t count = 0;
  int dtype = 0;
  bool received = false;
};

struct Comm {
  uint64_t serial = 0;
  int rank = -1, nranks = 0, device = -1;
  std::shared_ptr<Group> group;  // null until formed
  int asyncError = kInProgress;
  bool dead = false;     // aborted or destroyed: a tombstone
  bool revoked = false;  // commRevoke: no collectives; quiescent once drained
  bool finalizing = false;
  // Work items enqueued and completed (collectives and p2p groups), and
  // collectives enqueued (their number matches the ranks' k-th calls).
  uint64_t enqueued = 0, completed = 0, splitsCalled = 0, shrinksCalled = 0, collectives = 0;
  std::string lastError;
};

struct PendingInit {
  int nranks = 0;
  std::vector<std::shared_ptr<Comm>> byRank;
  int joined = 0;
};

struct State {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> enabled{false};
  bool abortReleasesPeers = true;  // setAbortReleasesPeers
  uint64_t serial = 0;
  std::map<void*, std::shared_ptr<Comm>> comms;  // live ones and tombstones
  std::map<std::string, PendingInit> pending;    // by unique id
  std::map<std::string, std::deque<int>> failures;
  std::string lastError;
  std::mt19937_64 rng{std::random_device{}()};
  int collectivesRun = 0, inits = 0, aborts = 0, splits = 0, mismatches = 0;
  int revokes = 0, shrinks = 0;
  int version = kVersion;  // setVersion
};

State& st() {
  static State* s = new State;  // never destroyed: work may outlive main
  return *s;
}

int injected(const char* entry) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.failures.find(entry);
  if (it == s.failures.end() || it->second.empty()) return 0;
  const int r = it->second.front();
  it->second.pop_front();
  return r;
}

// Records `msg` as the last error (of `c` when not null, and globally).
int failLocked(Comm* c, int result, const std::string& msg) {
  State& s = st();
  s.lastError = "soft NCCL: " + msg;
  if (c) c->lastError = s.lastError;
  return result;
}

Comm* findLocked(void* comm) {
  auto it = st().comms.find(comm);
  return it == st().comms.end() ? nullptr : it->second.get();
}

void abortGroupLocked(Group& g, const Comm* by) {
  if (!st().abortReleasesPeers && by) {
    st().cv.notify_all();  // only `by`'s own work ends (it is dead or revoked)
    return;
  }
  if (g.aborted) return;
  g.aborted = true;
  for (auto& w : g.members) {
    std::shared_ptr<Comm> m = w.lock();
    if (!m || m.get() == by || m->dead) continue;
    if (m->asyncError == kSuccess || m->asyncError == kInProgress) {
      m->asyncError = kRemoteError;
      failLocked(m.get(), kRemoteError,
                 "rank " + std::to_string(by ? by->rank : -1) + " aborted the communicator");
    }
  }
  st().cv.notify_all();
}

// Forms a communicator of `members` (rank = position).
void formLocked(const std::vector<std::shared_ptr<Comm>>& members, bool parentAborted) {
  auto g = std::make_shared<Group>();
  g->nranks = static_cast<int>(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    members[i]->group = g;
    members[i]->rank = static_cast<int>(i);
    members[i]->nranks = g->nranks;
    g->members.push_back(members[i]);
  }
  for (size_t i = 0; i < members.size(); ++i) {
    for (size_t j = i + 1; j < members.size(); ++j) {
      if (members[i]->device != members[j]->device) continue;
      const std::string msg = "Duplicate GPU detected: rank " + std::to_string(i) + " and rank " +
                              std::to_string(j) + " both on device " +
                              std::to_string(members[i]->device);
      for (auto& m : members) {
        m->asyncError = kInvalidUsage;
        m->lastError = msg;
      }
      st().lastError = msg;
      return;
    }
  }
  for (auto& m : members) m->asyncError = kSuccess;
  const bool anyDead =
      std::any_of(members.begin(), members.end(), [](const auto& m) { return m->dead; });
  if (anyDead || parentAborted) {
    const Comm* by = nullptr;
    for (auto& m : members)
      if (m->dead) by = m.get();
    abortGroupLocked(*g, by);
  }
}

// --- Reductions: every rank computes the same bits. ---

template <class Acc>
Acc combineFloat(Acc a, Acc b, int op) {
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMin:
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<Acc>::quiet_NaN();
      return b < a ? b : a;
    case ReduceOp::kMax:
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<Acc>::quiet_NaN();
      return b > a ? b : a;
    default: return a + b;  // kSum, kAvg
  }
}

template <class T>
T combineInt(T a, T b, int op) {
  using U = std::make_unsigned_t<T>;
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::kProd: return static_cast<T>(static_cast<U>(U(a) * U(b)));
    case ReduceOp::kMin: return b < a ? b : a;
    case ReduceOp::kMax: return b > a ? b : a;
    default: return static_cast<T>(static_cast<U>(U(a) + U(b)));  // wraps
  }
}

// out[i] = reduce over ranks r of load(r, i), in rank order.
template <class Acc, class Load, class Store, class Combine>
void reduceLoop(size_t count, int n, int op, Load load, Store store, Combine combine) {
  for (size_t i = 0; i < count; ++i) {
    Acc acc = load(0, i);
    for (int r = 1; r < n; ++r) acc = combine(acc, load(r, i), op);
    if (op == static_cast<int>(ReduceOp::kAvg)) acc = static_cast<Acc>(acc / static_cast<Acc>(n));
    store(i, acc);
  }
}

template <class T>
void reduceFloat(void* out, const std::vector<const void*>& ins, size_t off, size_t count, int op) {
  reduceLoop<T>(
      count, static_cast<int>(ins.size()), op,
      [&](int r, size_t i) { return static_cast<const T*>(ins[r])[off + i]; },
      [&](size_t i, T v) { static_cast<T*>(out)[i] = v; }, combineFloat<T>);
}

template <class T>
void reduceInt(void* out, const std::vector<const void*>& ins, size_t off, size_t count, int op) {
  reduceLoop<T>(
      count, static_cast<int>(ins.size()), op,
      [&](int r, size_t i) { return static_cast<const T*>(ins[r])[off + i]; },
      [&](size_t i, T v) { static_cast<T*>(out)[i] = v; }, combineInt<T>);
}

// float16/bfloat16: accumulate in float32, round once.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduceHalf(void* out, const std::vector<const void*>& ins, size_t off, size_t count, int op) {
  reduceLoop<float>(
      count, static_cast<int>(ins.size()), op,
      [&](int r, size_t i) { return ToFloat(static_cast<const uint16_t*>(ins[r])[off + i]); },
      [&](size_t i, float v) { static_cast<uint16_t*>(out)[i] = FromFloat(v); },
      combineFloat<float>);
}

// float8: accumulate in float32, round once.
template <float (*ToFloat)(uint8_t), uint8_t (*FromFloat)(float)>
void reduceFloat8(void* out, const std::vector<const void*>& ins, size_t off, size_t count,
                  int op) {
  reduceLoop<float>(
      count, static_cast<int>(ins.size()), op,
      [&](int r, size_t i) { return ToFloat(static_cast<const uint8_t*>(ins[r])[off + i]); },
      [&](size_t i, float v) { static_cast<uint8_t*>(out)[i] = FromFloat(v); },
      combineFloat<float>);
}

// The data types NCCL has (ncclDataType_t): not int16, bool, complex or
// gflow's quantized blocks.
bool ncclHas(int dtype) {
  switch (static_cast<DataType>(dtype)) {
    case DataType::kInt16:
    case DataType::kBool:
    case DataType::kComplex64:
    case DataType::kComplex128:
    case DataType::kQInt8:
    case DataType::kQInt4: return false;
    default: return dtype >= 0 && dtype < kNumDataTypes;
  }
}

void reduce(void* out, const std::vector<const void*>& ins, size_t off, size_t count, int dtype,
            int op) {
  switch (static_cast<DataType>(dtype)) {
    case DataType::kFloat32: return reduceFloat<float>(out, ins, off, count, op);
    case DataType::kFloat64: return reduceFloat<double>(out, ins, off, count, op);
    case DataType::kFloat16:
      return reduceHalf<kernels::halfToFloat, kernels::floatToHalf>(out, ins, off, count, op);
    case DataType::kBFloat16:
      return reduceHalf<kernels::bfloat16ToFloat, kernels::floatToBfloat16>(out, ins, off, count,
                                                                            op);
    case DataType::kInt32: return reduceInt<int32_t>(out, ins, off, count, op);
    case DataType::kInt64: return reduceInt<int64_t>(out, ins, off, count, op);
    case DataType::kUInt8: return reduceInt<uint8_t>(out, ins, off, count, op);
    case DataType::kInt8: return reduceInt<int8_t>(out, ins, off, count, op);
    case DataType::kFloat8E4M3:
      return reduceFloat8<kernels::float8e4m3ToFloat, kernels::floatToFloat8e4m3>(out, ins, off,
                                                                                  count, op);
    case DataType::kFloat8E5M2:
      return reduceFloat8<kernels::float8e5m2ToFloat, kernels::floatToFloat8e5m2>(out, ins, off,
                                                                                  count, op);
    case DataType::kInt16:
    case DataType::kBool:
    case DataType::kComplex64:
    case DataType::kComplex128:
    case DataType::kQInt8:
    case DataType::kQInt4: break;  // not NCCL types: collective() refuses them
  }
}

size_t outCount(const Args& a, int n) {
  return a.kind == kAllGather ? a.count * n : a.count;
}
// Whether rank `rank` writes (and so checks) its output buffer.
bool writesOut(const Args& a, int rank) {
  return a.kind != kReduce || a.root == rank;
}
size_t inCount(const Args& a, int n) {
  return a.kind == kReduceScatter ? a.count * n : a.count;
}

// This rank's output, from every rank's arguments.
std::vector<unsigned char> compute(const std::vector<Args>& args, int rank) {
  const int n = static_cast<int>(args.size());
  const Args& a = args[rank];
  const size_t es = dataTypeSize(static_cast<DataType>(a.dtype));
  std::vector<unsigned char> out(writesOut(a, rank) ? outCount(a, n) * es : 0);
  std::vector<const void*> ins;
  for (const Args& x : args) ins.push_back(x.in);
  switch (a.kind) {
    case kAllReduce: reduce(out.data(), ins, 0, a.count, a.dtype, a.op); break;
    case kReduceScatter: reduce(out.data(), ins, rank * a.count, a.count, a.dtype, a.op); break;
    case kAllGather:
      for (int r = 0; r < n; ++r) std::memcpy(out.data() + r * a.count * es, ins[r], a.count * es);
      break;
    case kBroadcast: std::memcpy(out.data(), ins[a.root], a.count * es); break;
    case kReduce:
      if (rank == a.root) reduce(out.data(), ins, 0, a.count, a.dtype, a.op);
      break;
  }
  return out;
}

// The work of rank c's `seq`-th collective, on its stream.
void runCollective(const std::shared_ptr<Comm>& c, const std::shared_ptr<Group>& g, uint64_t seq,
                   const Args& a) {
  State& s = st();
  std::unique_lock<std::mutex> l(s.mu);
  const int n = g->nranks, rank = c->rank;
  auto done = [&](bool wrote) {
    ++c->completed;
    if (wrote) ++s.collectivesRun;
    s.cv.notify_all();
  };
  if (g->aborted || c->dead || c->revoked) return done(false);
  Round& round = g->rounds[seq];
  if (round.args.empty()) round.args.resize(n);
  round.args[rank] = a;
  if (++round.arrived == n) {
    int odd = -1;
    for (int r = 1; r < n && odd < 0; ++r)
      if (!sameCall(round.args[0], round.args[r])) odd = r;
    if (odd < 0) {
      round.go = true;
    } else {  // NCCL would hang: so do we, until an abort
      ++s.mismatches;
      const std::string msg = "collective #" + std::to_string(seq) + " mismatch: rank 0 called " +
                              describe(round.args[0]) + ", rank " + std::to_string(odd) +
                              " called " + describe(round.args[odd]);
      for (auto& w : g->members)
        if (auto m = w.lock()) failLocked(m.get(), kInvalidUsage, msg);
    }
    s.cv.notify_all();
  }
  s.cv.wait(l, [&] { return round.go || g->aborted || c->dead || c->revoked; });
  if (!round.go) return done(false);  // aborted before every rank arrived
  // Every rank is inside: read all inputs (arguments are fixed from now on).
  l.unlock();
  std::vector<unsigned char> result = compute(round.args, rank);
  l.lock();
  ++round.computed;
  s.cv.notify_all();
  s.cv.wait(l, [&] { return round.computed == n; });  // bounded: everyone computes
  // Nobody reads an input any more: write the output.
  l.unlock();
  if (!result.empty()) std::memcpy(a.out, result.data(), result.size());
  l.lock();
  if (++round.finished == n) g->rounds.erase(seq);
  done(true);
}

// Checks common to every use of a formed comm. 0: usable.
int usableLocked(Comm* c, void* comm) {
  if (!comm) return failLocked(nullptr, kInvalidArgument, "comm is NULL");
  if (!c) return failLocked(nullptr, kInvalidArgument, "unknown communicator");
  if (c->dead) return failLocked(c, kInvalidUsage, "communicator was aborted or destroyed");
  if (c->revoked) return failLocked(c, kInvalidUsage, "communicator was revoked");
  if (c->asyncError == kInProgress) {
    return failLocked(c, kInvalidArgument,
                      "Attempt to use communicator before the previous operation returned "
                      "ncclSuccess");
  }
  if (c->asyncError != kSuccess) return c->asyncError;
  if (c->finalizing) return failLocked(c, kInvalidUsage, "communicator is being finalized");
  return 0;
}

// Whether `bytes` at `p` are soft CUDA memory of c's device; else records
// why as c's last error.
bool onDeviceLocked(Comm* c, const char* entry, const void* p, size_t bytes, const char* what) {
  if (softcuda::deviceOf(p, bytes) == c->device) return true;
  char ptr[32];
  std::snprintf(ptr, sizeof ptr, "%p", p);
  failLocked(c, kInvalidArgument,
             std::string(entry) + ": " + what + " " + ptr + " is not device memory of device " +
                 std::to_string(c->device) + " for " + std::to_string(bytes) + " bytes");
  return false;
}

thread_local int groupDepth = 0;  // groupStart minus groupEnd on this thread

int collective(const char* entry, const Args& a, void* comm, void* stream) {
  if (int e = injected(entry)) return e;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  Comm* c = findLocked(comm);
  if (int e = usableLocked(c, comm)) return e;
  if (groupDepth > 0) {
    return failLocked(c, kInvalidUsage,
                      std::string(entry) + ": collectives inside a group are not modelled");
  }
  if (!ncclHas(a.dtype))
    return failLocked(c, kInvalidArgument, "invalid data type " + std::to_string(a.dtype));
  const bool reduces = a.kind == kAllReduce || a.kind == kReduceScatter || a.kind == kReduce;
  // NCCL's ops: sum, prod, max, min, avg (no bitwise ones).
  if (reduces && (a.op < 0 || a.op > static_cast<int>(ReduceOp::kProd)))
    return failLocked(c, kInvalidArgument, "invalid reduction operation " + std::to_string(a.op));
  if ((a.kind == kBroadcast || a.kind == kReduce) && (a.root < 0 || a.root >= c->nranks))
    return failLocked(c, kInvalidArgument, "invalid root " + std::to_string(a.root));
  if (a.count == 0) return kSuccess;  // nothing to do, no part in matching
  const size_t es = dataTypeSize(static_cast<DataType>(a.dtype));
  auto check = [&](const void* p, size_t elems, const char* what) {
    return onDeviceLocked(c, entry, p, elems * es, what);
  };
  const bool readsIn = a.kind != kBroadcast || a.root == c->rank;
  if (readsIn && !check(a.in, inCount(a, c->nranks), "sendbuff")) return kInvalidArgument;
  if (writesOut(a, c->rank) && !check(a.out, outCount(a, c->nranks), "recvbuff")) {
    return kInvalidArgument;
  }
  std::shared_ptr<Comm> self = s.comms[comm];
  std::shared_ptr<Group> g = c->group;
  const uint64_t seq = c->collectives;
  if (softcuda::enqueue(c->device, stream, [self, g, seq, a] { runCollective(self, g, seq, a); })) {
    return failLocked(c, kUnhandledCudaError,
                      std::string(entry) + ": the stream is not a soft CUDA stream of device " +
                          std::to_string(c->device));
  }
  ++c->enqueued;
  ++c->collectives;
  return kSuccess;
}

// --- Point-to-point. ---

struct P2PCall {
  bool send = true;
  void* buf = nullptr;
  size_t count = 0;
  int dtype = 0;
  int peer = 0;
  void* comm = nullptr;
  void* stream = nullptr;
};
thread_local std::vector<P2PCall> grouped;  // posted since the outer groupStart
thread_local int groupError = kSuccess;     // the first failed call of the group

// The work of one group's calls on comm `c`: posts every send, takes every
// receive's matching send (the oldest from its peer), copies, then waits
// until the peers took this rank's sends.
void runPointToPoint(const std::shared_ptr<Comm>& c, const std::shared_ptr<Group>& g,
                     const std::vector<P2PCall>& calls) {
  State& s = st();
  std::unique_lock<std::mutex> l(s.mu);
  const auto live = [&] { return !g->aborted && !c->dead && !c->revoked; };
  std::vector<std::shared_ptr<Sent>> mine;
  for (const P2PCall& x : calls) {
    if (!x.send) continue;
    mine.push_back(std::make_shared<Sent>(Sent{x.buf, x.count, x.dtype, false}));
    g->channels[c->rank * g->nranks + x.peer].push_back(mine.back());
  }
  s.cv.notify_all();
  bool ok = true;
  for (const P2PCall& x : calls) {
    if (x.send || !ok) continue;
    auto& from = g->channels[x.peer * g->nranks + c->rank];
    s.cv.wait(l, [&] { return !from.empty() || !live(); });
    if (!live()) {
      ok = false;
      break;
    }
    std::shared_ptr<Sent> m = from.front();
    if (m->count != x.count || m->dtype != x.dtype) {  // NCCL would hang: so do we
      ++s.mismatches;
      failLocked(c.get(), kInvalidUsage,
                 "recv of " + std::to_string(x.count) + " elements of dtype " +
                     std::to_string(x.dtype) + " from rank " + std::to_string(x.peer) +
                     " matched a send of " + std::to_string(m->count) + " of dtype " +
                     std::to_string(m->dtype));
      s.cv.wait(l, [&] { return !live(); });
      ok = false;
      break;
    }
    from.pop_front();
    std::memcpy(x.buf, m->buf, x.count * dataTypeSize(static_cast<DataType>(x.dtype)));
    m->received = true;
    s.cv.notify_all();
  }
  if (ok) {
    s.cv.wait(l, [&] {
      return !live() ||
             std::all_of(mine.begin(), mine.end(), [](const auto& m) { return m->received; });
    });
  }
  // Sends nobody took (the work ended early): gone with it, so no receive
  // copies from a buffer its owner may have freed.
  for (const P2PCall& x : calls) {
    if (!x.send) continue;
    auto& q = g->channels[c->rank * g->nranks + x.peer];
    q.erase(std::remove_if(q.begin(), q.end(),
                           [&](const auto& m) {
                             return !m->received &&
                                    std::find(mine.begin(), mine.end(), m) != mine.end();
                           }),
            q.end());
  }
  ++c->completed;
  if (ok && live()) ++s.collectivesRun;
  s.cv.notify_all();
}

// Checks a send or receive and queues it in this thread's group.
int postPointToPoint(const char* entry, const P2PCall& x) {
  if (int e = injected(entry)) return e;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  Comm* c = findLocked(x.comm);
  if (int e = usableLocked(c, x.comm)) return e;
  if (!ncclHas(x.dtype))
    return failLocked(c, kInvalidArgument, "invalid data type " + std::to_string(x.dtype));
  if (x.peer < 0 || x.peer >= c->nranks)
    return failLocked(c, kInvalidArgument,
                      std::string(entry) + ": invalid peer " + std::to_string(x.peer));
  if (x.count == 0) return kSuccess;  // no part in matching
  const size_t bytes = x.count * dataTypeSize(static_cast<DataType>(x.dtype));
  if (!onDeviceLocked(c, entry, x.buf, bytes, x.send ? "sendbuff" : "recvbuff"))
    return kInvalidArgument;
  grouped.push_back(x);
  return kSuccess;
}

// Enqueues the calls of this thread's group: one work item per comm.
int launchGroup() {
  std::vector<P2PCall> calls;
  calls.swap(grouped);
  if (calls.empty()) return kSuccess;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  std::vector<void*> order;  // comms in first-use order
  for (const P2PCall& x : calls)
    if (std::find(order.begin(), order.end(), x.comm) == order.end()) order.push_back(x.comm);
  for (void* comm : order) {
    std::vector<P2PCall> mine;
    for (const P2PCall& x : calls)
      if (x.comm == comm) mine.push_back(x);
    Comm* c = findLocked(comm);
    if (int e = usableLocked(c, comm)) return e;
    std::shared_ptr<Comm> self = s.comms[comm];
    std::shared_ptr<Group> g = c->group;
    if (softcuda::enqueue(c->device, mine.front().stream,
                          [self, g, mine] { runPointToPoint(self, g, mine); })) {
      return failLocked(
          c, kUnhandledCudaError,
          "groupEnd: a stream is not a soft CUDA stream of device " + std::to_string(c->device));
    }
    ++c->enqueued;
  }
  return kSuccess;
}

int pointToPoint(const char* entry, const P2PCall& x) {
  if (int e = postPointToPoint(entry, x)) {
    if (groupDepth > 0 && groupError == kSuccess) groupError = e;
    return e;
  }
  return groupDepth > 0 ? kSuccess : launchGroup();
}

// --- The table's entries. ---

const char* getErrorString(int result) {
  switch (result) {
    case kSuccess: return "no error";
    case kUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case kSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case kInternalError: return "internal error - please report this issue to the NCCL developers";
    case kInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case kInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case kRemoteError: return "remote process exited or there was a network error";
    case kInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* getLastError(void* comm) {
  thread_local std::string copy;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (!comm) {
    copy = s.lastError;
  } else {
    Comm* c = findLocked(comm);
    copy = c ? c->lastError : std::string();
  }
  return copy.c_str();
}

int getUniqueId(UniqueId* id) {
  if (int e = injected("getUniqueId")) return e;
  if (!id) return kInvalidArgument;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  for (size_t i = 0; i < kUniqueIdBytes; i += 8) {
    const uint64_t v = s.rng();
    std::memcpy(id->bytes + i, &v, 8);
  }
  return kSuccess;
}

std::shared_ptr<Comm> newCommLocked(int device) {
  State& s = st();
  auto c = std::make_shared<Comm>();
  c->serial = ++s.serial;
  c->device = device;
  s.comms[c.get()] = c;
  return c;
}

int commInitRank(void** comm, int nranks, const UniqueId* id, int rank) {
  if (int e = injected("commInitRank")) return e;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (!comm || !id) return failLocked(nullptr, kInvalidArgument, "commInitRank: null argument");
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return failLocked(nullptr, kInvalidArgument,
                      "invalid rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  }
  const std::string key(id->bytes, kUniqueIdBytes);
  PendingInit& p = s.pending[key];
  if (p.nranks == 0) {
    p.nranks = nranks;
    p.byRank.resize(nranks);
  }
  if (p.nranks != nranks) {
    return failLocked(nullptr, kInvalidArgument,
                      "nranks " + std::to_string(nranks) + " differs from another rank's " +
                          std::to_string(p.nranks));
  }
  if (p.byRank[rank])
    return failLocked(nullptr, kInvalidUsage, "rank " + std::to_string(rank) + " joined twice");
  std::shared_ptr<Comm> c = newCommLocked(softcuda::currentDevice());
  p.byRank[rank] = c;
  *comm = c.get();
  ++s.inits;
  if (++p.joined == nranks) {
    const std::vector<std::shared_ptr<Comm>> members = std::move(p.byRank);
    s.pending.erase(key);
    formLocked(members, false);
  }
  return kInProgress;
}

int commSplit(void* comm, int color, int key, void** out) {
  if (int e = injected("commSplit")) return e;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  Comm* c = findLocked(comm);
  if (int e = usableLocked(c, comm)) return e;
  if (!out) return failLocked(c, kInvalidArgument, "commSplit: newcomm is NULL");
  Group& g = *c->group;
  SplitRound& round = g.splitRounds[c->splitsCalled++];
  if (round.entries.empty()) round.entries.resize(g.nranks);
  std::shared_ptr<Comm> child = color >= 0 ? newCommLocked(c->device) : nullptr;
  round.entries[c->rank] = SplitEntry{color, key, child};
  *out = child.get();
  ++s.splits;
  if (++round.arrived == g.nranks) {
    std::map<int, std::vector<int>> byColor;  // color -> parent ranks
    for (int r = 0; r < g.nranks; ++r)
      if (round.entries[r].color >= 0) byColor[round.entries[r].color].push_back(r);
    for (auto& kv : byColor) {
      std::vector<int>& ranks = kv.second;
      std::stable_sort(ranks.begin(), ranks.end(),
                       [&](int a, int b) { return round.entries[a].key < round.entries[b].key; });
      std::vector<std::shared_ptr<Comm>> members;
      for (int r : ranks) members.push_back(round.entries[r].child);
      formLocked(members, g.aborted);
    }
    g.splitRounds.erase(c->splitsCalled - 1);
  }
  return child ? kInProgress : kSuccess;
}

int commGetAsyncError(void* comm, int* result) {
  if (int e = injected("commGetAsyncError")) return e;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  Comm* c = findLocked(comm);
  if (!c || !result) return kInvalidArgument;
  if (c->dead) return failLocked(c, kInvalidUsage, "communicator was aborted or destroyed");
  if (c->revoked) {
    *result = c->completed == c->enqueued ? kSuccess : kInProgress;
  } else if (c->asyncError != kSuccess) {
    *result = c->asyncError;
  } else if (c->finalizing) {
    *result = c->completed == c->enqueued ? kSuccess : kInProgress;
  } else {
    *result = kSuccess;
  }
  return kSuccess;
}

int commFinalize(void* comm) {
  if (int e = injected("commFinalize")) return e;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  Comm* c = findLocked(comm);
  if (int e = usableLocked(c, comm)) return e;
  c->finalizing = true;
  return kInProgress;
}

int commDestroy(void* comm) {
  if (int e = injected("commDestroy")) return e;
  if (!comm) return kSuccess;
  State& s = st();
  std::unique_lock<std::mutex> l(s.mu);
  auto it = s.comms.find(comm);
  if (it == s.comms.end()) return failLocked(nullptr, kInvalidArgument, "unknown communicator");
  std::shared_ptr<Comm> c = it->second;
  if (c->dead) return failLocked(c.get(), kInvalidUsage, "communicator was aborted or destroyed");
  auto drained = [&] {
    return c->dead || c->revoked || c->completed == c->enqueued || (c->group && c->group->aborted);
  };
  if (!s.cv.wait_for(l, std::chrono::seconds(2), drained)) {
    std::fprintf(stderr,
                 "soft NCCL: commDestroy(%p): collectives still blocked after 2 s (NCCL would "
                 "hang); aborting the communicator\n",
                 comm);
    abortGroupLocked(*c->group, c.get());
  }
  if (c->dead) return failLocked(c.get(), kInvalidUsage, "communicator was aborted or destroyed");
  c->dead = true;
  return kSuccess;
}

int commAbort(void* comm) {
  if (int e = injected("commAbort")) return e;
  if (!comm) return kSuccess;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  Comm* c = findLocked(comm);
  if (!c) return failLocked(nullptr, kInvalidArgument, "unknown communicator");
  if (c->dead) return failLocked(c, kInvalidUsage, "communicator was aborted or destroyed");
  c->dead = true;
  ++s.aborts;
  if (c->group) abortGroupLocked(*c->group, c);
  return kSuccess;
}

int commRevoke(void* comm) {
  if (int e = injected("commRevoke")) return e;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  Comm* c = findLocked(comm);
  if (!c) return failLocked(nullptr, kInvalidArgument, "unknown communicator");
  if (c->dead) return failLocked(c, kInvalidUsage, "communicator was aborted or destroyed");
  if (!c->group) return failLocked(c, kInvalidUsage, "commRevoke: communicator not formed yet");
  c->revoked = true;
  ++s.revokes;
  abortGroupLocked(*c->group, c);  // its blocked work ends, as commAbort's
  return kInProgress;              // non-blocking: quiescent once drained
}

// Forms the children of a shrink round whose ranks all arrived.
void formShrinkLocked(ShrinkRound& round) {
  std::vector<std::shared_ptr<Comm>> members;
  for (auto& child : round.children)
    if (child) members.push_back(child);
  if (round.agree) return formLocked(members, false);
  for (auto& m : members) {
    m->asyncError = kInvalidUsage;
    failLocked(m.get(), kInvalidUsage, "commShrink: the ranks' exclusion lists differ");
  }
}

int commShrink(void* comm, const int* excluded, int count, void** out, bool abortOngoing) {
  if (int e = injected("commShrink")) return e;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  Comm* c = findLocked(comm);
  if (!c) return failLocked(nullptr, kInvalidArgument, "unknown communicator");
  if (c->dead) return failLocked(c, kInvalidUsage, "communicator was aborted or destroyed");
  if (!out || !c->group || count <= 0 || !excluded)
    return failLocked(c, kInvalidArgument, "commShrink: bad arguments (nothing excluded?)");
  Group& g = *c->group;
  std::vector<int> list(excluded, excluded + count);
  std::sort(list.begin(), list.end());
  const bool valid = std::adjacent_find(list.begin(), list.end()) == list.end() &&
                     (list.empty() || (list.front() >= 0 && list.back() < g.nranks)) &&
                     !std::binary_search(list.begin(), list.end(), c->rank);
  if (!valid) return failLocked(c, kInvalidArgument, "commShrink: bad exclusion list");
  if (abortOngoing && !c->revoked) abortGroupLocked(g, c);  // NCCL_SHRINK_ABORT
  if (!abortOngoing && !c->revoked && c->asyncError != kSuccess) return c->asyncError;
  ShrinkRound& round = g.shrinkRounds[c->shrinksCalled++];
  if (round.children.empty()) {
    round.children.resize(g.nranks);
    round.excluded = list;
  }
  round.agree = round.agree && round.excluded == list;
  round.children[c->rank] = newCommLocked(c->device);
  *out = round.children[c->rank].get();
  ++s.shrinks;
  if (++round.arrived == g.nranks - static_cast<int>(round.excluded.size())) {
    formShrinkLocked(round);
    g.shrinkRounds.erase(c->shrinksCalled - 1);
  }
  return kInProgress;
}

Args argsOf(int kind, const nccl::Collective& c) {
  Args a;
  static_cast<nccl::Collective&>(a) = c;
  a.kind = kind;
  return a;
}
int allReduce(const nccl::Collective& c, void* comm, void* stream) {
  return collective("allReduce", argsOf(kAllReduce, {c.in, c.out, c.count, c.dtype, c.op, 0}), comm,
                    stream);
}
int reduceScatter(const nccl::Collective& c, void* comm, void* stream) {
  return collective("reduceScatter",
                    argsOf(kReduceScatter, {c.in, c.out, c.count, c.dtype, c.op, 0}), comm, stream);
}
int allGather(const nccl::Collective& c, void* comm, void* stream) {
  return collective("allGather", argsOf(kAllGather, {c.in, c.out, c.count, c.dtype, 0, 0}), comm,
                    stream);
}
int broadcast(const nccl::Collective& c, void* comm, void* stream) {
  return collective("broadcast", argsOf(kBroadcast, {c.in, c.out, c.count, c.dtype, 0, c.root}),
                    comm, stream);
}
int reduceTo(const nccl::Collective& c, void* comm, void* stream) {
  return collective("reduce", argsOf(kReduce, c), comm, stream);
}
int send(const void* buf, size_t count, int dtype, int peer, void* comm, void* stream) {
  return pointToPoint("send",
                      P2PCall{true, const_cast<void*>(buf), count, dtype, peer, comm, stream});
}
int recv(void* buf, size_t count, int dtype, int peer, void* comm, void* stream) {
  return pointToPoint("recv", P2PCall{false, buf, count, dtype, peer, comm, stream});
}
int groupStart() {
  if (int e = injected("groupStart")) return e;
  ++groupDepth;
  return kSuccess;
}
int groupEnd() {
  if (int e = injected("groupEnd")) {
    // As NCCL: a failed groupEnd still ends the group, enqueueing nothing.
    if (groupDepth > 0 && --groupDepth == 0) {
      grouped.clear();
      groupError = kSuccess;
    }
    return e;
  }
  if (groupDepth == 0) {
    std::lock_guard<std::mutex> l(st().mu);
    return failLocked(nullptr, kInvalidUsage, "groupEnd without groupStart");
  }
  if (--groupDepth > 0) return kSuccess;
  // As NCCL: a group with a failed call enqueues nothing and reports it.
  const int e = groupError;
  groupError = kSuccess;
  if (e != kSuccess) grouped.clear();
  return e != kSuccess ? e : launchGroup();
}

// The table of NCCL `version`: the fault-tolerance calls from the
// versions that have them.
Api makeTable(int version) {
  Api t;
  t.version = version;
  if (version >= 22700) t.commShrink = commShrink;
  if (version >= 22807) t.commRevoke = commRevoke;
  t.getErrorString = getErrorString;
  t.getLastError = getLastError;
  t.getUniqueId = getUniqueId;
  t.commInitRank = commInitRank;
  t.commSplit = commSplit;
  t.commGetAsyncError = commGetAsyncError;
  t.commFinalize = commFinalize;
  t.commDestroy = commDestroy;
  t.commAbort = commAbort;
  t.allReduce = allReduce;
  t.reduceScatter = reduceScatter;
  t.allGather = allGather;
  t.broadcast = broadcast;
  t.reduce = reduceTo;
  t.send = send;
  t.recv = recv;
  t.groupStart = groupStart;
  t.groupEnd = groupEnd;
  return t;
}

// Aborts every live comm and forgets all of them. Under s.mu.
void resetLocked() {
  State& s = st();
  for (auto& kv : s.comms) {
    Comm& c = *kv.second;
    if (!c.dead && c.group) abortGroupLocked(*c.group, &c);
    c.dead = true;
  }
  s.comms.clear();
  s.pending.clear();
  s.cv.notify_all();
}

}  // namespace

void enable() {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  resetLocked();
  s.failures.clear();
  s.lastError.clear();
  s.collectivesRun = s.inits = s.aborts = s.splits = s.mismatches = 0;
  s.revokes = s.shrinks = 0;
  s.version = kVersion;
  s.abortReleasesPeers = true;
  s.enabled.store(true);
}

void setAbortReleasesPeers(bool release) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  s.abortReleasesPeers = release;
}

void disable() {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  s.enabled.store(false);
  resetLocked();
}

bool enabled() {
  return st().enabled.load();
}

const Api* api() {
  static const Api current = makeTable(kVersion);
  static const Api noRevoke = makeTable(22700);
  static const Api noShrink = makeTable(22600);
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (s.version >= 22807) return &current;
  return s.version >= 22700 ? &noRevoke : &noShrink;
}

void setVersion(int version) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  s.version = version;
}

std::vector<CommInfo> comms() {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  std::vector<std::pair<uint64_t, CommInfo>> live;
  for (auto& kv : s.comms) {
    const Comm& c = *kv.second;
    if (c.dead) continue;
    live.push_back({c.serial, CommInfo{kv.first, c.rank, c.nranks, c.device, c.asyncError}});
  }
  std::sort(live.begin(), live.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CommInfo> out;
  for (auto& p : live) out.push_back(p.second);
  return out;
}

void injectAsyncError(void* comm, int result) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (Comm* c = findLocked(comm)) {
    c->asyncError = result;
    failLocked(c, result, "injected asynchronous error " + std::to_string(result));
  }
}

void failNextCall(const char* entry, int result) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  s.failures[entry].push_back(result);
}

namespace {
int counted(int State::*counter) {
  std::lock_guard<std::mutex> l(st().mu);
  return st().*counter;
}
}  // namespace

int collectivesRun() {
  return counted(&State::collectivesRun);
}
int inits() {
  return counted(&State::inits);
}
int aborts() {
  return counted(&State::aborts);
}
int splits() {
  return counted(&State::splits);
}
int mismatches() {
  return counted(&State::mismatches);
}
int revokes() {
  return counted(&State::revokes);
}
int shrinks() {
  return counted(&State::shrinks);
}

}  // namespace gflow::testing::softnccl
