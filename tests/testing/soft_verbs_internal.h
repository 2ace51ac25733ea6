// Internals of the software RDMA device (soft_verbs.h), shared by
// soft_verbs.cc (devices, contexts, PDs, MRs, CQs, channels, events) and
// soft_verbs_qp.cc (QPs, posting, execution, the device thread).
//
// Every object embeds the rdma-core struct it hands out as its first member,
// so the pointer the caller passes back is downcast with reinterpret_cast.
// All state is guarded by Fabric::mu; no user code runs under it.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "testing/soft_verbs.h"

namespace gflow::testing::softverbs::detail {

using Clock = std::chrono::steady_clock;

struct Device {
  ibv_device dev{};
  int index = 0;
  uint16_t lid = 0;
  std::vector<ibv_gid> gids;
};

struct Ctx {
  ibv_context ctx{};
  int devIndex = 0;
  std::thread::id opener;
  bool dead = false;
  std::deque<ibv_async_event> asyncEvents;
  int children = 0;  // PDs, CQs, QPs and channels
};

struct Pd {
  ibv_pd pd{};
  Ctx* ctx = nullptr;
  int mrs = 0;
  int qps = 0;
};

struct Mr {
  ibv_mr mr{};
  struct Pd* pd = nullptr;
  int access = 0;
};

struct Cq;

struct Channel {
  ibv_comp_channel ch{};
  Ctx* ctx = nullptr;
  std::deque<Cq*> events;  // nullptr: event of a destroyed CQ (skipped)
  int cqs = 0;
};

struct Qp;

struct CqEntry {
  ibv_wc wc{};
  Qp* qp = nullptr;
  bool isSend = false;
  uint64_t seq = 0;  // send: the WR's sequence number (frees slots up to it)
  bool solicited = false;
};

struct Cq {
  ibv_cq cq{};
  Ctx* ctx = nullptr;
  Channel* channel = nullptr;
  size_t capacity = 0;
  std::deque<CqEntry> entries;
  bool armed = false;
  bool solicitedOnly = false;
  bool error = false;  // overflowed
  int qps = 0;
  uint64_t eventsDelivered = 0;
  uint64_t eventsAcked = 0;
};

struct SendWr {
  uint64_t wrId = 0;
  uint64_t seq = 0;
  ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
  bool signaled = false;
  bool solicited = false;
  uint32_t imm = 0;  // network order, passed through
  uint64_t remoteAddr = 0;
  uint32_t rkey = 0;
  std::vector<ibv_sge> sg;
  bool isInline = false;
  std::vector<char> inlineData;
  bool retrying = false;  // first attempt failed at `firstTry`
  Clock::time_point firstTry;
};

struct RecvWr {
  uint64_t wrId = 0;
  std::vector<ibv_sge> sg;
};

struct Qp {
  ibv_qp qp{};
  Ctx* ctx = nullptr;
  Pd* pd = nullptr;
  Cq* scq = nullptr;
  Cq* rcq = nullptr;
  ibv_qp_cap cap{};
  bool sigAll = false;
  ibv_qp_state state = IBV_QPS_RESET;  // the device's view (qp.state: last modify)
  int accessFlags = 0;
  uint32_t destQpn = 0;
  int destDevice = -1;  // resolved from the address vector; -1: nobody there
  uint8_t timeout = 0;
  uint8_t retryCnt = 0;
  uint8_t rnrRetry = 0;
  uint8_t minRnrTimer = 0;
  std::deque<SendWr> sq;  // posted, not yet executed
  std::deque<RecvWr> rq;  // posted, not yet consumed
  uint64_t sendPosted = 0, sendRetired = 0;
  uint64_t recvPosted = 0, recvRetired = 0;
};

struct Fabric {
  std::mutex mu;
  std::condition_variable cv;  // wakes the device thread
  Config cfg;
  bool installed = false;
  bool stop = false;
  std::thread thread;
  std::vector<std::unique_ptr<Device>> devices;
  std::set<Ctx*> ctxs;
  std::set<Pd*> pds;
  std::set<Mr*> mrs;
  std::unordered_map<uint32_t, Mr*> byLkey, byRkey;
  std::set<Cq*> cqs;
  std::set<Channel*> channels;
  std::map<uint32_t, Qp*> qps;  // by qp_num
  Counters counters;
  uint32_t nextQpn = 0;
  uint32_t nextKey = 0;
  bool injectRemoteAccessError = false;
  std::thread::id injectFrom;  // only writes from contexts it opened; {}: any
};

Fabric& fabric();

// Helpers (Fabric::mu held).
void pushCqe(Fabric& f, Cq* cq, const CqEntry& e);
void queueAsyncEvent(Fabric& f, Ctx* ctx, const ibv_async_event& ev);
void eventfdAdd(int fd, uint64_t n);
// Runs posted work: from the device thread, or inline when there is none.
void kick(Fabric& f);
void deviceThreadMain();
// Drops the state of a context's QPs when it is killed.
void killQps(Fabric& f, Ctx* ctx);
void freeQp(Fabric& f, Qp* q);

// The QP half of the table (soft_verbs_qp.cc).
ibv_qp* createQp(ibv_pd* pd, ibv_qp_init_attr* attr);
int modifyQp(ibv_qp* qp, ibv_qp_attr* attr, int attrMask);
int destroyQp(ibv_qp* qp);
int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** badWr);
int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** badWr);

inline Ctx* ctxOf(ibv_context* c) {
  return reinterpret_cast<Ctx*>(c);
}
inline Pd* pdOf(ibv_pd* p) {
  return reinterpret_cast<Pd*>(p);
}
inline Mr* mrOf(ibv_mr* m) {
  return reinterpret_cast<Mr*>(m);
}
inline Cq* cqOf(ibv_cq* c) {
  return reinterpret_cast<Cq*>(c);
}
inline Channel* channelOf(ibv_comp_channel* c) {
  return reinterpret_cast<Channel*>(c);
}
inline Qp* qpOf(ibv_qp* q) {
  return reinterpret_cast<Qp*>(q);
}

}  // namespace gflow::testing::softverbs::detail
