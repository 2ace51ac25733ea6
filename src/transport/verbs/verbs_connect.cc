// Verbs context setup: device, registered rings, RC queue pairs per peer
// connected through the bootstrap store, teardown.
#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>

#include "common/check.h"
#include "common/logging.h"
#include "common/params.h"
#include "transport/connect_mode.h"
#include "transport/contract.h"
#include "transport/verbs/verbs_context.h"

namespace gflow::transport::verbs {
namespace {

constexpr uint32_t kInfoMagic = 0x67664942;  // "gfIB"
// 2: error reports name the culprit; 3: arrival stamps; 4: an op's envelope
// carries its route (path and algorithm); 5: connections on demand (READY)
constexpr uint32_t kInfoVersion = 5;
constexpr int kMaxQps = 16;
constexpr size_t kCreditBytes = 64;  // one cache line per credit word
// On demand: what the higher rank of a pair publishes, followed by the
// error code (one digit, gflow::ErrorCode) and why, when it will not
// connect to the lower rank's end.
constexpr const char* kRefusal = "gflow-verbs-refused\n";
// The most of a refusal's reason a rank writes or reads.
constexpr size_t kMaxRefusalText = 1024;
// On demand: the completion queue holds this many peers at first.
constexpr int kCqPeersAtStart = 8;

// What one rank tells one peer about its end of their connection.
struct ConnInfo {
  uint32_t magic;
  uint32_t version;
  uint32_t qps;
  uint32_t slots;
  uint64_t slotBytes;
  uint16_t lid;
  uint8_t linkLayer;
  uint8_t mtu;
  uint32_t eagerBytes;
  uint8_t gid[16];
  uint64_t ringAddr;  // inbound ring for this peer, then its credit word
  uint32_t ringKey;
  uint32_t reserved2;
  uint32_t qpn[kMaxQps];
  uint32_t psn[kMaxQps];
};

ibv_mtu mtuFromBytes(int64_t bytes, int rank) {
  switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
    default:
      GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("init").withRank(rank))
          << "GFLOW_IB_MTU=" << bytes << " must be 0 (the port's active MTU), 256, 512, 1024, "
          << "2048 or 4096";
  }
}

char* allocBlock(size_t bytes) {
  const size_t ps = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = nullptr;
  if (posix_memalign(&p, ps, (bytes + ps - 1) / ps * ps) != 0) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return static_cast<char*>(p);
}

QpSettings readQpSettings(const Device& dev, const VerbsOptions& o, int rank) {
  ibv_mtu mtu = dev.portAttr().active_mtu;
  if (int64_t want = (o.mtu ? *o.mtu : params::ibMtu()); want != 0) {
    mtu = std::min(mtu, mtuFromBytes(want, rank));
  }
  const int64_t ibTimeout = (o.timeout ? *o.timeout : params::ibTimeout());
  const int64_t retry = (o.retryCount ? *o.retryCount : params::ibRetryCnt());
  if (ibTimeout < 1 || ibTimeout > 31 || retry < 0 || retry > 7) {
    GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("init").withRank(rank))
        << "GFLOW_IB_TIMEOUT=" << ibTimeout << " must be 1-31 (4.096 us x 2^value) and "
        << "GFLOW_IB_RETRY_CNT=" << retry << " must be 0-7";
  }
  return {mtu, static_cast<uint8_t>(ibTimeout), static_cast<uint8_t>(retry)};
}

// This rank's inbound eager ring for one peer: where it lies, its key, and
// its layout.
struct EagerRing {
  const char* base;
  uint32_t key;
  int slots;
  size_t slotBytes;
  size_t eagerMax;
};

