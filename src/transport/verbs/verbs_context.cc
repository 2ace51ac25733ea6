// Verbs transport data path: eager slots with credits, receiver-driven
// rendezvous, tag matching and envelope checks (protocol: verbs_context.h).
#include "transport/verbs/verbs_context.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/check.h"
#include "common/logging.h"
#include "transport/contract.h"

namespace gflow::transport::verbs {
namespace {

// Largest single RDMA write (the verbs limit is 2^31 bytes).
constexpr uint64_t kMaxWrite = uint64_t{1} << 30;
constexpr size_t kMaxErrorText = 1024;

SlotHeader slotHeader(uint16_t type, Tag tag, const Envelope& env, uint64_t len, size_t payload) {
  SlotHeader h{};
  h.magic = kSlotMagic;
  h.type = type;
  h.group = tag.group;
  h.index = tag.index;
  std::memcpy(h.env, env.words, sizeof(h.env));
  h.len = len;
  h.payload = static_cast<uint32_t>(payload);
  return h;
}

Envelope envOf(const SlotHeader& h) {
  Envelope e;
  std::memcpy(e.words, h.env, sizeof(e.words));
  return e;
}

class VerbsRegion final : public MemoryRegion {
 public:
  VerbsRegion(void* d, size_t n, std::shared_ptr<RegCache> cache, uint64_t id)
      : MemoryRegion(d, n), cache_(std::move(cache)), id_(id) {}
  ~VerbsRegion() override { cache_->removeExplicit(id_); }

 private:
  std::shared_ptr<RegCache> cache_;
  uint64_t id_;
};

}  // namespace

std::unique_ptr<MemoryRegion> VerbsContext::registerMemory(void* data, size_t size) {
  const uint64_t id = cache_->addExplicit(data, size);
  return std::make_unique<VerbsRegion>(data, size, cache_, id);
}

VerbsContext::Counters VerbsContext::counters() const {
  Counters c;
  {
    std::lock_guard<std::mutex> lock(countersMutex_);
    c = counters_;
  }
  if (cache_) {
    RegCache::Counters rc = cache_->counters();
    c.registrations = rc.registrations;
    c.registrationHits = rc.hits;
  }
  return c;
}

uint64_t VerbsContext::creditsConsumed(int peer) const {
  return peers_[peer]->creditSeen;
}

// ---- posting ---------------------------------------------------------------

void VerbsContext::postWr(int peer, int q, PendingWr w) {
  Peer& p = *peers_[peer];
  const WrKind kind = wrKind(w.wr.wr_id);
  if (kind == kWrSlot || kind == kWrData) ++p.dataOutstanding;
  postOrQueue(peer, q, std::move(w));
}

void VerbsContext::postOrQueue(int peer, int q, PendingWr w) {
  Peer& p = *peers_[peer];
  // In order: behind anything already waiting for send-queue space.
  if (!p.waiting[q].empty() || p.outstanding[q] >= sendDepth_) {
    p.waiting[q].push_back(std::move(w));
    return;
  }
  post(peer, q, w);
}

void VerbsContext::post(int peer, int q, PendingWr& w) {
  Peer& p = *peers_[peer];
  if (w.hasSge) {
    w.wr.sg_list = &w.sge;
    w.wr.num_sge = 1;
  } else {
    w.wr.sg_list = nullptr;
    w.wr.num_sge = 0;
  }
  w.wr.next = nullptr;
  ibv_send_wr* bad = nullptr;
  if (int rc = device_->api().postSend(p.qps[q], &w.wr, &bad)) {
    fail(Error(ErrorCode::kInternal,
               "ibv_post_send to rank " + std::to_string(peer) + " failed: " + std::strerror(rc),
               ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer)));
  }
  ++p.outstanding[q];
}

void VerbsContext::pumpWaiting(int peer, int q) {
  Peer& p = *peers_[peer];
  while (!p.waiting[q].empty() && p.outstanding[q] < sendDepth_) {
    PendingWr w = std::move(p.waiting[q].front());
    p.waiting[q].pop_front();
    post(peer, q, w);
  }
}

void VerbsContext::queueEager(int peer, OutMsg msg) {
  peers_[peer]->eagerQueue.push_back(std::move(msg));
  pumpEager(peer);
}

