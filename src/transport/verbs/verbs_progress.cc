// Verbs transport progress: completion polling, adaptive busy-poll / event
// wait, async events, liveness probes and deadlines.
#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/logging.h"
#include "transport/liveness.h"
#include "transport/verbs/verbs_context.h"

namespace gflow::transport::verbs {
namespace {

constexpr int kPollBatch = 32;
constexpr auto kProbeAfter = std::chrono::seconds(1);
// A rank busy with back-to-back ops neither sleeps (which reads device
// events) nor spins long: it reads them at the start of a wait this often.
constexpr auto kAsyncEventsEvery = std::chrono::milliseconds(1);

const char* wrWhat(WrKind k) {
  switch (k) {
    case kWrSlot: return "eager write";
    case kWrData: return "rendezvous write";
    case kWrRecv: return "receive";
    case kWrCredit: return "credit return";
    case kWrProbe: return "liveness probe";
    case kWrReady: return "connection-ready write";
  }
  return "work request";
}

}  // namespace

int VerbsContext::progress() {
  ibv_wc wc[kPollBatch];
  const int n = device_->api().pollCq(device_->cq(), kPollBatch, wc);
  pass(n == 0);
  if (n < 0) {
    fail(Error(ErrorCode::kInternal,
               "ibv_poll_cq on " + device_->name() + " failed (CQ overrun or device error)",
               ErrorContext().withSeq(group()).withRank(rank())));
  }
  if (n > 0) {
    std::lock_guard<std::mutex> lock(countersMutex_);
    counters_.completions += static_cast<uint64_t>(n);
  }
  for (int i = 0; i < n; ++i) {
    try {
      handleCompletion(wc[i]);
    } catch (const Error&) {
      // The context failed: account for the rest of the batch (it does not
      // throw any more) so that none of it is lost.
      for (int j = i + 1; j < n; ++j) handleCompletion(wc[j]);
      throw;
    }
  }
  if (fetcher_ && fetcher_->hasArrived()) adoptRecords();
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank() && !peers_[peer]->eagerQueue.empty()) pumpEager(peer);
  }
  return n;
}

void VerbsContext::handleCompletion(const ibv_wc& wc) {
  const WrKind kind = wrKind(wc.wr_id);
  const int peer = wrPeer(wc.wr_id);
  auto qi = qpIndex_.find(wc.qp_num);
  if (peer < 0 || peer >= size() || peer == rank() || qi == qpIndex_.end() ||
      qi->second.first != peer) {
    fail(Error(ErrorCode::kInternal, "work completion for an unknown queue pair or request",
               ErrorContext().withSeq(group()).withRank(rank())));
  }
  const int q = qi->second.second;
  Peer& p = *peers_[peer];
  if (kind != kWrRecv) --p.outstanding[q];
  if (kind == kWrSlot || kind == kWrData) --p.dataOutstanding;
  if (qpsErrored_ || failed()) {
    // Failed: only the send accounting goes on (notifyPeers and teardown
    // wait for it); nothing more lands in user buffers. A credit return
    // still frees ring slots: the failure report may wait for one.
    if (kind == kWrSlot && wrValue(wc.wr_id) < p.outBusy.size())
      p.outBusy[wrValue(wc.wr_id)] = false;
    const uint32_t imm = ntohl(wc.imm_data);
    if (kind == kWrRecv && !qpsErrored_ && wc.status == IBV_WC_SUCCESS &&
        (wc.wc_flags & IBV_WC_WITH_IMM) && imm >> 28 == kImmCredit) {
      try {
        creditReturned(peer, q, imm & 0x0fffffffu);
      } catch (const Error&) {
        // Posting failed: the report does not reach this peer.
      }
    }
    return;
  }
  if (wc.status != IBV_WC_SUCCESS) {
    recordFailedCompletion(peer, kind, wc);
    return;
  }
  switch (kind) {
    case kWrRecv: handleInbound(peer, q, wc); return;
    case kWrSlot: {
      const uint32_t slot = wrValue(wc.wr_id);
      if (slot < p.outBusy.size()) p.outBusy[slot] = false;
      break;
    }
    case kWrData: {
      auto it = sendOps_.find(wrValue(wc.wr_id));
      if (it != sendOps_.end() && --it->second->writesLeft == 0) {
        SendOp& op = *it->second;
        countSendDone(peer, op.len);
        RequestPtr req = op.req;
        sendOps_.erase(it);
        req->complete();
      }
      break;
    }
    case kWrProbe: p.probeInFlight = false; break;
    case kWrCredit:
    case kWrReady: break;
  }
  pumpWaiting(peer, q);
}