// This rank's end of the connection to one peer: its inbound ring and its
// queue pairs, each with a random PSN.
ConnInfo describeEnd(const Device& dev, ibv_mtu mtu, const std::vector<ibv_qp*>& qps,
                     const EagerRing& ring, std::mt19937& rng) {
  ConnInfo ci;
  std::memset(&ci, 0, sizeof(ci));
  ci.magic = kInfoMagic;
  ci.version = kInfoVersion;
  ci.qps = static_cast<uint32_t>(qps.size());
  ci.slots = static_cast<uint32_t>(ring.slots);
  ci.slotBytes = ring.slotBytes;
  ci.eagerBytes = static_cast<uint32_t>(ring.eagerMax);
  ci.lid = dev.portAttr().lid;
  ci.linkLayer = dev.portAttr().link_layer;
  ci.mtu = static_cast<uint8_t>(mtu);
  std::memcpy(ci.gid, dev.gid().raw, 16);
  ci.ringAddr = reinterpret_cast<uintptr_t>(ring.base);
  ci.ringKey = ring.key;
  for (size_t q = 0; q < qps.size(); ++q) {
    ci.qpn[q] = qps[q]->qp_num;
    ci.psn[q] = rng() & 0xffffff;
  }
  return ci;
}

// The peer's end, as it published it; kInvalidArgument when it cannot
// connect to `mine` (another gflow version, configuration or link layer).
ConnInfo readPeerEnd(const std::vector<uint8_t>& blob, const ConnInfo& mine, const Device& dev,
                     int peer, const ErrorContext& pctx) {
  ConnInfo ti{};
  const size_t refused = std::strlen(kRefusal);
  if (blob.size() > refused && std::memcmp(blob.data(), kRefusal, refused) == 0) {
    const int digit = blob[refused] - '0';
    const ErrorCode code = digit >= 0 && digit <= static_cast<int>(ErrorCode::kInternal)
                               ? static_cast<ErrorCode>(digit)
                               : ErrorCode::kInternal;
    const auto from = blob.begin() + static_cast<std::ptrdiff_t>(refused + 1);
    const auto to = blob.begin() + static_cast<std::ptrdiff_t>(
                                       std::min(blob.size(), refused + 1 + kMaxRefusalText));
    throw Error(
        code, "rank " + std::to_string(peer) + " refused the connection: " + std::string(from, to),
        pctx);
  }
  if (blob.size() != sizeof(ti)) {
    GFLOW_THROW(kInvalidArgument, pctx)
        << "rank " << peer << " published a verbs address of " << blob.size() << " bytes (expected "
        << sizeof(ti) << "): different gflow versions?";
  }
  std::memcpy(&ti, blob.data(), sizeof(ti));
  if (ti.magic != kInfoMagic || ti.version != kInfoVersion) {
    GFLOW_THROW(kInvalidArgument, pctx)
        << "rank " << peer << " speaks verbs protocol version " << ti.version << ", this rank "
        << kInfoVersion << ": every rank must run the same gflow";
  }
  if (ti.qps != mine.qps || ti.slots != mine.slots || ti.slotBytes != mine.slotBytes ||
      ti.eagerBytes != mine.eagerBytes) {
    GFLOW_THROW(kInvalidArgument, pctx)
        << "rank " << peer << " and this rank configure the verbs transport differently "
        << "(GFLOW_IB_QPS_PER_PEER " << ti.qps << " vs " << mine.qps << ", GFLOW_IB_EAGER_SLOTS "
        << ti.slots << " vs " << mine.slots << ", GFLOW_IB_EAGER_BYTES " << ti.eagerBytes << " vs "
        << mine.eagerBytes << ")";
  }
  if (ti.linkLayer != dev.portAttr().link_layer) {
    GFLOW_THROW(kInvalidArgument, pctx)
        << "rank " << peer << " uses an "
        << (ti.linkLayer == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" : "InfiniBand")
        << " port, this rank " << dev.describe() << ": they cannot connect";
  }
  return ti;
}

// Queue pair q of a connection: the peer's end of it (its QP number and PSN
// in `ti`) and the PSN this side sends from.
struct QpLink {
  const ConnInfo& ti;
  int q;
  uint32_t sqPsn;
};

// Moves queue pair `qp` of the connection to `peer` through RTR (towards
// the peer's end of `link`) to RTS.
void connectQp(const Device& dev, ibv_qp* qp, const QpLink& link, const QpSettings& s, int peer,
               const ErrorContext& pctx) {
  const ConnInfo& ti = link.ti;
  const int q = link.q;
  const VerbsApi& api = dev.api();
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min<int>(s.mtu, ti.mtu));
  a.dest_qp_num = ti.qpn[q];
  a.rq_psn = ti.psn[q];
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;  // 0.64 ms
  a.ah_attr.port_num = static_cast<uint8_t>(dev.port());
  if (dev.roce()) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, ti.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(dev.gidIndex());
    a.ah_attr.grh.hop_limit = 64;
  } else {
    a.ah_attr.dlid = ti.lid;
  }
  if (int rc = api.modifyQp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    GFLOW_THROW(kInternal, pctx)
        << "connecting to rank " << peer << " (ibv_modify_qp to RTR, remote "
        << (dev.roce() ? "GID " + formatGid(a.ah_attr.grh.dgid) : "LID " + std::to_string(ti.lid))
        << ") failed: " << std::strerror(rc)
        << (dev.roce() ? " (is the peer's address reachable from this port?)" : "");
  }
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTS;
  r.timeout = s.timeout;
  r.retry_cnt = s.retry;
  r.rnr_retry = 7;  // infinite: a busy receiver is not an error
  r.sq_psn = link.sqPsn;
  r.max_rd_atomic = 1;
  if (int rc = api.modifyQp(qp, &r,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
    GFLOW_THROW(kInternal, pctx) << "connecting to rank " << peer
                                 << " (ibv_modify_qp to RTS) failed: " << std::strerror(rc);
  }
}

}  // namespace

