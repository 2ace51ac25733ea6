// The software RDMA device (soft_verbs.h): RC QPs, their state machine,
// posting, and the execution engine (the device thread, or inline in
// postSend/postRecv without one).
//
// Execution runs each QP's send queue in order, one WR per QP per pass.
// A WR: checks its local SGEs against the QP's PD (IBV_WC_LOC_PROT_ERR),
// finds the peer QP (unreachable: retried, then IBV_WC_RETRY_EXC_ERR), checks
// the rkey and range against the peer's PD and the peer QP's access flags
// (IBV_WC_REM_ACCESS_ERR, the peer QP goes to error with
// IBV_EVENT_QP_ACCESS_ERR), takes a receive for *_WITH_IMM and SEND (none
// posted: RNR, waits forever with rnr_retry 7), copies the data, then queues
// the responder's and the requester's CQEs, all under the fabric mutex, so
// the data is visible before any CQE is.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "testing/soft_verbs_internal.h"

namespace gflow::testing::softverbs::detail {
namespace {

using Lock = std::lock_guard<std::mutex>;

constexpr uint32_t kMaxWr = 16384;
constexpr uint32_t kMaxSge = 30;
constexpr uint32_t kMaxInline = 256;
constexpr uint8_t kMaxRdAtomic = 16;

ibv_wc_opcode wcOpcode(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM: return IBV_WC_SEND;
    default: return IBV_WC_RDMA_WRITE;
  }
}

void sendCqe(Fabric& f, Qp* q, const SendWr& w, ibv_wc_status status, uint32_t len) {
  CqEntry e;
  e.wc.wr_id = w.wrId;
  e.wc.status = status;
  e.wc.opcode = wcOpcode(w.opcode);
  e.wc.vendor_err = status == IBV_WC_SUCCESS ? 0 : 0x80u + status;
  e.wc.byte_len = status == IBV_WC_SUCCESS ? len : 0;
  e.wc.qp_num = q->qp.qp_num;
  e.qp = q;
  e.isSend = true;
  e.seq = w.seq;
  pushCqe(f, q->scq, e);
}

void recvFlushCqe(Fabric& f, Qp* q, uint64_t wrId, ibv_wc_status status) {
  CqEntry e;
  e.wc.wr_id = wrId;
  e.wc.status = status;
  e.wc.opcode = IBV_WC_RECV;
  e.wc.vendor_err = 0x80u + status;
  e.wc.qp_num = q->qp.qp_num;
  e.qp = q;
  pushCqe(f, q->rcq, e);
}

// The device moves q to the error state: every WR not yet executed is
// flushed. (ibv_qp::state is left alone, as rdma-core does.)
void toError(Fabric& f, Qp* q) {
  if (q->state == IBV_QPS_ERR) return;
  q->state = IBV_QPS_ERR;
  for (const SendWr& w : q->sq) sendCqe(f, q, w, IBV_WC_WR_FLUSH_ERR, 0);
  q->sq.clear();
  for (const RecvWr& r : q->rq) recvFlushCqe(f, q, r.wrId, IBV_WC_WR_FLUSH_ERR);
  q->rq.clear();
}

// Completes the head WR with an error and moves the QP to error.
bool failHead(Fabric& f, Qp* q, ibv_wc_status status) {
  sendCqe(f, q, q->sq.front(), status, 0);
  q->sq.pop_front();
  toError(f, q);
  return true;
}

void cleanCqs(Qp* q) {
  for (Cq* cq : {q->scq, q->rcq}) {
    auto& v = cq->entries;
    for (auto it = v.begin(); it != v.end();) it = it->qp == q ? v.erase(it) : it + 1;
  }
}

Mr* mrFor(const std::unordered_map<uint32_t, Mr*>& keys, uint32_t key, Pd* pd, uint64_t addr,
          uint64_t len) {
  auto it = keys.find(key);
  if (it == keys.end() || it->second->pd != pd) return nullptr;
  const ibv_mr& mr = it->second->mr;
  auto base = reinterpret_cast<uint64_t>(mr.addr);
  if (addr < base || addr + len < addr || addr + len > base + mr.length) return nullptr;
  return it->second;
}

// The responder QP `q` would accept packets from, or nullptr.
Qp* reachable(Fabric& f, Qp* q) {
  if (q->destDevice < 0) return nullptr;
  auto it = f.qps.find(q->destQpn);
  if (it == f.qps.end()) return nullptr;
  Qp* d = it->second;
  if (d->ctx->dead || d->ctx->devIndex != q->destDevice) return nullptr;
  if (d->state != IBV_QPS_RTR && d->state != IBV_QPS_RTS) return nullptr;
  if (d->destQpn != q->qp.qp_num) return nullptr;  // RC: packets from another QP are dropped
  return d;
}

Clock::duration retryLimit(Fabric& f, Qp* q) {
  Clock::duration cap = std::chrono::milliseconds(f.cfg.transportRetryMs);
  if (q->timeout == 0) return cap;  // 0: infinite in the spec
  auto real = std::chrono::nanoseconds(int64_t{4096} << q->timeout) * (q->retryCnt + 1);
  return std::min<Clock::duration>(cap, real);
}

Clock::duration rnrLimit(Fabric& f, Qp* q, Qp* d) {
  // IB spec RNR NAK timer values, in microseconds (index: min_rnr_timer).
  static const int64_t kUs[32] = {655360, 10,    20,    30,     40,     60,     80,     120,
                                  160,    240,   320,   480,    640,    960,    1280,   1920,
                                  2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
                                  40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
  Clock::duration cap = std::chrono::milliseconds(f.cfg.transportRetryMs);
  auto real = std::chrono::microseconds(kUs[d->minRnrTimer & 31] * q->rnrRetry);
  return std::min<Clock::duration>(cap, real);
}

// The head WR could not go out: retry until `limit` has passed since the
// first attempt, then fail it with `status`.
bool retryOrFail(Fabric& f, Qp* q, Clock::time_point now, bool immediate, Clock::duration limit,
                 ibv_wc_status status, Clock::time_point* wake) {
  SendWr& w = q->sq.front();
  if (!w.retrying) {
    w.retrying = true;
    w.firstTry = now;
  }
  if (immediate || now >= w.firstTry + limit) return failHead(f, q, status);
  *wake = std::min(*wake, w.firstTry + limit);
  return false;
}

void gather(const SendWr& w, char* out) {
  if (w.isInline) {
    if (!w.inlineData.empty()) std::memmove(out, w.inlineData.data(), w.inlineData.size());
    return;
  }
  for (const ibv_sge& s : w.sg) {
    if (s.length > 0) std::memmove(out, reinterpret_cast<const void*>(s.addr), s.length);
    out += s.length;
  }
}

// Executes the head of q's send queue if it can; true when it made progress.
bool step(Fabric& f, Qp* q, Clock::time_point now, bool immediate, Clock::time_point* wake) {
  if (q->state != IBV_QPS_RTS || q->ctx->dead || q->sq.empty()) return false;
  SendWr& w = q->sq.front();
  uint64_t len = 0;
  if (w.isInline) {
    len = w.inlineData.size();
  } else {
    for (const ibv_sge& s : w.sg) {
      len += s.length;
      if (s.length > 0 && mrFor(f.byLkey, s.lkey, q->pd, s.addr, s.length) == nullptr) {
        return failHead(f, q, IBV_WC_LOC_PROT_ERR);
      }
    }
  }
  if (len > (uint64_t{1} << 31)) return failHead(f, q, IBV_WC_LOC_LEN_ERR);
  Qp* d = reachable(f, q);
  if (d == nullptr) {
    return retryOrFail(f, q, now, immediate, retryLimit(f, q), IBV_WC_RETRY_EXC_ERR, wake);
  }
  bool write = w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  bool imm = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM || w.opcode == IBV_WR_SEND_WITH_IMM;
  if (write) {
    const bool inject = f.injectRemoteAccessError &&
                        (f.injectFrom == std::thread::id() || q->ctx->opener == f.injectFrom);
    if (inject) f.injectRemoteAccessError = false;
    bool ok = len == 0 ||  // zero-length: no R_Key check (IB spec)
              ((d->accessFlags & IBV_ACCESS_REMOTE_WRITE) != 0 && [&] {
                Mr* m = mrFor(f.byRkey, w.rkey, d->pd, w.remoteAddr, len);
                return m != nullptr && (m->access & IBV_ACCESS_REMOTE_WRITE) != 0;
              }());
    if (inject || !ok) {
      failHead(f, q, IBV_WC_REM_ACCESS_ERR);
      toError(f, d);
      ibv_async_event ev{};
      ev.element.qp = &d->qp;
      ev.event_type = IBV_EVENT_QP_ACCESS_ERR;
      queueAsyncEvent(f, d->ctx, ev);
      return true;
    }
  }
  bool needsRecv = w.opcode != IBV_WR_RDMA_WRITE;
  if (needsRecv && d->rq.empty()) {
    if (q->rnrRetry == 7) return false;  // infinite RNR retry: wait for a receive
    return retryOrFail(f, q, now, immediate, rnrLimit(f, q, d), IBV_WC_RNR_RETRY_EXC_ERR, wake);
  }
  if (write) {
    gather(w, reinterpret_cast<char*>(w.remoteAddr));
  } else {  // SEND: scatter into the receive's SGEs
    const RecvWr& r = d->rq.front();
    uint64_t room = 0;
    for (const ibv_sge& s : r.sg) {
      Mr* m = s.length == 0 ? nullptr : mrFor(f.byLkey, s.lkey, d->pd, s.addr, s.length);
      if (s.length > 0 && (m == nullptr || (m->access & IBV_ACCESS_LOCAL_WRITE) == 0)) {
        uint64_t id = r.wrId;
        d->rq.pop_front();
        recvFlushCqe(f, d, id, IBV_WC_LOC_PROT_ERR);
        toError(f, d);
        return failHead(f, q, IBV_WC_REM_OP_ERR);
      }
      room += s.length;
    }
    if (room < len) {
      uint64_t id = r.wrId;
      d->rq.pop_front();
      recvFlushCqe(f, d, id, IBV_WC_LOC_LEN_ERR);
      toError(f, d);
      return failHead(f, q, IBV_WC_REM_INV_REQ_ERR);
    }
    std::vector<char> data(len);
    gather(w, data.data());
    uint64_t off = 0;
    for (const ibv_sge& s : r.sg) {
      uint64_t n = std::min<uint64_t>(s.length, len - off);
      if (n > 0) std::memcpy(reinterpret_cast<void*>(s.addr), data.data() + off, n);
      off += n;
    }
  }
  f.counters.bytesWritten += len;
  if (w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) f.counters.writesWithImm++;
  if (needsRecv) {
    CqEntry e;
    e.wc.wr_id = d->rq.front().wrId;
    e.wc.status = IBV_WC_SUCCESS;
    e.wc.opcode = write ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
    e.wc.byte_len = static_cast<uint32_t>(len);
    if (imm) {
      e.wc.wc_flags = IBV_WC_WITH_IMM;
      e.wc.imm_data = w.imm;  // network order, unchanged
    }
    e.wc.qp_num = d->qp.qp_num;
    e.wc.src_qp = q->qp.qp_num;
    e.wc.slid = f.devices[static_cast<size_t>(q->ctx->devIndex)]->lid;
    e.qp = d;
    e.solicited = w.solicited;
    d->rq.pop_front();
    pushCqe(f, d->rcq, e);
  }
  if (w.signaled) sendCqe(f, q, w, IBV_WC_SUCCESS, static_cast<uint32_t>(len));
  q->sq.pop_front();
  return true;
}

// One WR per QP (fairness); true when any made progress.
bool runPass(Fabric& f, bool immediate, Clock::time_point* wake) {
  bool any = false;
  Clock::time_point now = Clock::now();
  for (auto& [n, q] : f.qps) any = step(f, q, now, immediate, wake) || any;
  return any;
}

int checkCreate(Pd* p, const ibv_qp_init_attr* attr) {
  if (p->ctx->dead) return EIO;
  if (attr == nullptr) return EINVAL;
  if (attr->qp_type != IBV_QPT_RC || attr->srq != nullptr) return EOPNOTSUPP;
  if (attr->send_cq == nullptr || attr->recv_cq == nullptr) return EINVAL;
  if (cqOf(attr->send_cq)->ctx != p->ctx || cqOf(attr->recv_cq)->ctx != p->ctx) return EINVAL;
  const ibv_qp_cap& c = attr->cap;
  if (c.max_send_wr > kMaxWr || c.max_recv_wr > kMaxWr) return EINVAL;
  if (c.max_send_sge > kMaxSge || c.max_recv_sge > kMaxSge) return EINVAL;
  if (c.max_inline_data > kMaxInline) return EINVAL;
  return 0;
}

int checkSend(const Qp* q, const ibv_send_wr* w, uint64_t total) {
  if (q->ctx->dead) return EIO;
  if (q->state != IBV_QPS_RTS && q->state != IBV_QPS_ERR) return EINVAL;
  if (w->num_sge < 0 || static_cast<uint32_t>(w->num_sge) > q->cap.max_send_sge) return EINVAL;
  if (w->num_sge > 0 && w->sg_list == nullptr) return EINVAL;
  if (w->opcode != IBV_WR_RDMA_WRITE && w->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
      w->opcode != IBV_WR_SEND && w->opcode != IBV_WR_SEND_WITH_IMM) {
    return EINVAL;  // RDMA READ, atomics, ...: not implemented
  }
  if ((w->send_flags & IBV_SEND_INLINE) != 0 && total > q->cap.max_inline_data) return EINVAL;
  // A slot is held until a CQE of this WR or a later one of the QP is polled.
  if (q->sendPosted - q->sendRetired >= q->cap.max_send_wr) return ENOMEM;
  return 0;
}

int checkRecv(const Qp* q, const ibv_recv_wr* w) {
  if (q->ctx->dead) return EIO;
  if (q->state == IBV_QPS_RESET) return EINVAL;
  if (w->num_sge < 0 || static_cast<uint32_t>(w->num_sge) > q->cap.max_recv_sge) return EINVAL;
  if (w->num_sge > 0 && w->sg_list == nullptr) return EINVAL;
  if (q->recvPosted - q->recvRetired >= q->cap.max_recv_wr) return ENOMEM;
  return 0;
}

}  // namespace

void kick(Fabric& f) {
  if (f.cfg.deviceThread) {
    f.cv.notify_one();
    return;
  }
  Clock::time_point wake = Clock::time_point::max();
  while (runPass(f, /*immediate=*/true, &wake)) {
  }
}

void deviceThreadMain() {
  Fabric& f = fabric();
  std::unique_lock<std::mutex> lock(f.mu);
  while (!f.stop) {
    Clock::time_point wake = Clock::time_point::max();
    if (runPass(f, /*immediate=*/false, &wake)) {
      lock.unlock();  // let posters and pollers in between passes
      std::this_thread::yield();
      lock.lock();
    } else if (wake == Clock::time_point::max()) {
      f.cv.wait(lock);
    } else {
      f.cv.wait_until(lock, wake);
    }
  }
}

void killQps(Fabric& f, Ctx* ctx) {
  for (auto& [n, q] : f.qps) {
    if (q->ctx != ctx) continue;
    q->sq.clear();
    q->rq.clear();
  }
}

void freeQp(Fabric& f, Qp* q) {
  cleanCqs(q);
  q->pd->qps--;
  q->scq->qps--;
  q->rcq->qps--;
  q->ctx->children--;
  f.qps.erase(q->qp.qp_num);
  delete q;
}

ibv_qp* createQp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Pd* p = pdOf(pd);
  if (int err = checkCreate(p, attr)) {
    errno = err;
    return nullptr;
  }
  auto* q = new Qp;
  q->qp.context = pd->context;
  q->qp.qp_context = attr->qp_context;
  q->qp.pd = pd;
  q->qp.send_cq = attr->send_cq;
  q->qp.recv_cq = attr->recv_cq;
  q->qp.handle = ++f.nextKey;
  q->qp.qp_num = (f.nextQpn += 3) & 0xffffffu;
  q->qp.state = IBV_QPS_RESET;
  q->qp.qp_type = IBV_QPT_RC;
  q->ctx = p->ctx;
  q->pd = p;
  q->scq = cqOf(attr->send_cq);
  q->rcq = cqOf(attr->recv_cq);
  q->cap = attr->cap;
  q->sigAll = attr->sq_sig_all != 0;
  p->qps++;
  q->scq->qps++;
  q->rcq->qps++;
  q->ctx->children++;
  f.qps[q->qp.qp_num] = q;
  return &q->qp;
}

