// The software RDMA device (soft_verbs.h): devices, contexts, PDs, MRs,
// completion channels, CQs, async events and the install/fault API. QPs,
// posting and execution are in soft_verbs_qp.cc.
//
// Simplified against real hardware and rdma-core (also in docs/backends.md):
// - One fabric-wide mutex; data is copied under it by the device thread (or
//   inside postSend without one). No packets, PSNs, MTU segmentation or
//   acknowledgements: a WR lands whole or fails whole.
// - RC QPs only; RDMA READ, atomics, memory windows, SRQs, UD and alternate
//   paths are not implemented (createQp/postSend fail with EOPNOTSUPP/EINVAL).
//   SQD/SQE states are not reachable.
// - ibv_qp::state holds the state of the last modifyQp, as in rdma-core; the
//   device's own error transitions are not reflected in it (no queryQp).
// - Transport retries (unreachable peer) and RNR retries (rnr_retry < 7) wait
//   at most Config::transportRetryMs; without a device thread they fail at
//   once.
// - A zero-length RDMA write is not checked against the rkey (as the IB spec
//   says for zero-length transfers) but still needs a reachable peer QP.
// - CQ capacity is exactly the cqe requested (providers round up). After an
//   overflow the CQ is in error: new CQEs are dropped and pollCq returns -1.
// - A CQ event is generated only by a CQE added after reqNotifyCq (CQEs
//   already queued when arming do not trigger one).
// - closeDevice fails with EBUSY while objects remain (the kernel would clean
//   them up); destroyCq fails with EBUSY while CQ events are unacked (rdma-core
//   blocks). destroyQp/deregMr do not wait for unacked async events.
// - qp_num and keys are unique across the whole fabric; lkey != rkey.
#include "testing/soft_verbs.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "testing/soft_verbs_internal.h"
#include "transport/verbs/verbs_api.h"