void VerbsContext::recordFailedCompletion(int peer, WrKind kind, const ibv_wc& wc) {
  const ErrorCode code = wc.status == IBV_WC_RETRY_EXC_ERR || wc.status == IBV_WC_REM_ACCESS_ERR ||
                                 wc.status == IBV_WC_WR_FLUSH_ERR
                             ? ErrorCode::kPeerLost
                             : ErrorCode::kInternal;
  char vendor[32];
  std::snprintf(vendor, sizeof(vendor), "0x%x", wc.vendor_err);
  Error e(code,
          std::string("RDMA ") + wrWhat(kind) + (kind == kWrRecv ? " from" : " to") + " rank " +
              std::to_string(peer) + " on " + device_->name() + " failed: " +
              device_->api().wcStatusStr(wc.status) + " (status " + std::to_string(wc.status) +
              ", vendor error " + vendor + "): " + adviceForStatus(wc.status),
          ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer));
  // Not failed at once: completions that arrived before the connection
  // broke may still be queued behind this one (a peer that finished and
  // left sent everything first). The error is raised once the queue is
  // drained if anything waits on the peer, or when it is next used.
  // An access, protection or length error is a cause and replaces a kept
  // consequence (a flush, a retry that ran out, ...).
  const bool cause = wc.status == IBV_WC_REM_ACCESS_ERR || wc.status == IBV_WC_LOC_PROT_ERR ||
                     wc.status == IBV_WC_LOC_LEN_ERR || wc.status == IBV_WC_REM_INV_REQ_ERR ||
                     wc.status == IBV_WC_LOC_QP_OP_ERR;
  Peer& p = *peers_[peer];
  if (!p.lost || (cause && !p.lostIsCause)) {
    p.lost.emplace(e);
    p.lostIsCause = cause;
    p.causeGroup = group();
  }
}

bool VerbsContext::creditReturned(int peer, int q, uint32_t low28) {
  Peer& p = *peers_[peer];
  // Credit returns come in order on QP 0; extend the low 28 bits.
  const uint64_t delta = (low28 - static_cast<uint32_t>(p.creditSeen)) & 0x0fffffffu;
  if (q != 0 || p.creditSeen + delta > p.sent) return false;
  p.creditSeen += delta;
  pumpEager(peer);
  return true;
}

void VerbsContext::handleInbound(int peer, int q, const ibv_wc& wc) {
  Peer& p = *peers_[peer];
  postReceives(peer, q, 1);
  if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc.wc_flags & IBV_WC_WITH_IMM)) {
    protocolError(peer, "inbound completion without an immediate");
  }
  const uint32_t imm = ntohl(wc.imm_data);
  const uint32_t v = imm & 0x0fffffffu;
  switch (imm >> 28) {
    case kImmSlot: {
      const uint32_t expect = static_cast<uint32_t>(p.consumed % static_cast<uint64_t>(slots_));
      if (q != 0 || v != expect) {
        protocolError(peer, "eager slot " + std::to_string(v) + " on QP " + std::to_string(q) +
                                " where slot " + std::to_string(expect) + " on QP 0 was expected");
      }
      // Counted before it is handled: a handler that fails the context
      // must not leave later slots looking out of order.
      ++p.consumed;
      handleSlot(peer, p.inRing + static_cast<size_t>(v) * slotBytes_);
      returnCredits(peer, false);
      break;
    }
    case kImmData: handleRendezvousData(peer, v, wc.byte_len); break;
    case kImmReady:
      // On demand: the lower rank of the pair has connected to this end.
      if (q != 0 || rank() < peer || p.writable) protocolError(peer, "unexpected READY");
      p.writable = true;
      pumpEager(peer);
      break;
    case kImmCredit:
      if (!creditReturned(peer, q, v)) {
        protocolError(peer, "credit return for eager messages never sent");
      }
      break;
    default: protocolError(peer, "unknown immediate " + std::to_string(imm));
  }
}