void VerbsContext::pumpEager(int peer) {
  Peer& p = *peers_[peer];
  if (!p.writable) return;  // on demand: sent once the peer's end is ready
  ArrivalStamp now;         // one stamp per call
  while (!p.eagerQueue.empty()) {
    const uint64_t inUse = p.sent - creditsConsumed(peer);
    const int slot = static_cast<int>(p.sent % static_cast<uint64_t>(slots_));
    if (inUse >= static_cast<uint64_t>(slots_) || p.outBusy[slot]) return;
    OutMsg& m = p.eagerQueue.front();
    m.hdr.seq = static_cast<uint32_t>(p.sent);
    if (m.hdr.stamp[0] != 0) restamp(m.hdr.group, m.hdr.stamp, now);  // as it leaves
    char* dst = p.outRing + static_cast<size_t>(slot) * slotBytes_;
    std::memcpy(dst, &m.hdr, sizeof(m.hdr));
    const char* src = m.owned.empty() ? m.payload : m.owned.data();
    if (m.hdr.payload > 0) std::memcpy(dst + sizeof(SlotHeader), src, m.hdr.payload);
    PendingWr w;
    w.wr.wr_id = makeWrId(kWrSlot, peer, static_cast<uint32_t>(slot));
    w.wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    w.wr.send_flags = IBV_SEND_SIGNALED;
    w.wr.imm_data = htonl(makeImm(kImmSlot, static_cast<uint32_t>(slot)));
    w.wr.wr.rdma.remote_addr = p.remoteRing + static_cast<uint64_t>(slot) * slotBytes_;
    w.wr.wr.rdma.rkey = p.remoteRingKey;
    w.sge.addr = reinterpret_cast<uintptr_t>(dst);
    w.sge.length = static_cast<uint32_t>(sizeof(SlotHeader) + m.hdr.payload);
    w.sge.lkey = p.outMr->lkey;
    w.hasSge = true;
    p.outBusy[slot] = true;
    ++p.sent;
    {
      std::lock_guard<std::mutex> lock(countersMutex_);
      ++counters_.eagerMessages;
      if (m.hdr.type != kSlotData) ++counters_.controlMessages;
    }
    RequestPtr req = std::move(m.req);
    const uint64_t bytes = m.hdr.type == kSlotData ? m.hdr.len : 0;
    p.eagerQueue.pop_front();
    postWr(peer, 0, std::move(w));
    if (req) {
      countSendDone(peer, bytes);
      req->complete();
    }
  }
}

void VerbsContext::returnCredits(int peer, bool force) {
  Peer& p = *peers_[peer];
  if (!p.writable) return;
  const uint64_t pending = p.consumed - p.creditReturned;
  if (pending == 0 || (!force && pending < static_cast<uint64_t>(std::max(1, slots_ / 4)))) return;
  PendingWr w;
  w.wr.wr_id = makeWrId(kWrCredit, peer, 0);
  // A zero-byte write whose immediate carries the consumed count (low 28
  // bits; the sender extends it): nothing is written into the sender's
  // memory, and a sender sleeping on credits wakes up.
  w.wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  w.wr.imm_data = htonl(makeImm(kImmCredit, static_cast<uint32_t>(p.consumed)));
  w.wr.send_flags = IBV_SEND_SIGNALED;
  w.wr.wr.rdma.remote_addr = p.remoteCredit;
  w.wr.wr.rdma.rkey = p.remoteCreditKey;
  w.hasSge = false;
  p.creditReturned = p.consumed;
  {
    std::lock_guard<std::mutex> lock(countersMutex_);
    ++counters_.creditWrites;
  }
  postWr(peer, 0, std::move(w));
}

void VerbsContext::sendControl(int peer, uint16_t type, Tag tag, const Envelope& env, uint64_t len,
                               ControlPayload payload) {
  const size_t n = payload.bytes;
  OutMsg m;
  m.hdr = slotHeader(type, tag, env, len, n);
  if (type == kSlotRts || type == kSlotCts) {
    std::memcpy(m.hdr.stamp, stampOf(tag).words, sizeof(m.hdr.stamp));
  }
  if (n > 0)
    m.owned.assign(static_cast<const char*>(payload.data),
                   static_cast<const char*>(payload.data) + n);
  queueEager(peer, std::move(m));
}

// ---- API -------------------------------------------------------------------