VerbsContext::VerbsContext(const ContextOptions& options) : Engine(options) {
  stripeMin_ = std::max<uint64_t>(
      (options.tcp.stripeMinBytes ? *options.tcp.stripeMinBytes : params::stripeMin()), 4096);
  waitPolicy_ = WaitPolicy::choose(options);
  const ErrorContext ictx = ErrorContext::forOp("init").withRank(rank());
  const VerbsOptions& vo = options.verbs;
  qpsPerPeer_ = (vo.qpsPerPeer ? *vo.qpsPerPeer : static_cast<int>(params::ibQpsPerPeer()));
  if (qpsPerPeer_ < 1 || qpsPerPeer_ > kMaxQps) {
    GFLOW_THROW(kInvalidArgument, ictx)
        << "GFLOW_IB_QPS_PER_PEER=" << qpsPerPeer_ << " must be between 1 and " << kMaxQps;
  }
  slots_ = (vo.eagerSlots ? *vo.eagerSlots : static_cast<int>(params::ibEagerSlots()));
  if (slots_ < 2 || slots_ > 4096) {
    GFLOW_THROW(kInvalidArgument, ictx)
        << "GFLOW_IB_EAGER_SLOTS=" << slots_ << " must be between 2 and 4096";
  }
  const uint64_t eager = (vo.eagerBytes ? *vo.eagerBytes : params::ibEagerBytes());
  if (eager < 256 || eager > (1u << 20)) {
    GFLOW_THROW(kInvalidArgument, ictx)
        << "GFLOW_IB_EAGER_BYTES=" << eager << " must be between 256 and 1M";
  }
  eagerMax_ = static_cast<size_t>(eager);
  slotBytes_ = (sizeof(SlotHeader) + eagerMax_ + 63) / 64 * 64;
  ringBytes_ = static_cast<size_t>(slots_) * slotBytes_;
  // Send queue: a full eager ring, credit returns, probes and rendezvous
  // writes; more wait in software (PendingWr). Receive queue: one WR per
  // write-with-immediate that may be in flight.
  sendDepth_ = slots_ + 64;
  recvDepth_ = slots_ + 128;
  int ev = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  GFLOW_SYSCHECK(ev, "eventfd");
  wakeFd_ = ev;
  peers_.resize(size());
  for (auto& p : peers_) p = std::make_unique<Peer>();
  try {
    connectAll(options);
  } catch (...) {
    destroyAll();
    throw;
  }
}