namespace {

// The kernel's table (ib_modify_qp_is_ok) for RC: required and optional
// attributes of each transition; false when the transition is invalid.
bool transitionMasks(ibv_qp_state cur, ibv_qp_state next, int* req, int* opt) {
  *req = *opt = 0;
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) return true;
  if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
    *req = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
    *opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
    *req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    *opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
  } else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
    *req = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
           IBV_QP_MAX_QP_RD_ATOMIC;
    *opt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
           IBV_QP_PATH_MIG_STATE;
  } else if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS) {
    *opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
           IBV_QP_MIN_RNR_TIMER;
  } else {
    return false;
  }
  return true;
}

// Resolves the address vector to a device index (-1: no such port on the
// fabric, which only shows as retries). RoCE: EINVAL when the GID resolves
// nowhere, as rdma-core's address resolution fails.
int resolveAv(Fabric& f, const ibv_ah_attr& ah, int* device) {
  if (ah.port_num != 1) return EINVAL;
  if (ah.is_global && ah.grh.sgid_index >= f.cfg.gidTableLen) return EINVAL;
  *device = -1;
  if (!f.cfg.roce) {
    for (auto& d : f.devices) {
      if (d->lid == ah.dlid) *device = d->index;
    }
    return 0;
  }
  if (!ah.is_global) return EINVAL;
  for (auto& d : f.devices) {
    for (const ibv_gid& g : d->gids) {
      if (std::memcmp(g.raw, ah.grh.dgid.raw, sizeof g.raw) == 0) *device = d->index;
    }
  }
  return *device < 0 ? EINVAL : 0;
}

}  // namespace

int modifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Qp* q = qpOf(qp);
  if (q->ctx->dead) return EIO;
  ibv_qp_state cur = q->state;
  if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) return EINVAL;
  ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
  int req = 0, opt = 0;
  if (!transitionMasks(cur, next, &req, &opt)) return EINVAL;
  if ((mask & req) != req || (mask & ~(req | opt | IBV_QP_STATE)) != 0) return EINVAL;
  if ((mask & IBV_QP_PORT) && attr->port_num != 1) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) return EINVAL;
  if ((mask & IBV_QP_PATH_MTU) && (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096)) {
    return EINVAL;
  }
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && attr->timeout > 31) return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && attr->min_rnr_timer > 31) return EINVAL;
  if ((mask & IBV_QP_DEST_QPN) && attr->dest_qp_num > 0xffffffu) return EINVAL;
  int device = q->destDevice;
  if (mask & IBV_QP_AV) {
    if (int err = resolveAv(f, attr->ah_attr, &device)) return err;
  }
  // Valid: apply.
  if (mask & IBV_QP_ACCESS_FLAGS) q->accessFlags = static_cast<int>(attr->qp_access_flags);
  if (mask & IBV_QP_AV) q->destDevice = device;
  if (mask & IBV_QP_DEST_QPN) q->destQpn = attr->dest_qp_num;
  if (mask & IBV_QP_TIMEOUT) q->timeout = attr->timeout;
  if (mask & IBV_QP_RETRY_CNT) q->retryCnt = attr->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) q->rnrRetry = attr->rnr_retry;
  if (mask & IBV_QP_MIN_RNR_TIMER) q->minRnrTimer = attr->min_rnr_timer;
  if (next == IBV_QPS_ERR) {
    toError(f, q);
  } else if (next == IBV_QPS_RESET) {  // discards the queues and their CQEs
    q->sq.clear();
    q->rq.clear();
    cleanCqs(q);
    q->sendRetired = q->sendPosted;
    q->recvRetired = q->recvPosted;
    q->destDevice = -1;
    q->destQpn = 0;
    q->accessFlags = 0;
  }
  q->state = next;
  q->qp.state = next;
  kick(f);
  return 0;
}