void VerbsContext::handleAsyncEvents() {
  const VerbsApi& api = device_->api();
  for (;;) {
    ibv_async_event ev{};
    if (api.getAsyncEvent(device_->context(), &ev) != 0) return;
    const ibv_event_type type = ev.event_type;
    int peer = -1;
    if (type == IBV_EVENT_QP_FATAL || type == IBV_EVENT_QP_REQ_ERR ||
        type == IBV_EVENT_QP_ACCESS_ERR || type == IBV_EVENT_COMM_EST ||
        type == IBV_EVENT_SQ_DRAINED || type == IBV_EVENT_PATH_MIG ||
        type == IBV_EVENT_PATH_MIG_ERR || type == IBV_EVENT_QP_LAST_WQE_REACHED) {
      auto it = ev.element.qp ? qpIndex_.find(ev.element.qp->qp_num) : qpIndex_.end();
      if (it != qpIndex_.end()) peer = it->second.first;
    }
    const std::string name = api.eventTypeStr(type);
    api.ackAsyncEvent(&ev);
    bool fatal = false;
    ErrorCode code = ErrorCode::kPeerLost;
    std::string advice;
    switch (type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
      case IBV_EVENT_PATH_MIG_ERR:
        fatal = !qpsErrored_;
        advice = "the connection broke (peer failure, or a protocol error on the wire)";
        break;
      case IBV_EVENT_PORT_ERR:
        // Another port's flap is not ours; on ours, RC retransmits through
        // a short flap and work completions fail if it lasts.
        if (ev.element.port_num == device_->port()) {
          GFLOW_LOG(WARN) << "rank " << rank() << ": " << device_->name() << " port "
                          << device_->port() << " went down (" << name
                          << "); transfers fail if it stays down (check ibstat, the cable, "
                          << "the switch)";
        }
        break;
      case IBV_EVENT_CQ_ERR:
        fatal = true;
        code = ErrorCode::kInternal;
        advice = "completion queue overrun (a gflow bug)";
        break;
      case IBV_EVENT_DEVICE_FATAL:
        fatal = true;
        code = ErrorCode::kInternal;
        advice = "the adapter failed (dmesg; the driver must be reset)";
        break;
      default: break;
    }
    if (!fatal) {
      GFLOW_LOG(DEBUG) << "rank " << rank() << ": " << device_->name() << " async event: " << name;
      continue;
    }
    fail(Error(code,
               device_->name() + " reported '" + name + "'" +
                   (peer >= 0 ? " on the connection to rank " + std::to_string(peer) : "") + ": " +
                   advice,
               ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer)));
  }
}