VerbsContext::~VerbsContext() {
  destroyAll();
}

void VerbsContext::destroyAll() {
  fetcher_.reset();  // its threads wake this context: before the eventfd goes
  if (!device_) {
    if (wakeFd_ >= 0) ::close(wakeFd_);
    wakeFd_ = -1;
    return;
  }
  const VerbsApi& api = device_->api();
  // Eager sends complete once copied: let the writes still in flight land
  // (bounded) before the queue pairs go, as TCP delivers what a closed
  // socket had buffered. This holds after an abort too (a communicator
  // aborts its transport when it is destroyed): only what was posted goes
  // out, nothing still queued for a failed op.
  if (failed()) {
    for (auto& pp : peers_) pp->eagerQueue.clear();
  }
  if (!qpsErrored_) {
    const Deadline d =
        Deadline::after(std::min<std::chrono::milliseconds>(timeout(), std::chrono::seconds(10)));
    try {
      while (!drained() && !d.expired()) {
        if (progress() == 0) sleepForEvents(std::min(d.remainingMs(), 10), false);
      }
    } catch (const Error&) {
      // Failed while draining: nothing more to deliver.
    }
  }
  // Queue pairs first: nothing may write into the rings once they are freed.
  for (auto& pp : peers_) {
    if (!pp) continue;
    Peer& p = *pp;
    for (ibv_qp* qp : p.qps) {
      if (qp) api.destroyQp(qp);
    }
    p.qps.clear();
  }
  clearMessages();
  sendOps_.clear();
  for (auto& pp : peers_) {
    if (!pp) continue;
    Peer& p = *pp;
    if (p.inMr) unpinMr(api, p.inMr, ringBytes_ + kCreditBytes);
    if (p.outMr) unpinMr(api, p.outMr, ringBytes_);
    std::free(p.inBlock);
    std::free(p.outBlock);
    p.inMr = p.outMr = nullptr;
    p.inBlock = p.outBlock = nullptr;
  }
  // Per-op registrations go now; explicit ones live as long as their
  // handles (which keep the cache and the device).
  if (cache_) cache_->endOp();
  cache_.reset();
  device_.reset();
  if (wakeFd_ >= 0) ::close(wakeFd_);
  wakeFd_ = -1;
}

void VerbsContext::createQueuePairs(Peer& p, int peer) {
  const VerbsApi& api = device_->api();
  const ErrorContext ictx = ErrorContext::forOp("init").withRank(rank()).withPeer(peer);
  for (int q = 0; q < qpsPerPeer_; ++q) {
    ibv_qp_init_attr ia{};
    ia.send_cq = device_->cq();
    ia.recv_cq = device_->cq();
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = static_cast<uint32_t>(sendDepth_);
    ia.cap.max_recv_wr = static_cast<uint32_t>(recvDepth_);
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ia.cap.max_inline_data = 64;
    ibv_qp* qp = api.createQp(device_->pd(), &ia);
    if (!qp) {
      GFLOW_THROW(kInternal, ictx)
          << "ibv_create_qp on " << device_->name() << " failed: " << std::strerror(errno)
          << " (too many ranks x GFLOW_IB_QPS_PER_PEER for the device?)";
    }
    p.qps.push_back(qp);
    qpIndex_[qp->qp_num] = {peer, q};
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = static_cast<uint8_t>(device_->port());
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (int rc = api.modifyQp(
            qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
      GFLOW_THROW(kInternal, ictx) << "ibv_modify_qp(INIT) failed: " << std::strerror(rc);
    }
    postReceives(peer, q, recvDepth_);
  }
  p.outstanding.assign(qpsPerPeer_, 0);
  p.waiting.resize(qpsPerPeer_);
}

void VerbsContext::postReceives(int peer, int q, int n) {
  Peer& p = *peers_[peer];
  for (int i = 0; i < n; ++i) {
    ibv_recv_wr wr{};
    // Writes with immediate carry no receive buffer: the data lands where
    // the sender wrote it.
    wr.wr_id = makeWrId(kWrRecv, peer, static_cast<uint32_t>(q));
    wr.num_sge = 0;
    ibv_recv_wr* bad = nullptr;
    if (int rc = device_->api().postRecv(p.qps[q], &wr, &bad)) {
      fail(Error(ErrorCode::kInternal, std::string("ibv_post_recv failed: ") + std::strerror(rc),
                 ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer)));
    }
  }
}