RequestPtr VerbsContext::isend(int peer, const void* data, size_t bytes, Tag tag,
                               const Envelope& env) {
  checkFailed();
  GFLOW_ENFORCE(peer >= 0 && peer < size() && peer != rank());
  checkPeer(peer);
  needPeer(peer);
  auto req = std::make_shared<Request>(peer, true, bytes);
  Peer& p = *peers_[peer];
  countSendPosted(peer);
  if (bytes <= eagerMax_) {
    OutMsg m;
    m.hdr = slotHeader(kSlotData, tag, env, bytes, bytes);
    std::memcpy(m.hdr.stamp, stampOf(tag).words, sizeof(m.hdr.stamp));
    m.payload = static_cast<const char*>(data);
    m.req = req;
    queueEager(peer, std::move(m));
    return req;
  }
  auto op = std::make_unique<SendOp>();
  op->req = req;
  op->peer = peer;
  op->tag = tag;
  op->env = env;
  op->data = static_cast<const char*>(data);
  op->len = bytes;
  op->reg = cache_->acquire(data, bytes, false);
  const uint32_t id = nextSendOp_++;
  if (nextSendOp_ == 0) nextSendOp_ = 1;
  sendOps_.emplace(id, std::move(op));
  auto cts = p.ctsArrived.find(tag);
  if (cts != p.ctsArrived.end()) {
    const CtsInfo info = cts->second;
    p.ctsArrived.erase(cts);
    matchCts(id, info);
  } else {
    p.awaitingCts.emplace(tag, id);
    sendControl(peer, kSlotRts, tag, env, bytes);
  }
  return req;
}

RequestPtr VerbsContext::irecv(int peer, void* data, size_t bytes, Tag tag, const Envelope& env) {
  checkFailed();
  GFLOW_ENFORCE(peer >= 0 && peer < size() && peer != rank());
  needPeer(peer);
  auto req = std::make_shared<Request>(peer, false, bytes);
  // No check of Peer::lost here: the data may be queued in the completion
  // queue from before the peer left; wait() raises it once that is drained.
  auto* m = static_cast<RecvMsg*>(postRecv(peer, tag, env, data, bytes, req));
  if (m->staging) {
    complete(peer, m);
  } else if (bytes > eagerMax_) {
    startRendezvousRecv(peer, *m);
  }
  return req;
}

void VerbsContext::startRendezvousRecv(int peer, RecvMsg& m) {
  m.rendezvous = true;
  m.reg = cache_->acquire(m.user, m.len, true);
  uint32_t idx;
  if (!freeRdv_.empty()) {
    idx = freeRdv_.back();
    freeRdv_.pop_back();
  } else {
    if (rdv_.size() >= 0xffff) {
      fail(Error(ErrorCode::kInternal, "more than 65535 rendezvous receives outstanding",
                 ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer)));
    }
    idx = static_cast<uint32_t>(rdv_.size());
    rdv_.emplace_back();
  }
  Rdv& r = rdv_[idx];
  r.used = true;
  r.peer = peer;
  r.tag = m.tag;
  r.gen = static_cast<uint16_t>((r.gen + 1) & 0x0fff);
  m.rid = (uint32_t(r.gen) << 16) | idx;
  CtsPayload c{reinterpret_cast<uintptr_t>(m.user), m.reg.rkey(), m.rid};
  sendControl(peer, kSlotCts, m.tag, m.env, m.len, {&c, sizeof(c)});
}

void VerbsContext::matchCts(uint32_t opId, const CtsInfo& info) {
  const CtsPayload& cts = info.cts;
  SendOp& op = *sendOps_.at(opId);
  const int peer = op.peer;
  if (info.env != op.env || info.len != op.len) {
    fail(Error(ErrorCode::kMismatch,
               "rank " + std::to_string(peer) + " expects " + std::to_string(info.len) +
                   " bytes for " + describe(info.env) + " where this rank sends " +
                   std::to_string(op.len) + " bytes for " + describe(op.env),
               ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer)));
  }
  uint64_t stripes = std::max<uint64_t>(1, std::min<uint64_t>(qpsPerPeer_, op.len / stripeMin_));
  uint64_t per = (op.len / stripes + 4095) & ~uint64_t(4095);
  per = std::min(per, kMaxWrite);
  const uint64_t count = (op.len + per - 1) / per;
  op.writesLeft = static_cast<int>(count);
  for (uint64_t k = 0; k < count; ++k) {
    const uint64_t off = k * per;
    const uint64_t len = std::min(per, op.len - off);
    PendingWr w;
    w.wr.wr_id = makeWrId(kWrData, peer, opId);
    w.wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    w.wr.send_flags = IBV_SEND_SIGNALED;
    w.wr.imm_data = htonl(makeImm(kImmData, cts.rid));
    w.wr.wr.rdma.remote_addr = cts.addr + off;
    w.wr.wr.rdma.rkey = cts.rkey;
    w.sge.addr = reinterpret_cast<uintptr_t>(op.data + off);
    w.sge.length = static_cast<uint32_t>(len);
    w.sge.lkey = op.reg.lkey();
    w.hasSge = true;
    postWr(peer, static_cast<int>(k % static_cast<uint64_t>(qpsPerPeer_)), std::move(w));
  }
  std::lock_guard<std::mutex> lock(countersMutex_);
  counters_.rendezvousWrites += count;
}