void VerbsContext::sleepForEvents(int timeoutMs, bool returnCreditsFirst) {
  const VerbsApi& api = device_->api();
  // A peer waiting for credits must not wait for this rank's sleep.
  for (int peer = 0; returnCreditsFirst && peer < size(); ++peer) {
    if (peer != rank() && !peers_[peer]->lost) returnCredits(peer, true);
  }
  if (int rc = api.reqNotifyCq(device_->cq(), 0)) {
    fail(Error(ErrorCode::kInternal, std::string("ibv_req_notify_cq failed: ") + std::strerror(rc),
               ErrorContext().withSeq(group()).withRank(rank())));
  }
  // A completion that arrived before arming raises no event.
  if (progress() > 0) return;
  pollfd fds[3] = {{device_->channel()->fd, POLLIN, 0},
                   {device_->context()->async_fd, POLLIN, 0},
                   {wakeFd_, POLLIN, 0}};
  int rc = ::poll(fds, 3, std::max(0, timeoutMs));
  if (rc <= 0) return;
  if (fds[0].revents & POLLIN) {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    unsigned got = 0;
    while (api.getCqEvent(device_->channel(), &cq, &ctx) == 0) ++got;
    if (got > 0) {
      api.ackCqEvents(device_->cq(), got);
      std::lock_guard<std::mutex> lock(countersMutex_);
      counters_.cqEvents += got;
    }
  }
  if (fds[1].revents & POLLIN) handleAsyncEvents();
  if (fds[2].revents & POLLIN) {
    uint64_t v;
    ssize_t r = ::read(wakeFd_, &v, sizeof(v));
    (void)r;
  }
}

void VerbsContext::probe(int peer) {
  Peer& p = *peers_[peer];
  p.probeInFlight = true;
  p.lastProbe = std::chrono::steady_clock::now();
  PendingWr w;
  w.wr.wr_id = makeWrId(kWrProbe, peer, 0);
  w.wr.opcode = IBV_WR_RDMA_WRITE;  // zero bytes: only the acknowledgement matters
  w.wr.send_flags = IBV_SEND_SIGNALED;
  w.wr.wr.rdma.remote_addr = p.remoteCredit;
  w.wr.wr.rdma.rkey = p.remoteCreditKey;
  w.hasSge = false;
  postWr(peer, 0, std::move(w));
}

void VerbsContext::pollOnce() {
  if (progress() == 0) checkLost();
}

bool VerbsContext::drained() const {
  for (const auto& pp : peers_) {
    if (!pp->lost && pp->dataOutstanding > 0) return false;
  }
  return true;
}

void VerbsContext::waitUntilDone(const RequestPtr& req, Deadline deadline) {
  const auto start = std::chrono::steady_clock::now();
  if (start - asyncEventsRead_ >= kAsyncEventsEvery) {
    asyncEventsRead_ = start;
    handleAsyncEvents();
  }
  const SpinPhase spin(waitPolicy_);
  LivenessProbe liveness(timeout());
  unsigned iter = 0;
  while (!req->done()) {
    const int n = progress();
    checkFailed();
    if (req->done()) break;
    ++iter;
    // Busy: keep polling, but look at the deadline and the peers now and
    // then, so traffic from others cannot starve a wait on a dead peer.
    if (n > 0 && (iter & 63) != 0) continue;
    const auto now = std::chrono::steady_clock::now();
    if (n == 0) checkLost();  // the completion queue is drained
    if (spin.polling()) {
      if ((iter & 4095) == 0) handleAsyncEvents();
      SpinPhase::relax();
      continue;
    }
    const int peer = req->peer();
    Peer& p = *peers_[peer];
    if (p.writable && now - start >= kProbeAfter && !p.probeInFlight &&
        now - p.lastProbe >= kProbeAfter) {
      probe(peer);
    }
    switch (liveness.step(deadline, pongs(peer))) {
      case LivenessProbe::Step::kPing:
        sendControl(peer, kSlotPing, Tag{group(), 0}, Envelope{}, 0);
        break;
      case LivenessProbe::Step::kTimeout:
        failTimeout(req, liveness.peerAlive(),
                    p.writable ? " over verbs"
                               : " over verbs (not connected: the peer has not answered this "
                                 "rank's request to connect)");
      case LivenessProbe::Step::kWait: break;
    }
    if (n == 0) {
      whileWaiting();
      sleepForEvents(liveness.sleepMs(deadline, 250));
    }
  }
}

}  // namespace gflow::transport::verbs