int VerbsContext::cqEntriesFor(int peers) const {
  return std::max(1, peers) * qpsPerPeer_ * (sendDepth_ + recvDepth_) + 64;
}

std::string VerbsContext::recordKey(int from, int to) const {
  return prefix_ + "verbs/" + std::to_string(from) + "/" + std::to_string(to);
}

void VerbsContext::connectAll(const ContextOptions& o) {
  lazy_ = connectsOnDemand(o);
  Device::Settings ds;
  ds.rank = rank();
  // On demand the queue grows as peers are opened (Device::reserveCq).
  ds.cqEntries = cqEntriesFor(lazy_ ? std::min(size() - 1, kCqPeersAtStart) : size() - 1);
  ds.hca = !o.verbs.hca.empty() ? o.verbs.hca : params::ibHca();
  ds.gidIndex = o.verbs.gidIndex ? std::optional<int64_t>(*o.verbs.gidIndex) : params::ibGidIndex();
  device_ = std::make_shared<Device>(ds);
  cache_ = std::make_shared<RegCache>(
      device_, (o.verbs.regCacheBytes ? *o.verbs.regCacheBytes : params::ibRegCache()), rank());
  qpSettings_ = readQpSettings(*device_, o.verbs, rank());
  rng_.seed(std::random_device{}());
  store_ = o.store;
  prefix_ = o.prefix;
  if (lazy_) {
    fetcher_ = std::make_unique<RecordFetcher>(store_, [this] { wake(); });
    fetcher_->follow(askKey(rank()));
    GFLOW_LOG(DEBUG) << "rank " << rank() << ": verbs connects its peers on demand";
    return;
  }
  connectMesh(o);
}