namespace gflow::testing::softverbs {
namespace detail {

Fabric& fabric() {
  static Fabric* f = new Fabric;  // never destroyed: threads may outlive statics
  return *f;
}

void eventfdAdd(int fd, uint64_t n) {
  ssize_t r;
  do {
    r = ::write(fd, &n, sizeof n);
  } while (r < 0 && errno == EINTR);
}

void queueAsyncEvent(Fabric& f, Ctx* ctx, const ibv_async_event& ev) {
  (void)f;
  ctx->asyncEvents.push_back(ev);
  eventfdAdd(ctx->ctx.async_fd, 1);
}

void pushCqe(Fabric& f, Cq* cq, const CqEntry& e) {
  if (cq->error) return;
  if (cq->entries.size() >= cq->capacity) {
    cq->error = true;
    ibv_async_event ev{};
    ev.element.cq = &cq->cq;
    ev.event_type = IBV_EVENT_CQ_ERR;
    queueAsyncEvent(f, cq->ctx, ev);
    return;
  }
  cq->entries.push_back(e);
  if (cq->armed && (!cq->solicitedOnly || e.solicited || e.wc.status != IBV_WC_SUCCESS)) {
    cq->armed = false;
    if (cq->channel != nullptr) {
      cq->channel->events.push_back(cq);
      eventfdAdd(cq->channel->ch.fd, 1);
    }
  }
}

namespace {

using Lock = std::lock_guard<std::mutex>;

template <typename T>
T* fail(int err) {
  errno = err;
  return nullptr;
}

const char* wcStatusStr(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case IBV_WC_LOC_EEC_OP_ERR: return "local EE context operation error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_MW_BIND_ERR: return "memory management operation error";
    case IBV_WC_BAD_RESP_ERR: return "bad response error";
    case IBV_WC_LOC_ACCESS_ERR: return "local access error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    case IBV_WC_LOC_RDD_VIOL_ERR: return "local RDD violation error";
    case IBV_WC_REM_INV_RD_REQ_ERR: return "remote invalid RD request";
    case IBV_WC_REM_ABORT_ERR: return "aborted error";
    case IBV_WC_INV_EECN_ERR: return "invalid EE context number";
    case IBV_WC_INV_EEC_STATE_ERR: return "invalid EE context state";
    case IBV_WC_FATAL_ERR: return "fatal error";
    case IBV_WC_RESP_TIMEOUT_ERR: return "response timeout error";
    case IBV_WC_GENERAL_ERR: return "general error";
    default: return "unknown";
  }
}

const char* eventTypeStr(ibv_event_type t) {
  switch (t) {
    case IBV_EVENT_CQ_ERR: return "CQ error";
    case IBV_EVENT_QP_FATAL: return "local work queue catastrophic error";
    case IBV_EVENT_QP_REQ_ERR: return "invalid request local work queue error";
    case IBV_EVENT_QP_ACCESS_ERR: return "local access violation work queue error";
    case IBV_EVENT_COMM_EST: return "communication established";
    case IBV_EVENT_SQ_DRAINED: return "send queue drained";
    case IBV_EVENT_PATH_MIG: return "path migrated";
    case IBV_EVENT_PATH_MIG_ERR: return "path migration request error";
    case IBV_EVENT_DEVICE_FATAL: return "local catastrophic error";
    case IBV_EVENT_PORT_ACTIVE: return "port active";
    case IBV_EVENT_PORT_ERR: return "port error";
    case IBV_EVENT_LID_CHANGE: return "LID change";
    case IBV_EVENT_PKEY_CHANGE: return "P_Key change";
    case IBV_EVENT_SM_CHANGE: return "SM change";
    case IBV_EVENT_SRQ_ERR: return "SRQ catastrophic error";
    case IBV_EVENT_SRQ_LIMIT_REACHED: return "SRQ limit reached";
    case IBV_EVENT_QP_LAST_WQE_REACHED: return "last WQE reached";
    case IBV_EVENT_CLIENT_REREGISTER: return "client reregistration";
    case IBV_EVENT_GID_CHANGE: return "GID table change";
    default: return "unknown";
  }
}

// ---- devices and contexts -------------------------------------------------

ibv_device** getDeviceList(int* num) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  auto** list = static_cast<ibv_device**>(std::calloc(f.devices.size() + 1, sizeof(ibv_device*)));
  if (list == nullptr) return fail<ibv_device*>(ENOMEM);
  for (size_t i = 0; i < f.devices.size(); ++i) list[i] = &f.devices[i]->dev;
  if (num != nullptr) *num = static_cast<int>(f.devices.size());
  return list;
}

void freeDeviceList(ibv_device** list) {
  std::free(list);
}

const char* getDeviceName(ibv_device* device) {
  return device->name;
}

ibv_context* openDevice(ibv_device* device) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  int index = -1;
  for (auto& d : f.devices) {
    if (&d->dev == device) index = d->index;
  }
  if (index < 0) return fail<ibv_context>(ENODEV);
  int fd = eventfd(0, EFD_NONBLOCK | EFD_SEMAPHORE | EFD_CLOEXEC);
  if (fd < 0) return nullptr;
  auto* c = new Ctx;
  c->ctx.device = device;
  c->ctx.cmd_fd = -1;
  c->ctx.async_fd = fd;
  c->ctx.num_comp_vectors = 1;
  c->devIndex = index;
  c->opener = std::this_thread::get_id();
  f.ctxs.insert(c);
  return &c->ctx;
}

int closeDevice(ibv_context* context) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Ctx* c = ctxOf(context);
  if (c->children > 0) return EBUSY;
  ::close(c->ctx.async_fd);
  f.ctxs.erase(c);
  delete c;
  return 0;
}

const Device& deviceOf(Fabric& f, ibv_context* context) {
  return *f.devices[static_cast<size_t>(ctxOf(context)->devIndex)];
}

int queryDevice(ibv_context* context, ibv_device_attr* attr) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  const Device& d = deviceOf(f, context);
  std::memset(attr, 0, sizeof *attr);
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "soft");
  attr->node_guid = htobe64(0x0002c90300000000ull + static_cast<uint64_t>(d.index) + 1);
  attr->sys_image_guid = attr->node_guid;
  attr->max_mr_size = ~0ull;
  attr->page_size_cap = 0xfffff000u;
  attr->max_qp = 1 << 17;
  attr->max_qp_wr = 16384;
  attr->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
  attr->max_sge = 30;
  attr->max_sge_rd = 30;
  attr->max_cq = 1 << 16;
  attr->max_cqe = 65536;
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = 16;
  attr->max_qp_init_rd_atom = 16;
  attr->max_res_rd_atom = 16 << 17;
  attr->atomic_cap = IBV_ATOMIC_NONE;
  attr->max_pkeys = 1;
  attr->phys_port_cnt = 1;
  return 0;
}

int queryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  if (port != 1) return EINVAL;
  const Device& d = deviceOf(f, context);
  std::memset(attr, 0, sizeof *attr);
  attr->state = IBV_PORT_ACTIVE;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = IBV_MTU_4096;
  attr->gid_tbl_len = static_cast<int>(d.gids.size());
  attr->max_msg_sz = 1u << 31;
  attr->pkey_tbl_len = 1;
  attr->lid = d.lid;
  attr->active_width = 2;   // 4x
  attr->active_speed = 32;  // EDR
  attr->phys_state = 5;     // LinkUp
  attr->max_vl_num = 1;
  if (f.cfg.roce) {
    attr->link_layer = IBV_LINK_LAYER_ETHERNET;
    attr->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
  } else {
    attr->link_layer = IBV_LINK_LAYER_INFINIBAND;
    attr->port_cap_flags = IBV_PORT_CM_SUP;
    attr->sm_lid = 1;
  }
  return 0;
}

int queryGid(ibv_context* context, uint8_t port, int index, ibv_gid* gid) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  const Device& d = deviceOf(f, context);
  if (port != 1 || index < 0 || static_cast<size_t>(index) >= d.gids.size()) return EINVAL;
  *gid = d.gids[static_cast<size_t>(index)];
  return 0;
}

// ---- PDs and MRs ----------------------------------------------------------

ibv_pd* allocPd(ibv_context* context) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Ctx* c = ctxOf(context);
  if (c->dead) return fail<ibv_pd>(EIO);
  auto* p = new Pd;
  p->pd.context = context;
  p->pd.handle = ++f.nextKey;
  p->ctx = c;
  c->children++;
  f.pds.insert(p);
  return &p->pd;
}

int deallocPd(ibv_pd* pd) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Pd* p = pdOf(pd);
  if (p->mrs > 0 || p->qps > 0) return EBUSY;
  p->ctx->children--;
  f.pds.erase(p);
  delete p;
  return 0;
}

ibv_mr* regMr(ibv_pd* pd, void* addr, size_t length, int access) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Pd* p = pdOf(pd);
  if (p->ctx->dead) return fail<ibv_mr>(EIO);
  bool remote = (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0;
  if (remote && (access & IBV_ACCESS_LOCAL_WRITE) == 0) return fail<ibv_mr>(EINVAL);
  if (addr == nullptr && length > 0) return fail<ibv_mr>(EINVAL);
  if (reinterpret_cast<uintptr_t>(addr) + length < reinterpret_cast<uintptr_t>(addr)) {
    return fail<ibv_mr>(EINVAL);
  }
  // Keys: 24 scrambled bits and a low byte that differs between lkeys and
  // rkeys, so the two never coincide and confusing them is caught.
  uint32_t n = (++f.nextKey) & 0xffffffu;
  auto* m = new Mr;
  m->mr.context = p->pd.context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  m->mr.handle = n;
  m->mr.lkey = (((n * 0x2545f5u) & 0xffffffu) << 8) | 0x5au;
  m->mr.rkey = (((n * 0x9e3779u) & 0xffffffu) << 8) | 0xa5u;
  m->pd = p;
  m->access = access;
  p->mrs++;
  f.mrs.insert(m);
  f.byLkey[m->mr.lkey] = m;
  f.byRkey[m->mr.rkey] = m;
  f.counters.regMr++;
  return &m->mr;
}

int deregMr(ibv_mr* mr) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Mr* m = mrOf(mr);
  f.byLkey.erase(m->mr.lkey);
  f.byRkey.erase(m->mr.rkey);
  m->pd->mrs--;
  f.mrs.erase(m);
  delete m;
  f.counters.deregMr++;
  return 0;
}

// ---- completion channels and CQs ------------------------------------------

ibv_comp_channel* createCompChannel(ibv_context* context) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Ctx* c = ctxOf(context);
  if (c->dead) return fail<ibv_comp_channel>(EIO);
  int fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);  // blocking, like rdma-core's
  if (fd < 0) return nullptr;
  auto* ch = new Channel;
  ch->ch.context = context;
  ch->ch.fd = fd;
  ch->ctx = c;
  c->children++;
  f.channels.insert(ch);
  return &ch->ch;
}

int destroyCompChannel(ibv_comp_channel* channel) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Channel* ch = channelOf(channel);
  if (ch->cqs > 0) return EBUSY;
  ::close(ch->ch.fd);
  ch->ctx->children--;
  f.channels.erase(ch);
  delete ch;
  return 0;
}

