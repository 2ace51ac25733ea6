#include "transport/engine.h"

#include <algorithm>
#include <cstring>

#include "common/params.h"

namespace gflow::transport {
namespace {

class TrivialRegion final : public MemoryRegion {
 public:
  TrivialRegion(void* d, size_t n) : MemoryRegion(d, n) {}
};

}  // namespace

Engine::Engine(const ContextOptions& options)
    : Context(options.rank, options.size),
      timeout_(options.timeout),
      unexpectedLimit_(options.progress.unexpectedLimitBytes
                           ? *options.progress.unexpectedLimitBytes
                           : params::unexpectedLimit()),
      arrivals_(options.arrivals && options.arrivals->enabled() ? options.arrivals : nullptr),
      pool_(std::min(unexpectedLimit_, kStagingKeep)),
      error_([this] { wake(); }) {
  books_.resize(options.size);
  for (auto& b : books_) b = std::make_unique<PeerBook>();
  arrivalRanks_ = options.arrivalRanks;
  if (arrivalRanks_.size() != static_cast<size_t>(options.size)) {
    arrivalRanks_.resize(static_cast<size_t>(options.size));
    for (int p = 0; p < options.size; ++p) arrivalRanks_[static_cast<size_t>(p)] = p;
  }
}

std::unique_ptr<MemoryRegion> Engine::registerMemory(void* data, size_t size) {
  return std::make_unique<TrivialRegion>(data, size);
}

// ---- failure -----------------------------------------------------------------

void Engine::abort(const Error& error) {
  error_.setAndWake(error);
}

void Engine::checkFailed() {
  // abort() set the error from another thread: fail everything pending here,
  // on the owning thread.
  if (error_.failed()) fail(*error_.get());
}

void Engine::fail(const Error& e) {
  owner_.enter();  // owning thread
  std::shared_ptr<const Error> first = error_.set(e);
  for (auto& b : books_) {
    for (auto& kv : b->msgs) {
      if (kv.second->req) kv.second->req->fail(*first);
    }
  }
  failWire(*first);
  throw *first;
}

void Engine::failTimeout(const RequestPtr& req, bool peerAlive, const char* via) {
  owner_.enter();  // owning thread
  fail(requestTimeout(rank(), group_, *req, peerAlive, via));
}

std::vector<Error> Engine::awaitReports(Deadline, int) {
  owner_.enter();  // owning thread
  std::vector<Error> all;
  for (const auto& kv : reports_) all.push_back(kv.second);
  return all;
}

void Engine::peerReported(uint64_t theirGroup, const Error& e, const Error* ownCause) {
  owner_.enter();                 // owning thread
  reports_.emplace(e.peer(), e);  // one per peer: bounded
  if (failed()) return;
  // The sender's op number came with the report: a report about an op this
  // rank has not started yet waits until it does (this rank's current op may
  // still complete, as it did on the other ranks).
  if (groupActive_ && isPast(group_, theirGroup)) {
    if (!deferredError_) {
      deferredError_.emplace(e);
      deferredGroup_ = theirGroup;
    }
    return;
  }
  fail(ownCause ? *ownCause : e);
}

void Engine::peerRejected(uint64_t theirGroup, const Error& e) {
  owner_.enter();  // owning thread
  // Bounded: the ops a peer can reject ahead of this rank's progress.
  constexpr size_t kMaxRejectedAhead = 1 << 16;
  if (selfRejected_ && !isPast(*selfRejected_, theirGroup)) return;  // rejected here too
  if (groupActive_ && theirGroup == group_) fail(e);                 // this rank runs the op now
  if (groupActive_ && !isPast(group_, theirGroup)) return;           // passed: rejected here too
  if (rejected_.size() >= kMaxRejectedAhead && !rejected_.count(theirGroup)) {
    fail(Error(ErrorCode::kInternal,
               "more than " + std::to_string(kMaxRejectedAhead) +
                   " notices of rejected ops ahead of this rank's op #" + std::to_string(group_),
               ErrorContext().withSeq(group_).withRank(rank()).withPeer(e.peer())));
  }
  rejected_.emplace(theirGroup, e);
}

void Engine::selfRejected(uint64_t group) {
  owner_.enter();  // owning thread
  selfRejected_ = group;
  while (!rejected_.empty() && !isPast(group, rejected_.begin()->first)) {
    rejected_.erase(rejected_.begin());
  }
}

// ---- progress ----------------------------------------------------------------

void Engine::wait(const RequestPtr& req, Deadline deadline) {
  owner_.enter();  // owning thread
  if (!req->done()) {
    checkFailed();
    waitUntilDone(req, deadline);
  }
  if (req->failed()) throw req->error();
}

bool Engine::test(const RequestPtr& req) {
  owner_.enter();  // owning thread
  checkFailed();
  if (!req->done()) pollOnce();
  if (req->failed()) throw req->error();
  return req->done();
}

void Engine::poll() {
  owner_.enter();  // owning thread
  checkFailed();
  pollOnce();
}

bool Engine::arrived(int peer, Tag tag) {
  owner_.enter();  // owning thread
  const Message* m = find(peer, tag);
  return m != nullptr && m->req == nullptr;
}

// ---- groups ------------------------------------------------------------------

void Engine::beginGroup(uint64_t group, const Envelope& env) {
  owner_.enter();  // owning thread
  checkFailed();
  startGroup(group, env);
  for (int peer = 0; peer < size(); ++peer) checkStaged(peer);
}

void Engine::startGroup(uint64_t group, const Envelope& env) {
  owner_.enter();  // owning thread
  group_ = group;
  groupEnv_ = env;
  groupActive_ = true;
  if (deferredError_ && !isPast(group, deferredGroup_)) fail(*deferredError_);
  // Notices of earlier ops concern ops this rank rejected too.
  while (!rejected_.empty() && isPast(rejected_.begin()->first, group)) {
    rejected_.erase(rejected_.begin());
  }
  auto it = rejected_.find(group);
  if (it != rejected_.end()) fail(it->second);
  passInGroup_ = false;
  settled_ = false;
  groupOp_ = arrivals_ ? arrivals_->opNumber() : 0;
  if (early_.empty()) return;
  // Stamps of this op that came before this rank began it.
  size_t keep = 0;
  for (const Early& e : early_) {
    if (e.group == group) {
      arrivals_->observe(arrivalRanks_[static_cast<size_t>(e.peer)], e.at, e.stamp, false);
    } else if (!isPast(e.group, group)) {
      early_[keep++] = e;
    }
  }
  early_.resize(keep);
}

void Engine::arrival(int peer, uint64_t group, const uint64_t (&stamp)[3]) {
  owner_.enter();  // owning thread
  if (!arrivals_ || isPointToPoint(group)) return;
  ArrivalStamp s;
  std::memcpy(s.words, stamp, sizeof(s.words));
  const int64_t now = Arrivals::now();
  if (inArrivalOp(group)) {
    arrivals_->observe(arrivalRanks_[static_cast<size_t>(peer)], now, s, settled_);
  } else if (early_.size() < kMaxEarly && (!groupActive_ || isPast(group_, group))) {
    early_.push_back(Early{group, peer, now, s});
  }
}

void Engine::pass(bool readNothing) {
  owner_.enter();  // owning thread
  // Only a pass of the op the Arrivals run: another part's waits poll this
  // context too (the hierarchical backend's probes), before its op began here.
  if (!inArrivalOp(group_)) {
    passInGroup_ = false;
    return;
  }
  // Nothing read since a pass of this op began: what queued before it is in.
  if (readNothing && passInGroup_ && passGroup_ == group_) settled_ = true;
  passGroup_ = group_;
  passInGroup_ = true;
}

// Data that arrived before this rank reached the op is checked now.
void Engine::checkStaged(int peer) {
  owner_.enter();  // owning thread
  for (auto& kv : books_[peer]->msgs) {
    const Message& m = *kv.second;
    if (m.req || isPointToPoint(m.tag.group)) continue;
    if (m.tag.group == group_ && m.env != groupEnv_) {
      fail(envelopeMismatch(rank(), group_, peer, describe(m.env), describe(groupEnv_)));
    }
    if (isPast(m.tag.group, group_)) {
      fail(unexpectedOp(rank(), group_, peer, m.tag.group, describe(m.env)));
    }
  }
}

// ---- matching ----------------------------------------------------------------

Message* Engine::find(int peer, Tag tag) {
  owner_.enter();  // owning thread
  auto& msgs = books_[peer]->msgs;
  auto it = msgs.find(tag);
  return it == msgs.end() ? nullptr : it->second.get();
}

Message* Engine::add(int peer, Tag tag, const Envelope& env, uint64_t len) {
  owner_.enter();  // owning thread
  std::unique_ptr<Message> m = newMessage();
  m->tag = tag;
  m->env = env;
  m->len = len;
  Message* raw = m.get();
  books_[peer]->msgs.emplace(tag, std::move(m));
  return raw;
}

Message* Engine::postRecv(int peer, Tag tag, const Envelope& env, void* data, size_t bytes,
                          RequestPtr req) {
  owner_.enter();  // owning thread
  Message* m = find(peer, tag);
  if (!m) {
    m = add(peer, tag, env, bytes);
  } else {
    if (m->req) {
      fail(Error(ErrorCode::kInternal, "two receives posted for one tag",
                 ErrorContext().withSeq(tag.group).withRank(rank()).withPeer(peer)));
    }
    if (m->env != env) {
      fail(envelopeMismatch(rank(), tag.group, peer, describe(m->env), describe(env)));
    }
    if (m->len != bytes) {
      fail(sizeMismatch(rank(), tag.group, peer, m->len, bytes, describe(env)));
    }
  }
  m->req = std::move(req);
  m->user = static_cast<char*>(data);
  return m;
}

void Engine::checkEnvelope(int peer, uint64_t group, const Envelope& env) {
  owner_.enter();  // owning thread
  if (groupActive_ && group == group_ && env != groupEnv_) {
    fail(envelopeMismatch(rank(), group_, peer, describe(env), describe(groupEnv_)));
  }
}

void Engine::checkStale(int peer, uint64_t group, const Envelope& env) {
  owner_.enter();  // owning thread
  if (groupActive_ && isStale(group, group_)) {
    fail(unexpectedOp(rank(), group_, peer, group, describe(env)));
  }
}

void Engine::checkArrival(int peer, const Message& m, const Envelope& env, uint64_t len) {
  owner_.enter();  // owning thread
  if (m.env != env) {
    fail(envelopeMismatch(rank(), group_, peer, describe(env), describe(m.env)));
  }
  if (m.len != len) fail(sizeMismatch(rank(), group_, peer, len, m.len, describe(m.env)));
}

bool Engine::stagingFits(int peer, uint64_t len) const {
  owner_.enter();  // owning thread
  return books_[peer]->stagedBytes + len + kStagedOverhead <= unexpectedLimit_;
}

Message* Engine::stage(int peer, Tag tag, const Envelope& env, uint64_t len) {
  owner_.enter();  // owning thread
  Message* m = add(peer, tag, env, len);
  StagingPool::Buffer b = pool_.take(len);
  m->staging = std::move(b.data);
  m->stagingCapacity = b.capacity;
  books_[peer]->stagedBytes += len + kStagedOverhead;
  return m;
}

Message* Engine::announce(int peer, Tag tag, const Envelope& env, uint64_t len) {
  owner_.enter();  // owning thread
  Message* m = add(peer, tag, env, len);
  m->charged = true;
  books_[peer]->stagedBytes += kStagedOverhead;
  return m;
}

void Engine::complete(int peer, Message* m) {
  owner_.enter();  // owning thread
  PeerBook& b = *books_[peer];
  if (m->staging) {
    if (m->len > 0) std::memcpy(m->user, m->staging.get(), m->len);
    b.stagedBytes -= m->len + kStagedOverhead;
    pool_.give({std::move(m->staging), m->stagingCapacity});
  }
  if (m->charged) b.stagedBytes -= kStagedOverhead;
  b.bytesReceived.fetch_add(m->len, std::memory_order_relaxed);
  b.messagesReceived.fetch_add(1, std::memory_order_relaxed);
  RequestPtr req = m->req;
  const Tag tag = m->tag;  // erase() must not read the key of the node it frees
  b.msgs.erase(tag);
  req->complete();
}

bool Engine::hasPostedRecv(int peer) const {
  owner_.enter();  // owning thread
  for (const auto& kv : books_[peer]->msgs) {
    if (kv.second->req) return true;
  }
  return false;
}

void Engine::clearMessages() {
  owner_.enter();  // owning thread
  for (auto& b : books_) {
    b->msgs.clear();
    b->stagedBytes = 0;
  }
}

PeerStats Engine::peerStats(int peer) const {
  PeerStats s;
  if (peer < 0 || peer >= size()) return s;
  const PeerBook& b = *books_[peer];
  s.bytesSent = b.bytesSent.load(std::memory_order_relaxed);
  s.bytesReceived = b.bytesReceived.load(std::memory_order_relaxed);
  s.messagesSent = b.messagesSent.load(std::memory_order_relaxed);
  s.messagesReceived = b.messagesReceived.load(std::memory_order_relaxed);
  s.singleCopyBytesSent = b.singleCopyBytesSent.load(std::memory_order_relaxed);
  s.connections = static_cast<uint32_t>(std::max(b.connections.load(std::memory_order_relaxed), 0));
  return s;
}

}  // namespace gflow::transport