void VerbsContext::openPeer(int peer) {
  Peer& p = *peers_[peer];
  const VerbsApi& api = device_->api();
  p.inBlock = allocBlock(ringBytes_ + kCreditBytes);
  p.inRing = p.inBlock;
  p.inMr = pinMr(api, device_->pd(), p.inBlock, ringBytes_ + kCreditBytes,
                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  p.outBlock = allocBlock(ringBytes_);
  p.outRing = p.outBlock;
  p.outMr =
      p.inMr ? pinMr(api, device_->pd(), p.outBlock, ringBytes_, IBV_ACCESS_LOCAL_WRITE) : nullptr;
  if (!p.inMr || !p.outMr) {
    GFLOW_THROW(kInternal, ErrorContext::forOp("init").withRank(rank()).withPeer(peer))
        << "ibv_reg_mr of the eager rings (" << ringBytes_
        << " bytes per peer) failed: " << std::strerror(errno)
        << " (is the locked-memory limit high enough? ulimit -l)";
  }
  p.outBusy.assign(slots_, false);
  createQueuePairs(p, peer);
  const ConnInfo ci =
      describeEnd(*device_, qpSettings_.mtu, p.qps,
                  EagerRing{p.inBlock, p.inMr->rkey, slots_, slotBytes_, eagerMax_}, rng_);
  p.sqPsn.assign(ci.psn, ci.psn + qpsPerPeer_);
  p.myEnd.resize(sizeof(ConnInfo));
  std::memcpy(p.myEnd.data(), &ci, sizeof(ci));
  p.opened = true;
}

void VerbsContext::connectPeerEnd(int peer, const std::vector<uint8_t>& record,
                                  const ErrorContext& ectx) {
  Peer& p = *peers_[peer];
  ConnInfo mine;
  std::memcpy(&mine, p.myEnd.data(), sizeof(mine));
  const ConnInfo ti = readPeerEnd(record, mine, *device_, peer, ectx);
  p.remoteRing = ti.ringAddr;
  p.remoteRingKey = ti.ringKey;
  p.remoteCredit = ti.ringAddr + ringBytes_;
  p.remoteCreditKey = ti.ringKey;
  for (int q = 0; q < qpsPerPeer_; ++q) {
    connectQp(*device_, p.qps[q], QpLink{ti, q, p.sqPsn[q]}, qpSettings_, peer, ectx);
  }
  countConnection(peer, qpsPerPeer_);
}

void VerbsContext::connectMesh(const ContextOptions& o) {
  // One record per pair ("verbs/ME/PEER"), all set in one request and the
  // peers' read in one (O(N) store requests for the job, not O(N^2)).
  std::vector<std::string> outKeys, inKeys;
  std::vector<std::vector<uint8_t>> blobs;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    openPeer(peer);
    blobs.push_back(peers_[peer]->myEnd);
    outKeys.push_back(recordKey(rank(), peer));
    inKeys.push_back(recordKey(peer, rank()));
  }
  o.store->multiSet(outKeys, blobs);
  const std::vector<std::vector<uint8_t>> theirs =
      inKeys.empty() ? std::vector<std::vector<uint8_t>>{} : o.store->multiGet(inKeys, o.timeout);
  for (int peer = 0, i = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    connectPeerEnd(peer, theirs[static_cast<size_t>(i++)],
                   ErrorContext::forOp("init").withRank(rank()).withPeer(peer));
    peers_[peer]->writable = true;
  }
  // Every queue pair must be ready to receive before anyone writes.
  o.store->set(o.prefix + "verbs/ready/" + std::to_string(rank()), {1});
  std::vector<std::string> keys;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank()) keys.push_back(o.prefix + "verbs/ready/" + std::to_string(peer));
  }
  if (!keys.empty()) o.store->wait(keys, o.timeout);
  GFLOW_LOG(DEBUG) << "rank " << rank() << ": verbs connected to " << size() - 1 << " peers, "
                   << qpsPerPeer_ << " QPs each, eager " << eagerMax_ << " bytes x " << slots_
                   << " slots";
}

// ---- connections on demand ---------------------------------------------------

std::string VerbsContext::askKey(int target) const {
  return prefix_ + "verbs/ask/" + std::to_string(target) + "/";
}

void VerbsContext::needPeer(int peer, bool ask) {
  Peer& p = *peers_[peer];
  if (!lazy_ || p.opened) return;
  const ErrorContext ectx = ErrorContext().withSeq(group()).withRank(rank()).withPeer(peer);
  try {
    device_->reserveCq(cqEntriesFor(peersOpened_ + 1),
                       std::to_string(peersOpened_ + 1) + " connected peers");
    openPeer(peer);
    ++peersOpened_;
    // The lower rank's end is published at once; the higher rank's once
    // its queue pairs are connected to it (adoptRecord).
    if (rank() < peer) store_->set(recordKey(rank(), peer), p.myEnd);
    fetcher_->fetch(peer, recordKey(peer, rank()));
    if (ask) {  // the peer's watcher opens this rank too, in its own progress
      const int64_t k = store_->add(prefix_ + "verbs/asks/" + std::to_string(peer), 1);
      const std::string me = std::to_string(rank());
      store_->set(askKey(peer) + std::to_string(k), std::vector<uint8_t>(me.begin(), me.end()));
    }
  } catch (const Error& e) {
    fail(Error(e.code(), "connecting to rank " + std::to_string(peer) + ": " + e.detail(), ectx));
  } catch (const std::exception& e) {  // allocation, thread creation
    fail(Error(ErrorCode::kInternal, "connecting to rank " + std::to_string(peer) + ": " + e.what(),
               ectx));
  }
}