ibv_cq* createCq(ibv_context* context, int cqe, void* cqContext, ibv_comp_channel* channel,
                 int compVector) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Ctx* c = ctxOf(context);
  if (c->dead) return fail<ibv_cq>(EIO);
  if (cqe < 1 || cqe > 65536 || compVector < 0 || compVector >= 1) return fail<ibv_cq>(EINVAL);
  if (channel != nullptr && channelOf(channel)->ctx != c) return fail<ibv_cq>(EINVAL);
  auto* q = new Cq;
  q->cq.context = context;
  q->cq.channel = channel;
  q->cq.cq_context = cqContext;
  q->cq.handle = ++f.nextKey;
  q->cq.cqe = cqe;
  q->ctx = c;
  q->channel = channel != nullptr ? channelOf(channel) : nullptr;
  q->capacity = static_cast<size_t>(cqe);
  if (q->channel != nullptr) q->channel->cqs++;
  c->children++;
  f.cqs.insert(q);
  return &q->cq;
}

// As rdma-core: the new size must hold the completions already queued.
int resizeCq(ibv_cq* cq, int cqe) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Cq* q = cqOf(cq);
  if (q->ctx->dead) return EIO;
  if (cqe < 1 || cqe > 65536 || static_cast<size_t>(cqe) < q->entries.size()) return EINVAL;
  q->capacity = static_cast<size_t>(cqe);
  q->cq.cqe = cqe;
  return 0;
}

int destroyCq(ibv_cq* cq) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Cq* q = cqOf(cq);
  if (q->qps > 0 || q->eventsDelivered != q->eventsAcked) return EBUSY;
  if (q->channel != nullptr) {
    for (Cq*& e : q->channel->events) {
      if (e == q) e = nullptr;  // the fd's count stays; getCqEvent skips it
    }
    q->channel->cqs--;
  }
  q->ctx->children--;
  f.cqs.erase(q);
  delete q;
  return 0;
}

int pollCq(ibv_cq* cq, int numEntries, ibv_wc* wc) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Cq* q = cqOf(cq);
  if (q->ctx->dead || q->error) {
    errno = EIO;
    return -1;
  }
  int n = 0;
  while (n < numEntries && !q->entries.empty()) {
    const CqEntry& e = q->entries.front();
    wc[n++] = e.wc;
    if (e.qp != nullptr) {
      if (e.isSend) {
        if (e.seq > e.qp->sendRetired) e.qp->sendRetired = e.seq;
      } else {
        e.qp->recvRetired++;
      }
    }
    q->entries.pop_front();
  }
  f.counters.cqesPolled += static_cast<uint64_t>(n);
  return n;
}

int reqNotifyCq(ibv_cq* cq, int solicitedOnly) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  Cq* q = cqOf(cq);
  if (q->ctx->dead) return EIO;
  q->armed = true;
  q->solicitedOnly = solicitedOnly != 0;
  return 0;
}

int getCqEvent(ibv_comp_channel* channel, ibv_cq** cq, void** cqContext) {
  Fabric& f = fabric();
  Channel* ch = channelOf(channel);
  for (;;) {
    uint64_t v = 0;
    // Blocks unless the caller made the fd non-blocking (then EAGAIN).
    if (::read(ch->ch.fd, &v, sizeof v) != static_cast<ssize_t>(sizeof v)) return -1;
    Lock lock(f.mu);
    if (ch->ctx->dead) {
      errno = EIO;
      return -1;
    }
    if (ch->events.empty()) continue;
    Cq* q = ch->events.front();
    ch->events.pop_front();
    if (q == nullptr) continue;
    q->eventsDelivered++;
    f.counters.cqEvents++;
    *cq = &q->cq;
    *cqContext = q->cq.cq_context;
    return 0;
  }
}

void ackCqEvents(ibv_cq* cq, unsigned int nevents) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  cqOf(cq)->eventsAcked += nevents;
  f.counters.cqEventsAcked += nevents;
}

// ---- async events ---------------------------------------------------------