void VerbsContext::endOp() {
  cache_->endOp();
}

void VerbsContext::beginGroup(uint64_t group, const Envelope& env) {
  checkFailed();
  // The previous op is over: its per-op registrations go (see reg_cache.h).
  cache_->endOp();
  startGroup(group, env);
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    for (auto& kv : peers_[peer]->ctsArrived) {
      if (kv.first.group == group ? kv.second.env != env : isStale(kv.first.group, group)) {
        fail(Error(ErrorCode::kMismatch,
                   "rank " + std::to_string(peer) + " expects data for op #" +
                       std::to_string(kv.first.group) + " (" + describe(kv.second.env) +
                       ") that this rank does not send; ranks called different collectives",
                   ErrorContext().withSeq(group).withRank(rank()).withPeer(peer)));
      }
    }
    checkStaged(peer);
  }
}

// ---- inbound -----------------------------------------------------------------

void VerbsContext::handleSlot(int peer, const char* slot) {
  SlotHeader h;
  std::memcpy(&h, slot, sizeof(h));
  if (h.magic != kSlotMagic) protocolError(peer, "bad slot magic");
  if (h.payload > eagerMax_) protocolError(peer, "slot payload larger than the eager size");
  const uint32_t expect = static_cast<uint32_t>(peers_[peer]->consumed - 1);
  if (h.seq != expect) {
    protocolError(peer, "eager message " + std::to_string(h.seq) + " arrived where " +
                            std::to_string(expect) + " was expected");
  }
  const char* payload = slot + sizeof(SlotHeader);
  switch (h.type) {
    case kSlotData: handleData(peer, h, payload); break;
    case kSlotRts:
      if (h.payload != 0) protocolError(peer, "RTS with a payload");
      handleAnnounce(peer, h);
      break;
    case kSlotCts:
      if (h.payload != sizeof(CtsPayload)) protocolError(peer, "CTS of the wrong size");
      handleCts(peer, h, payload);
      break;
    case kSlotError: handleError(peer, h, payload); break;
    case kSlotPing:  // a waiter asks whether this rank is inside gflow
      sendControl(peer, kSlotPong, Tag{h.group, 0}, Envelope{}, 0);
      break;
    case kSlotPong: countPong(peer); break;
    case kSlotReject:
      if (isPointToPoint(h.group)) protocolError(peer, "rejection of a point-to-point op");
      peerRejected(h.group, rejectionReport(rank(), h.group, peer, payload,
                                            std::min<size_t>(h.payload, kMaxErrorText)));
      break;
    default: protocolError(peer, "unknown slot type " + std::to_string(h.type));
  }
}

void VerbsContext::handleData(int peer, const SlotHeader& h, const char* payload) {
  const Envelope env = envOf(h);
  if (h.len != h.payload) protocolError(peer, "eager message length differs from its payload");
  checkEnvelope(peer, h.group, env);
  checkStale(peer, h.group, env);
  arrival(peer, h.group, h.stamp);
  const Tag tag{h.group, h.index};
  auto* m = findAs<RecvMsg>(peer, tag);
  if (!m) {
    if (!stagingFits(peer, h.len)) {
      fail(Error(ErrorCode::kInternal,
                 "rank " + std::to_string(peer) + " sent " +
                     std::to_string(stagedBytes(peer) + h.len) +
                     " bytes that no receive has asked for (GFLOW_UNEXPECTED_LIMIT " +
                     std::to_string(unexpectedLimit()) + ")",
                 ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer)));
    }
    Message* staged = stage(peer, tag, env, h.len);
    if (h.len > 0) std::memcpy(staged->staging.get(), payload, h.len);
    return;
  }
  if (m->staging || m->announced) protocolError(peer, "two messages with one tag");
  checkArrival(peer, *m, env, h.len);
  if (h.len > 0) std::memcpy(m->user, payload, h.len);
  complete(peer, m);
}