void VerbsContext::adoptRecords() {
  std::vector<RecordFetcher::Record> records = fetcher_->take();
  if (failed() || qpsErrored_) return;  // nothing more connects
  for (RecordFetcher::Record& r : records) {
    if (r.peer < 0) {
      adoptRequest(r);
    } else {
      adoptRecord(r);
    }
  }
}

void VerbsContext::adoptRequest(const RecordFetcher::Record& r) {
  if (r.error) {
    GFLOW_LOG(WARN) << "rank " << rank()
                    << ": peers' requests to connect no longer arrive: " << r.error->detail();
    return;
  }
  const std::string text(r.value.begin(), r.value.end());
  char* end = nullptr;
  const long peer = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || peer < 0 || peer >= size() || peer == rank()) {
    GFLOW_LOG(WARN) << "rank " << rank() << ": ignored a request to connect from '" << text
                    << "' (not a rank of this communicator)";
    return;
  }
  needPeer(static_cast<int>(peer), /*ask=*/false);
}

void VerbsContext::adoptRecord(RecordFetcher::Record& r) {
  Peer& p = *peers_[r.peer];
  const ErrorContext ectx = ErrorContext().withSeq(group()).withRank(rank()).withPeer(r.peer);
  if (r.error) {
    // The store is gone: raised when something waits on the peer.
    if (!p.lost) {
      p.lost.emplace(r.error->code(),
                     "cannot connect to rank " + std::to_string(r.peer) +
                         ": its record did not come from the store: " + r.error->detail(),
                     ectx);
    }
    return;
  }
  try {
    connectPeerEnd(r.peer, r.value, ectx);
    if (rank() > r.peer) {
      store_->set(recordKey(rank(), r.peer), p.myEnd);
      p.published = true;
    }
  } catch (const Error& e) {
    refuse(r.peer, e);
    fail(Error(e.code(), e.detail(), ectx));
  }
  if (rank() < r.peer) {
    sendReady(r.peer);
    p.writable = true;
    pumpEager(r.peer);
  }
}

void VerbsContext::refuse(int peer, const Error& why) {
  Peer& p = *peers_[peer];
  // Only the higher rank publishes after the lower rank's record: its
  // record's key is where the lower rank waits.
  if (rank() < peer || p.published) return;
  p.published = true;
  const std::string text = kRefusal + std::to_string(static_cast<int>(why.code())) +
                           why.detail().substr(0, kMaxRefusalText);
  try {
    store_->set(recordKey(rank(), peer), std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const Error&) {
    // The store is gone too: the peer's op times out.
  }
}

void VerbsContext::refuseWaitingPeers(const Error& error) {
  if (!lazy_) return;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank() && peers_[peer]->opened && !peers_[peer]->writable) {
      refuse(peer, Error(error.code(), "it failed: " + error.detail()));
    }
  }
}

void VerbsContext::sendReady(int peer) {
  Peer& p = *peers_[peer];
  PendingWr w;
  w.wr.wr_id = makeWrId(kWrReady, peer, 0);
  // Zero bytes: the immediate alone tells the peer this end receives.
  w.wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  w.wr.imm_data = htonl(makeImm(kImmReady, 0));
  w.wr.send_flags = IBV_SEND_SIGNALED;
  w.wr.wr.rdma.remote_addr = p.remoteCredit;
  w.wr.wr.rdma.rkey = p.remoteCreditKey;
  w.hasSge = false;
  postWr(peer, 0, std::move(w));
}

}  // namespace gflow::transport::verbs