int getAsyncEvent(ibv_context* context, ibv_async_event* event) {
  Fabric& f = fabric();
  Ctx* c = ctxOf(context);
  uint64_t v = 0;
  if (::read(c->ctx.async_fd, &v, sizeof v) != static_cast<ssize_t>(sizeof v)) return -1;
  Lock lock(f.mu);
  if (c->asyncEvents.empty()) {
    errno = EAGAIN;
    return -1;
  }
  *event = c->asyncEvents.front();
  c->asyncEvents.pop_front();
  f.counters.asyncEvents++;
  return 0;
}

void ackAsyncEvent(ibv_async_event*) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  f.counters.asyncEventsAcked++;
}

transport::verbs::VerbsApi makeTable() {
  transport::verbs::VerbsApi t;
  t.source = "soft_verbs (in-process software RDMA device, tests)";
  t.getDeviceList = getDeviceList;
  t.freeDeviceList = freeDeviceList;
  t.getDeviceName = getDeviceName;
  t.openDevice = openDevice;
  t.closeDevice = closeDevice;
  t.queryDevice = queryDevice;
  t.queryPort = queryPort;
  t.queryGid = queryGid;
  t.allocPd = allocPd;
  t.deallocPd = deallocPd;
  t.regMr = regMr;
  t.deregMr = deregMr;
  t.createCompChannel = createCompChannel;
  t.destroyCompChannel = destroyCompChannel;
  t.createCq = createCq;
  t.destroyCq = destroyCq;
  t.resizeCq = resizeCq;
  t.pollCq = pollCq;
  t.reqNotifyCq = reqNotifyCq;
  t.getCqEvent = getCqEvent;
  t.ackCqEvents = ackCqEvents;
  t.createQp = createQp;
  t.modifyQp = modifyQp;
  t.destroyQp = destroyQp;
  t.postSend = postSend;
  t.postRecv = postRecv;
  t.getAsyncEvent = getAsyncEvent;
  t.ackAsyncEvent = ackAsyncEvent;
  t.wcStatusStr = wcStatusStr;
  t.eventTypeStr = eventTypeStr;
  return t;
}

transport::verbs::VerbsApi& table() {
  static transport::verbs::VerbsApi* t = new transport::verbs::VerbsApi(makeTable());
  return *t;
}

size_t leakedCount = 0;

size_t liveLocked(Fabric& f) {
  return f.ctxs.size() + f.pds.size() + f.mrs.size() + f.cqs.size() + f.qps.size() +
         f.channels.size();
}

std::string describeLocked(Fabric& f) {
  std::ostringstream os;
  for (Ctx* c : f.ctxs) {
    os << "context on soft_" << c->devIndex << (c->dead ? " (killed)" : "") << " with "
       << c->children << " children\n";
  }
  for (Pd* p : f.pds) os << "pd " << p->pd.handle << " (" << p->mrs << " MRs)\n";
  for (Mr* m : f.mrs) os << "mr lkey " << m->mr.lkey << " length " << m->mr.length << "\n";
  for (Cq* q : f.cqs) os << "cq with " << q->entries.size() << " unpolled CQEs\n";
  for (auto& [n, q] : f.qps) os << "qp " << n << " state " << q->state << "\n";
  for (Channel* ch : f.channels) os << "comp channel fd " << ch->ch.fd << "\n";
  return os.str();
}

// Frees everything (uninstall). The device thread has stopped.
void freeAll(Fabric& f) {
  while (!f.qps.empty()) freeQp(f, f.qps.begin()->second);
  for (Mr* m : f.mrs) delete m;
  for (Cq* q : f.cqs) delete q;
  for (Channel* ch : f.channels) {
    ::close(ch->ch.fd);
    delete ch;
  }
  for (Pd* p : f.pds) delete p;
  for (Ctx* c : f.ctxs) {
    ::close(c->ctx.async_fd);
    delete c;
  }
  f.mrs.clear();
  f.byLkey.clear();
  f.byRkey.clear();
  f.cqs.clear();
  f.channels.clear();
  f.pds.clear();
  f.ctxs.clear();
  f.devices.clear();
}

ibv_gid gidOf(const Config& cfg, int device, int index) {
  ibv_gid g{};
  if (cfg.roce) {  // ::ffff:10.0.d.(i+1)
    g.raw[10] = 0xff;
    g.raw[11] = 0xff;
    g.raw[12] = 10;
    g.raw[13] = 0;
    g.raw[14] = static_cast<uint8_t>(device);
    g.raw[15] = static_cast<uint8_t>(index + 1);
  } else {  // fe80::i:(d+1)
    g.raw[0] = 0xfe;
    g.raw[1] = 0x80;
    g.raw[13] = static_cast<uint8_t>(index);
    g.raw[15] = static_cast<uint8_t>(device + 1);
  }
  return g;
}

}  // namespace
}  // namespace detail