void VerbsContext::handleAnnounce(int peer, const SlotHeader& h) {
  const Envelope env = envOf(h);
  checkEnvelope(peer, h.group, env);
  checkStale(peer, h.group, env);
  arrival(peer, h.group, h.stamp);
  const Tag tag{h.group, h.index};
  const ErrorContext ectx = ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer);
  if (h.len <= eagerMax_) protocolError(peer, "RTS for an eager-sized message");
  auto* m = findAs<RecvMsg>(peer, tag);
  if (!m) {
    static_cast<RecvMsg*>(add(peer, tag, env, h.len))->announced = true;
    return;
  }
  if (m->staging || m->announced) protocolError(peer, "two messages with one tag");
  if (m->env != env || m->len != h.len) {
    fail(Error(ErrorCode::kMismatch,
               "rank " + std::to_string(peer) + " sends " + std::to_string(h.len) + " bytes for " +
                   describe(env) + " where this rank expects " + std::to_string(m->len) +
                   " bytes for " + describe(m->env),
               ectx));
  }
  m->announced = true;  // the CTS is already on its way
}

void VerbsContext::handleCts(int peer, const SlotHeader& h, const char* payload) {
  Peer& p = *peers_[peer];
  CtsInfo info;
  std::memcpy(&info.cts, payload, sizeof(info.cts));
  info.env = envOf(h);
  info.len = h.len;
  checkEnvelope(peer, h.group, info.env);
  checkStale(peer, h.group, info.env);
  arrival(peer, h.group, h.stamp);
  const Tag tag{h.group, h.index};
  auto it = p.awaitingCts.find(tag);
  if (it == p.awaitingCts.end()) {
    // Checked against the send when it is posted.
    if (p.ctsArrived.size() >= 65536 || !p.ctsArrived.emplace(tag, info).second) {
      protocolError(peer, "unexpected or duplicate CTS");
    }
    return;
  }
  const uint32_t id = it->second;
  p.awaitingCts.erase(it);
  // An RTS still waiting for a credit is moot now, and must not arrive after
  // the data it announces (the data does not wait for credits).
  for (auto q = p.eagerQueue.begin(); q != p.eagerQueue.end(); ++q) {
    if (q->hdr.type == kSlotRts && q->hdr.group == tag.group && q->hdr.index == tag.index) {
      p.eagerQueue.erase(q);
      break;
    }
  }
  matchCts(id, info);
}

void VerbsContext::handleError(int peer, const SlotHeader& h, const char* payload) {
  // A peer's report of a failure this rank saw first hand in this op (its
  // completion came before the report) names the cause less well.
  const Error* cause = nullptr;
  for (int q = 0; q < size() && !cause; ++q) {
    const Peer& p = *peers_[q];
    if (q != rank() && p.lostIsCause && p.causeGroup == group()) cause = &*p.lost;
  }
  peerReported(h.group,
               peerReport(rank(), group(), peer, payload,
                          std::min<size_t>(h.payload, kMaxErrorText + kReportHeaderBytes)),
               cause);
}

void VerbsContext::handleRendezvousData(int peer, uint32_t rid, uint32_t bytes) {
  const uint32_t idx = rid & 0xffff;
  const uint16_t gen = static_cast<uint16_t>(rid >> 16);
  if (idx >= rdv_.size() || !rdv_[idx].used || rdv_[idx].gen != gen || rdv_[idx].peer != peer) {
    protocolError(peer, "write for an unknown rendezvous id " + std::to_string(rid));
  }
  auto* m = findAs<RecvMsg>(peer, rdv_[idx].tag);
  if (!m) protocolError(peer, "write for a finished receive");
  if (bytes > m->len - m->received) protocolError(peer, "rendezvous writes exceed the message");
  m->received += bytes;
  if (m->received < m->len) return;
  rdv_[idx].used = false;
  freeRdv_.push_back(idx);
  m->reg.reset();
  complete(peer, m);
}

// ---- failure -----------------------------------------------------------------