int destroyQp(ibv_qp* qp) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  freeQp(f, qpOf(qp));
  kick(f);  // peers waiting on it now retry
  return 0;
}

int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** badWr) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Qp* q = qpOf(qp);
  int err = 0;
  for (ibv_send_wr* w = wr; w != nullptr; w = w->next) {
    uint64_t total = 0;
    for (int i = 0; i < w->num_sge && w->sg_list != nullptr; ++i) total += w->sg_list[i].length;
    bool isInline = (w->send_flags & IBV_SEND_INLINE) != 0;
    err = checkSend(q, w, total);
    if (err != 0) {
      if (badWr != nullptr) *badWr = w;
      break;
    }
    SendWr s;
    s.wrId = w->wr_id;
    s.seq = ++q->sendPosted;
    s.opcode = w->opcode;
    s.signaled = q->sigAll || (w->send_flags & IBV_SEND_SIGNALED) != 0;
    s.solicited = (w->send_flags & IBV_SEND_SOLICITED) != 0;
    s.imm = w->imm_data;
    s.remoteAddr = w->wr.rdma.remote_addr;
    s.rkey = w->wr.rdma.rkey;
    f.counters.postSendWrs++;
    if (q->state == IBV_QPS_ERR) {
      sendCqe(f, q, s, IBV_WC_WR_FLUSH_ERR, 0);
      continue;
    }
    s.isInline = isInline;
    if (isInline) {  // the data is copied now; the buffer may be reused at once
      s.inlineData.resize(total);
      char* out = s.inlineData.data();
      for (int i = 0; i < w->num_sge; ++i) {
        const ibv_sge& g = w->sg_list[i];
        if (g.length > 0) std::memcpy(out, reinterpret_cast<const void*>(g.addr), g.length);
        out += g.length;
      }
    } else {
      s.sg.assign(w->sg_list, w->sg_list + w->num_sge);
    }
    q->sq.push_back(std::move(s));
  }
  kick(f);
  return err;
}

int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** badWr) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Qp* q = qpOf(qp);
  int err = 0;
  for (ibv_recv_wr* w = wr; w != nullptr; w = w->next) {
    err = checkRecv(q, w);
    if (err != 0) {
      if (badWr != nullptr) *badWr = w;
      break;
    }
    q->recvPosted++;
    f.counters.postRecvWrs++;
    if (q->state == IBV_QPS_ERR) {
      recvFlushCqe(f, q, w->wr_id, IBV_WC_WR_FLUSH_ERR);
      continue;
    }
    RecvWr r;
    r.wrId = w->wr_id;
    r.sg.assign(w->sg_list, w->sg_list + w->num_sge);
    q->rq.push_back(std::move(r));
  }
  kick(f);  // a sender may be waiting (RNR)
  return err;
}

}  // namespace gflow::testing::softverbs::detail