using namespace detail;

void install(const Config& config) {
  Fabric& f = fabric();
  bool wasInstalled;
  {
    Lock lock(f.mu);
    wasInstalled = f.installed;
  }
  if (wasInstalled) uninstall();
  {
    Lock lock(f.mu);
    f.cfg = config;
    f.installed = true;
    f.stop = false;
    f.counters = Counters{};
    f.nextQpn = 0x1c0;
    f.nextKey = 0x35;
    f.injectRemoteAccessError = false;
    for (int i = 0; i < config.devices; ++i) {
      auto d = std::make_unique<Device>();
      d->index = i;
      d->lid = config.roce ? 0 : static_cast<uint16_t>(i + 1);
      d->dev.node_type = IBV_NODE_CA;
      d->dev.transport_type = IBV_TRANSPORT_IB;
      std::snprintf(d->dev.name, sizeof d->dev.name, "soft_%d", i);
      std::snprintf(d->dev.dev_name, sizeof d->dev.dev_name, "uverbs%d", i);
      std::snprintf(d->dev.dev_path, sizeof d->dev.dev_path, "/sys/class/infiniband_verbs/uverbs%d",
                    i);
      std::snprintf(d->dev.ibdev_path, sizeof d->dev.ibdev_path, "/sys/class/infiniband/soft_%d",
                    i);
      for (int g = 0; g < config.gidTableLen; ++g) d->gids.push_back(gidOf(config, i, g));
      f.devices.push_back(std::move(d));
    }
    if (config.deviceThread) f.thread = std::thread(deviceThreadMain);
  }
  transport::verbs::installApiForTesting(&table());
}

void uninstall() {
  Fabric& f = fabric();
  transport::verbs::installApiForTesting(nullptr);
  std::thread t;
  {
    Lock lock(f.mu);
    if (!f.installed) return;
    f.stop = true;
    f.cv.notify_all();
    t = std::move(f.thread);
  }
  if (t.joinable()) t.join();
  Lock lock(f.mu);
  leakedCount = liveLocked(f);
  if (leakedCount > 0) {
    std::fprintf(stderr, "soft_verbs: uninstall with %zu live objects (freed):\n%s", leakedCount,
                 describeLocked(f).c_str());
  }
  freeAll(f);
  f.installed = false;
}

Counters counters() {
  Fabric& f = fabric();
  Lock lock(f.mu);
  return f.counters;
}

void resetCounters() {
  Fabric& f = fabric();
  Lock lock(f.mu);
  f.counters = Counters{};
}

void killContextsOpenedBy(std::thread::id thread) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  for (Ctx* c : f.ctxs) {
    if (c->opener != thread || c->dead) continue;
    c->dead = true;
    killQps(f, c);
    for (Channel* ch : f.channels) {
      if (ch->ctx == c) eventfdAdd(ch->ch.fd, uint64_t{1} << 40);  // wake waiters, for good
    }
  }
  kick(f);
}

std::vector<ibv_context*> contextsOpenedBy(std::thread::id thread) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  std::vector<ibv_context*> out;
  for (Ctx* c : f.ctxs) {
    if (c->opener == thread && !c->dead) out.push_back(&c->ctx);
  }
  return out;
}

void injectAsyncEvent(ibv_context* ctx, ibv_event_type type, int port) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  ibv_async_event ev{};
  ev.element.port_num = port;
  ev.event_type = type;
  queueAsyncEvent(f, ctxOf(ctx), ev);
}

void injectRemoteAccessErrorOnNextWrite(std::thread::id from) {
  Fabric& f = fabric();
  Lock lock(f.mu);
  f.injectRemoteAccessError = true;
  f.injectFrom = from;
}

size_t liveObjects() {
  Fabric& f = fabric();
  Lock lock(f.mu);
  return liveLocked(f);
}

std::string describeLiveObjects() {
  Fabric& f = fabric();
  Lock lock(f.mu);
  return describeLocked(f);
}

size_t leakedAtLastUninstall() {
  Fabric& f = fabric();
  Lock lock(f.mu);
  return leakedCount;
}

}  // namespace gflow::testing::softverbs