bool VerbsContext::hasPendingWith(int peer) const {
  const Peer& p = *peers_[peer];
  if (!p.awaitingCts.empty() || hasPostedRecv(peer)) return true;
  for (const OutMsg& m : p.eagerQueue) {
    if (m.req) return true;
  }
  for (const auto& kv : sendOps_) {
    if (kv.second->peer == peer) return true;
  }
  return false;
}

void VerbsContext::checkLost() {
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank() && peers_[peer]->lost && hasPendingWith(peer)) fail(*peers_[peer]->lost);
  }
}

void VerbsContext::checkPeer(int peer) {
  const Peer& p = *peers_[peer];
  if (p.lost) fail(*p.lost);
}

void VerbsContext::protocolError(int peer, const std::string& what) {
  GFLOW_LOG(WARN) << "rank " << rank() << ": invalid verbs message from rank " << peer << ": "
                  << what;
  fail(Error(ErrorCode::kInternal,
             "invalid verbs message from rank " + std::to_string(peer) + ": " + what,
             ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer)));
}

void VerbsContext::wake() {
  uint64_t one = 1;
  ssize_t rc = ::write(wakeFd_, &one, sizeof(one));
  (void)rc;
}

void VerbsContext::failWire(const Error& first) {
  for (auto& pp : peers_) {
    for (OutMsg& m : pp->eagerQueue) {
      if (m.req) m.req->fail(first);
    }
  }
  for (auto& kv : sendOps_) kv.second->req->fail(first);
}

void VerbsContext::errorQueuePairs() {
  if (qpsErrored_ || !device_) return;
  qpsErrored_ = true;
  // No peer can write into this rank's memory any more (its writes fail),
  // and receives posted into user buffers are over.
  for (auto& pp : peers_) {
    for (ibv_qp* qp : pp->qps) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      device_->api().modifyQp(qp, &a, IBV_QP_STATE);
    }
  }
}

void VerbsContext::reject(uint64_t group, const std::string& why) {
  selfRejected(group);
  if (!device_ || qpsErrored_ || failed()) return;
  const size_t n = std::min({why.size(), kMaxErrorText, eagerMax_});
  for (int peer = 0; peer < size(); ++peer) {
    // A peer not connected yet has no op with this rank to be told of.
    if (peer == rank() || peers_[peer]->lost || !peers_[peer]->opened) continue;
    try {
      sendControl(peer, kSlotReject, Tag{group, 0}, Envelope{}, n, {why.data(), n});
    } catch (const Error&) {
      // The peer is gone: its next op with this rank says so.
    }
  }
}

void VerbsContext::notifyPeers(const Error& error) {
  if (!device_ || qpsErrored_) return;
  refuseWaitingPeers(error);
  const std::vector<char> payload =
      errorReportPayload(error, std::min(kMaxErrorText, eagerMax_ - kReportHeaderBytes));
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    Peer& p = *peers_[peer];
    for (OutMsg& q : p.eagerQueue) {
      if (q.req) q.req->fail(error);
    }
    p.eagerQueue.clear();
    // Not connected (on demand): the peer learns of it from its own op, or
    // from the refusal (refuseWaitingPeers).
    if (!p.writable) continue;
    // Best effort: the report goes first if a slot is free now. A peer whose
    // connection is broken (posting fails) does not keep it from the others.
    OutMsg m;
    m.hdr = slotHeader(kSlotError, Tag{group(), 0}, Envelope{}, payload.size(), payload.size());
    m.owned = payload;
    p.eagerQueue.push_back(std::move(m));
    try {
      pumpEager(peer);
    } catch (const Error&) {
      p.eagerQueue.clear();
      if (!p.lost) p.lost.emplace(error);
    }
  }
  // Let the writes go out (bounded), then stop all traffic.
  Deadline d = Deadline::after(std::chrono::milliseconds(300));
  while (!d.expired()) {
    bool busy = false;
    for (auto& pp : peers_) {
      if (!pp->lost) busy = busy || pp->dataOutstanding > 0 || !pp->eagerQueue.empty();
    }
    if (!busy) break;
    try {
      if (progress() == 0) sleepForEvents(1);
    } catch (const Error&) {
      // The context has failed, so whatever notices a failure (an async
      // event, a lost peer, a broken device) throws the first error again:
      // keep draining, without spinning.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  errorQueuePairs();
}

}  // namespace gflow::transport::verbs
