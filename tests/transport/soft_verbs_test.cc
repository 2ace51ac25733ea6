// The software RDMA device (tests/testing/soft_verbs.h), driven only through
// the VerbsApi table that gflow::transport::verbs::api() returns once it is
// installed: queries, MR rules, the QP state machine, RDMA writes (with and
// without immediate), RNR, remote/local protection errors, dead peers,
// completion channels, async events, CQ overflow, queue capacity, counters
// and concurrent posting.
#include "testing/soft_verbs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "transport/verbs/verbs_api.h"

namespace gflow::testing::softverbs {
namespace {

using transport::verbs::api;
using transport::verbs::VerbsApi;
using Clock = std::chrono::steady_clock;

constexpr int kInitMask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kRtsMask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                         IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;

ibv_device* device(int index) {
  int n = 0;
  ibv_device** list = api().getDeviceList(&n);
  ibv_device* d = index < n ? list[index] : nullptr;
  api().freeDeviceList(list);
  return d;
}

// One endpoint: a context with a PD, a CQ (optionally on a channel), a
// registered buffer and an RC QP.
struct Node {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  std::vector<char> buf;
  ibv_mr* mr = nullptr;

  explicit Node(int dev, size_t bytes = 4096, bool withChannel = false, int cqe = 256,
                uint32_t maxSendWr = 128, ibv_context* opened = nullptr)
      : buf(bytes) {
    const VerbsApi& v = api();
    ctx = opened != nullptr ? opened : v.openDevice(device(dev));
    pd = v.allocPd(ctx);
    if (withChannel) channel = v.createCompChannel(ctx);
    cq = v.createCq(ctx, cqe, this, channel, 0);
    mr = v.regMr(pd, buf.data(), buf.size(),
                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    ibv_qp_init_attr a{};
    a.qp_context = this;
    a.send_cq = cq;
    a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = maxSendWr;
    a.cap.max_recv_wr = 256;
    a.cap.max_send_sge = 4;
    a.cap.max_recv_sge = 4;
    a.cap.max_inline_data = 64;
    qp = v.createQp(pd, &a);
  }
  ~Node() {
    const VerbsApi& v = api();
    EXPECT_EQ(v.destroyQp(qp), 0);
    EXPECT_EQ(v.deregMr(mr), 0);
    EXPECT_EQ(v.destroyCq(cq), 0);
    if (channel != nullptr) {
      EXPECT_EQ(v.destroyCompChannel(channel), 0);
    }
    EXPECT_EQ(v.deallocPd(pd), 0);
    EXPECT_EQ(v.closeDevice(ctx), 0);
  }
  uint64_t addr(size_t off = 0) { return reinterpret_cast<uint64_t>(buf.data() + off); }
};

int toInit(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  return api().modifyQp(qp, &a, kInitMask);
}

ibv_qp_attr rtrAttr(const Node& to, bool roce) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = to.qp->qp_num;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = 1;
  if (roce) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.hop_limit = 1;
    EXPECT_EQ(api().queryGid(to.ctx, 1, 0, &a.ah_attr.grh.dgid), 0);
  } else {
    ibv_port_attr p{};
    EXPECT_EQ(api().queryPort(to.ctx, 1, &p), 0);
    a.ah_attr.dlid = p.lid;
  }
  return a;
}

int toRts(ibv_qp* qp, uint8_t rnrRetry) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = rnrRetry;
  a.max_rd_atomic = 1;
  return api().modifyQp(qp, &a, kRtsMask);
}

void connect(Node& a, Node& b, bool roce, uint8_t rnrRetry = 7) {
  Node* pairs[2][2] = {{&a, &b}, {&b, &a}};
  for (auto& p : pairs) {
    ASSERT_EQ(toInit(p[0]->qp), 0);
    ibv_qp_attr r = rtrAttr(*p[1], roce);
    ASSERT_EQ(api().modifyQp(p[0]->qp, &r, kRtrMask), 0);
  }
  ASSERT_EQ(toRts(a.qp, rnrRetry), 0);
  ASSERT_EQ(toRts(b.qp, rnrRetry), 0);
}

int postWrite(Node& from, Node& to, uint64_t wrId, size_t off, size_t len, bool signaled,
              ibv_wr_opcode op = IBV_WR_RDMA_WRITE, uint32_t immNet = 0, uint32_t rkeyDelta = 0) {
  ibv_sge sge{from.addr(off), static_cast<uint32_t>(len), from.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wrId;
  wr.sg_list = &sge;
  wr.num_sge = len > 0 ? 1 : 0;
  wr.opcode = op;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  wr.imm_data = immNet;
  wr.wr.rdma.remote_addr = to.addr(off);
  wr.wr.rdma.rkey = to.mr->rkey + rkeyDelta;
  ibv_send_wr* bad = nullptr;
  return api().postSend(from.qp, &wr, &bad);
}

int postRecv(Node& n, uint64_t wrId) {
  ibv_recv_wr wr{};
  wr.wr_id = wrId;
  ibv_recv_wr* bad = nullptr;
  return api().postRecv(n.qp, &wr, &bad);
}

std::vector<ibv_wc> pollN(ibv_cq* cq, size_t n, int timeoutMs = 2000) {
  std::vector<ibv_wc> out;
  auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
  while (out.size() < n && Clock::now() < deadline) {
    ibv_wc wc[16];
    int k = api().pollCq(cq, static_cast<int>(std::min<size_t>(16, n - out.size())), wc);
    if (k < 0) break;
    out.insert(out.end(), wc, wc + k);
    if (k == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return out;
}

bool readable(int fd, int timeoutMs) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeoutMs) == 1 && (p.revents & POLLIN) != 0;
}

void expectClean() {
  EXPECT_EQ(liveObjects(), 0u) << describeLiveObjects();
}

TEST(SoftVerbs, DeviceQueriesInfiniBand) {
  Installed inst(Config{2, false});
  const VerbsApi& v = api();
  int n = 0;
  ibv_device** list = v.getDeviceList(&n);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(list[2], nullptr);
  EXPECT_STREQ(v.getDeviceName(list[0]), "soft_0");
  EXPECT_STREQ(v.getDeviceName(list[1]), "soft_1");
  ibv_context* ctx = v.openDevice(list[1]);
  v.freeDeviceList(list);
  ASSERT_NE(ctx, nullptr);
  EXPECT_EQ(ctx->num_comp_vectors, 1);
  EXPECT_GE(ctx->async_fd, 0);
  EXPECT_FALSE(readable(ctx->async_fd, 0));

  ibv_device_attr d{};
  ASSERT_EQ(v.queryDevice(ctx, &d), 0);
  EXPECT_EQ(d.max_qp_wr, 16384);
  EXPECT_EQ(d.max_cqe, 65536);
  EXPECT_EQ(d.max_sge, 30);
  EXPECT_EQ(d.max_qp_rd_atom, 16);
  EXPECT_EQ(d.phys_port_cnt, 1);
  EXPECT_STREQ(d.fw_ver, "soft");

  ibv_port_attr p{};
  ASSERT_EQ(v.queryPort(ctx, 1, &p), 0);
  EXPECT_EQ(p.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(p.active_mtu, IBV_MTU_4096);
  EXPECT_EQ(p.lid, 2);
  EXPECT_EQ(p.link_layer, IBV_LINK_LAYER_INFINIBAND);
  EXPECT_EQ(p.gid_tbl_len, 4);
  EXPECT_EQ(p.max_msg_sz, 1u << 31);
  EXPECT_EQ(v.queryPort(ctx, 2, &p), EINVAL);

  ibv_gid g{};
  ASSERT_EQ(v.queryGid(ctx, 1, 0, &g), 0);
  EXPECT_EQ(g.raw[0], 0xfe);
  EXPECT_EQ(g.raw[1], 0x80);
  EXPECT_EQ(v.queryGid(ctx, 1, 4, &g), EINVAL);
  EXPECT_EQ(v.closeDevice(ctx), 0);
  expectClean();
}

TEST(SoftVerbs, DeviceQueriesRoce) {
  Installed inst(Config{2, true, 3});
  const VerbsApi& v = api();
  ibv_context* ctx = v.openDevice(device(1));
  ibv_port_attr p{};
  ASSERT_EQ(v.queryPort(ctx, 1, &p), 0);
  EXPECT_EQ(p.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_EQ(p.lid, 0);
  EXPECT_EQ(p.gid_tbl_len, 3);
  ibv_gid g{};
  ASSERT_EQ(v.queryGid(ctx, 1, 1, &g), 0);
  const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 1, 2};
  EXPECT_EQ(std::memcmp(g.raw, want, 16), 0);
  EXPECT_EQ(v.queryGid(ctx, 1, 3, &g), EINVAL);
  EXPECT_EQ(v.closeDevice(ctx), 0);
  expectClean();
}

TEST(SoftVerbs, MemoryRegistrationRules) {
  Installed inst;
  const VerbsApi& v = api();
  ibv_context* ctx = v.openDevice(device(0));
  ibv_pd* pd = v.allocPd(ctx);
  std::vector<char> buf(256);
  errno = 0;
  EXPECT_EQ(v.regMr(pd, buf.data(), buf.size(), IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(v.regMr(pd, buf.data(), buf.size(), IBV_ACCESS_REMOTE_ATOMIC), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(v.regMr(pd, nullptr, 16, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_mr* a = v.regMr(pd, buf.data(), 128, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_mr* b = v.regMr(pd, buf.data() + 128, 128, 0);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->lkey, a->rkey);
  EXPECT_NE(a->lkey, b->lkey);
  EXPECT_NE(a->rkey, b->rkey);
  EXPECT_EQ(a->pd, pd);
  EXPECT_EQ(a->length, 128u);
  EXPECT_EQ(v.deallocPd(pd), EBUSY);
  EXPECT_EQ(v.closeDevice(ctx), EBUSY);
  EXPECT_EQ(liveObjects(), 4u);
  EXPECT_EQ(v.deregMr(a), 0);
  EXPECT_EQ(v.deregMr(b), 0);
  EXPECT_EQ(counters().regMr, 2u);
  EXPECT_EQ(counters().deregMr, 2u);
  EXPECT_EQ(v.deallocPd(pd), 0);
  EXPECT_EQ(v.closeDevice(ctx), 0);
  expectClean();
}

TEST(SoftVerbs, QpStateMachine) {
  Installed inst(Config{2});
  const VerbsApi& v = api();
  {
    Node a(0), b(1);
    ASSERT_NE(a.qp, nullptr);
    EXPECT_EQ(a.qp->state, IBV_QPS_RESET);
    EXPECT_EQ(a.qp->qp_context, &a);
    EXPECT_EQ(a.qp->send_cq, a.cq);
    EXPECT_NE(a.qp->qp_num, b.qp->qp_num);

    ibv_qp_init_attr ud{};
    ud.send_cq = ud.recv_cq = a.cq;
    ud.qp_type = IBV_QPT_UD;
    errno = 0;
    EXPECT_EQ(v.createQp(a.pd, &ud), nullptr);
    EXPECT_NE(errno, 0);
    ibv_qp_init_attr big{};
    big.send_cq = big.recv_cq = a.cq;
    big.qp_type = IBV_QPT_RC;
    big.cap.max_inline_data = 1024;
    EXPECT_EQ(v.createQp(a.pd, &big), nullptr);
    EXPECT_EQ(errno, EINVAL);

    EXPECT_EQ(postRecv(a, 1), EINVAL);  // RESET
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    EXPECT_EQ(v.modifyQp(a.qp, &at, kInitMask & ~IBV_QP_ACCESS_FLAGS), EINVAL);
    at.port_num = 2;
    EXPECT_EQ(v.modifyQp(a.qp, &at, kInitMask), EINVAL);
    at.qp_state = IBV_QPS_RTR;  // RESET -> RTR is no transition
    EXPECT_EQ(v.modifyQp(a.qp, &at, kInitMask), EINVAL);
    ASSERT_EQ(toInit(a.qp), 0);
    EXPECT_EQ(a.qp->state, IBV_QPS_INIT);
    EXPECT_EQ(postRecv(a, 1), 0);  // allowed from INIT

    ibv_qp_attr r = rtrAttr(b, false);
    EXPECT_EQ(v.modifyQp(a.qp, &r, kRtrMask & ~IBV_QP_MIN_RNR_TIMER), EINVAL);
    EXPECT_EQ(v.modifyQp(a.qp, &r, kRtrMask | IBV_QP_TIMEOUT), EINVAL);  // not allowed here
    ASSERT_EQ(v.modifyQp(a.qp, &r, kRtrMask), 0);
    EXPECT_EQ(postWrite(a, b, 1, 0, 8, true), EINVAL);  // RTR: no sends yet

    ibv_qp_attr s{};
    s.qp_state = IBV_QPS_RTS;
    s.timeout = 14;
    s.retry_cnt = 7;
    s.rnr_retry = 7;
    EXPECT_EQ(v.modifyQp(a.qp, &s, kRtsMask & ~IBV_QP_SQ_PSN), EINVAL);
    ASSERT_EQ(v.modifyQp(a.qp, &s, kRtsMask), 0);
    EXPECT_EQ(a.qp->state, IBV_QPS_RTS);

    ibv_qp_attr e{};
    e.qp_state = IBV_QPS_ERR;
    ASSERT_EQ(v.modifyQp(a.qp, &e, IBV_QP_STATE), 0);
    auto wc = pollN(a.cq, 1);
    ASSERT_EQ(wc.size(), 1u);  // the receive posted in INIT is flushed
    EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wc[0].wr_id, 1u);
    e.qp_state = IBV_QPS_RESET;
    EXPECT_EQ(v.modifyQp(a.qp, &e, IBV_QP_STATE | IBV_QP_TIMEOUT), EINVAL);
    ASSERT_EQ(v.modifyQp(a.qp, &e, IBV_QP_STATE), 0);
    EXPECT_EQ(toInit(a.qp), 0);  // reusable after RESET
  }
  expectClean();
}

TEST(SoftVerbs, RoceAddressResolution) {
  Installed inst(Config{2, true});
  const VerbsApi& v = api();
  {
    Node a(0), b(1);
    ASSERT_EQ(toInit(a.qp), 0);
    ibv_qp_attr r = rtrAttr(b, true);
    r.ah_attr.is_global = 0;
    EXPECT_EQ(v.modifyQp(a.qp, &r, kRtrMask), EINVAL);
    r = rtrAttr(b, true);
    r.ah_attr.grh.dgid.raw[15] = 99;  // no such address
    EXPECT_EQ(v.modifyQp(a.qp, &r, kRtrMask), EINVAL);
    r = rtrAttr(b, true);
    r.ah_attr.grh.sgid_index = 4;
    EXPECT_EQ(v.modifyQp(a.qp, &r, kRtrMask), EINVAL);
    r = rtrAttr(b, true);
    EXPECT_EQ(v.modifyQp(a.qp, &r, kRtrMask), 0);
  }
  expectClean();
}

TEST(SoftVerbs, UninstallReportsLeaks) {
  {
    Installed inst;
    ASSERT_NE(api().openDevice(device(0)), nullptr);
    EXPECT_EQ(liveObjects(), 1u);
    EXPECT_NE(describeLiveObjects().find("context on soft_0"), std::string::npos);
  }  // uninstall frees it and says so on stderr
  EXPECT_EQ(leakedAtLastUninstall(), 1u);
  EXPECT_EQ(liveObjects(), 0u);
}

// The data-path tests run on InfiniBand and RoCE with a device thread, and
// on InfiniBand with work executed inside postSend.
class SoftVerbsPath : public ::testing::TestWithParam<int> {
 protected:
  Config config() const {
    Config c;
    c.devices = 2;
    c.roce = GetParam() == 1;
    c.deviceThread = GetParam() != 2;
    return c;
  }
  bool roce() const { return GetParam() == 1; }
};

INSTANTIATE_TEST_SUITE_P(
    Modes, SoftVerbsPath, ::testing::Values(0, 1, 2), [](const ::testing::TestParamInfo<int>& i) {
      return std::string(i.param == 0 ? "IbThread" : i.param == 1 ? "RoceThread" : "IbInline");
    });

TEST_P(SoftVerbsPath, RdmaWriteLands) {
  Installed inst(config());
  {
    Node a(0), b(1);
    connect(a, b, roce());
    for (size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = static_cast<char>(i * 7 + 1);
    ASSERT_EQ(postWrite(a, b, 10, 0, 1024, false), 0);  // unsignaled
    ASSERT_EQ(postWrite(a, b, 11, 1024, 3072, true), 0);
    auto wc = pollN(a.cq, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_WRITE);
    EXPECT_EQ(wc[0].wr_id, 11u);
    EXPECT_EQ(wc[0].byte_len, 3072u);
    EXPECT_EQ(wc[0].qp_num, a.qp->qp_num);
    EXPECT_EQ(a.buf, b.buf);
    EXPECT_EQ(pollN(b.cq, 1, 10).size(), 0u);  // a plain write is silent at the target

    // Zero-length write: a liveness probe, no rkey needed.
    ASSERT_EQ(postWrite(a, b, 12, 0, 0, true, IBV_WR_RDMA_WRITE, 0, 1), 0);
    wc = pollN(a.cq, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);

    // Inline: the source may change right after posting.
    ibv_sge sge{a.addr(0), 16, 0};
    ibv_send_wr wr{};
    wr.wr_id = 13;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = b.addr(2048);
    wr.wr.rdma.rkey = b.mr->rkey;
    std::memset(a.buf.data(), 0x5c, 16);
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(api().postSend(a.qp, &wr, &bad), 0);
    std::memset(a.buf.data(), 0, 16);
    ASSERT_EQ(pollN(a.cq, 1).size(), 1u);
    EXPECT_EQ(b.buf[2048], 0x5c);
    sge.length = 65;  // over max_inline_data
    EXPECT_EQ(api().postSend(a.qp, &wr, &bad), EINVAL);
    EXPECT_EQ(bad, &wr);
  }
  expectClean();
}

TEST_P(SoftVerbsPath, WriteWithImmConsumesReceive) {
  Installed inst(config());
  {
    Node a(0), b(1);
    connect(a, b, roce());
    std::memset(a.buf.data(), 0x42, 100);
    ASSERT_EQ(postRecv(b, 77), 0);
    uint32_t imm = htonl(0xdeadbeef);
    ASSERT_EQ(postWrite(a, b, 5, 0, 100, true, IBV_WR_RDMA_WRITE_WITH_IMM, imm), 0);
    auto r = pollN(b.cq, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(r[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    EXPECT_TRUE(r[0].wc_flags & IBV_WC_WITH_IMM);
    EXPECT_EQ(r[0].imm_data, imm);
    EXPECT_EQ(r[0].byte_len, 100u);
    EXPECT_EQ(r[0].wr_id, 77u);
    EXPECT_EQ(r[0].qp_num, b.qp->qp_num);
    EXPECT_EQ(r[0].src_qp, a.qp->qp_num);
    EXPECT_EQ(b.buf[99], 0x42);  // landed before the CQE was visible
    auto s = pollN(a.cq, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(s[0].opcode, IBV_WC_RDMA_WRITE);
    EXPECT_EQ(counters().writesWithImm, 1u);
  }
  expectClean();
}

TEST_P(SoftVerbsPath, RnrWaitsForReceiveThenDelivers) {
  Installed inst(config());
  {
    Node a(0), b(1);
    connect(a, b, roce(), /*rnrRetry=*/7);
    a.buf[0] = 1;
    a.buf[64] = 2;
    ASSERT_EQ(postWrite(a, b, 1, 0, 8, true, IBV_WR_RDMA_WRITE_WITH_IMM, htonl(1)), 0);
    ASSERT_EQ(postWrite(a, b, 2, 64, 8, true), 0);  // queued behind the RNR'd one
    EXPECT_EQ(pollN(a.cq, 1, 30).size(), 0u);
    EXPECT_EQ(b.buf[0], 0);
    EXPECT_EQ(b.buf[64], 0);
    ASSERT_EQ(postRecv(b, 9), 0);
    auto s = pollN(a.cq, 2);
    ASSERT_EQ(s.size(), 2u);
    EXPECT_EQ(s[0].wr_id, 1u);
    EXPECT_EQ(s[1].wr_id, 2u);
    EXPECT_EQ(s[1].status, IBV_WC_SUCCESS);
    EXPECT_EQ(b.buf[64], 2);
    auto r = pollN(b.cq, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].wr_id, 9u);
  }
  expectClean();
}

TEST_P(SoftVerbsPath, RnrRetryExceeded) {
  Installed inst(config());
  {
    Node a(0), b(1);
    connect(a, b, roce(), /*rnrRetry=*/0);
    ASSERT_EQ(postWrite(a, b, 1, 0, 8, false, IBV_WR_RDMA_WRITE_WITH_IMM, 0), 0);
    ASSERT_EQ(postWrite(a, b, 2, 0, 8, false), 0);
    auto s = pollN(a.cq, 2);
    ASSERT_EQ(s.size(), 2u);
    EXPECT_EQ(s[0].status, IBV_WC_RNR_RETRY_EXC_ERR);  // reported though unsignaled
    EXPECT_STREQ(api().wcStatusStr(s[0].status), "RNR retry counter exceeded");
    EXPECT_EQ(s[1].status, IBV_WC_WR_FLUSH_ERR);
  }
  expectClean();
}

TEST_P(SoftVerbsPath, WrongRkeyIsRemoteAccessError) {
  Installed inst(config());
  {
    Node a(0), b(1);
    connect(a, b, roce());
    ASSERT_EQ(postRecv(b, 50), 0);
    ASSERT_EQ(postWrite(a, b, 1, 0, 8, false, IBV_WR_RDMA_WRITE, 0, /*rkeyDelta=*/1), 0);
    auto s = pollN(a.cq, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_STREQ(api().wcStatusStr(s[0].status), "remote access error");
    // The QP is in error: later WRs are flushed.
    ASSERT_EQ(postWrite(a, b, 2, 0, 8, false), 0);
    s = pollN(a.cq, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(s[0].wr_id, 2u);
    EXPECT_STREQ(api().wcStatusStr(s[0].status), "Work Request Flushed Error");
    // The responder went to error too: its receive is flushed, and it got
    // an async event.
    auto r = pollN(b.cq, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].status, IBV_WC_WR_FLUSH_ERR);
    ASSERT_TRUE(readable(b.ctx->async_fd, 1000));
    ibv_async_event ev{};
    ASSERT_EQ(api().getAsyncEvent(b.ctx, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
    EXPECT_EQ(ev.element.qp, b.qp);
    api().ackAsyncEvent(&ev);
  }
  expectClean();
}

TEST_P(SoftVerbsPath, InjectedRemoteAccessError) {
  Installed inst(config());
  {
    Node a(0), b(1);
    connect(a, b, roce());
    injectRemoteAccessErrorOnNextWrite();
    ASSERT_EQ(postWrite(a, b, 1, 0, 8, true), 0);
    auto s = pollN(a.cq, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_REM_ACCESS_ERR);
    ibv_async_event ev{};
    ASSERT_TRUE(readable(b.ctx->async_fd, 1000));
    ASSERT_EQ(api().getAsyncEvent(b.ctx, &ev), 0);
    api().ackAsyncEvent(&ev);
  }
  expectClean();
}

TEST_P(SoftVerbsPath, BadLkeyIsLocalProtectionError) {
  Installed inst(config());
  {
    Node a(0), b(1);
    connect(a, b, roce());
    ibv_sge sge{a.addr(0), 8, a.mr->lkey + 1};
    ibv_send_wr wr{};
    wr.wr_id = 3;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = b.addr(0);
    wr.wr.rdma.rkey = b.mr->rkey;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(api().postSend(a.qp, &wr, &bad), 0);
    auto s = pollN(a.cq, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_LOC_PROT_ERR);
    EXPECT_STREQ(api().wcStatusStr(s[0].status), "local protection error");

    // Out of the MR's range is the same error (on a fresh pair).
  }
  {
    Node a(0), b(1);
    connect(a, b, roce());
    ibv_sge sge{a.addr(4000), 200, a.mr->lkey};  // runs past the 4096-byte MR
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = b.addr(0);
    wr.wr.rdma.rkey = b.mr->rkey;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(api().postSend(a.qp, &wr, &bad), 0);
    auto s = pollN(a.cq, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_LOC_PROT_ERR);
  }
  expectClean();
}

TEST_P(SoftVerbsPath, KilledPeerIsRetryExceeded) {
  Installed inst(config());
  {
    std::thread::id victim;
    ibv_context* bctx = nullptr;
    std::thread t([&] {
      victim = std::this_thread::get_id();
      bctx = api().openDevice(device(1));
    });
    t.join();
    Node a(0), b(1, 4096, true, 256, 128, bctx);
    connect(a, b, roce());
    ASSERT_EQ(postWrite(a, b, 1, 0, 8, true), 0);
    ASSERT_EQ(pollN(a.cq, 1).size(), 1u);

    killContextsOpenedBy(victim);
    ASSERT_EQ(postWrite(a, b, 2, 0, 8, false), 0);
    ASSERT_EQ(postWrite(a, b, 3, 0, 8, true), 0);
    auto s = pollN(a.cq, 2);
    ASSERT_EQ(s.size(), 2u);
    EXPECT_EQ(s[0].status, IBV_WC_RETRY_EXC_ERR);
    EXPECT_EQ(s[0].wr_id, 2u);
    EXPECT_STREQ(api().wcStatusStr(s[0].status), "transport retry counter exceeded");
    EXPECT_EQ(s[1].status, IBV_WC_WR_FLUSH_ERR);

    // The dead side's calls fail without crashing; a blocked waiter wakes.
    EXPECT_EQ(postWrite(b, a, 1, 0, 8, true), EIO);
    EXPECT_EQ(postRecv(b, 1), EIO);
    ibv_wc wc;
    EXPECT_LT(api().pollCq(b.cq, 1, &wc), 0);
    EXPECT_TRUE(readable(b.channel->fd, 0));
    ibv_cq* cq = nullptr;
    void* cqCtx = nullptr;
    EXPECT_EQ(api().getCqEvent(b.channel, &cq, &cqCtx), -1);
    EXPECT_EQ(errno, EIO);
  }  // destroying the dead side's objects works
  expectClean();
}

TEST_P(SoftVerbsPath, DestroyedPeerIsRetryExceeded) {
  Installed inst(config());
  {
    Node a(0);
    {
      Node b(1);
      connect(a, b, roce());
    }
    Node c(1);  // the target memory still exists elsewhere; the QP does not
    ASSERT_EQ(postWrite(a, c, 1, 0, 8, true), 0);
    auto s = pollN(a.cq, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_RETRY_EXC_ERR);
  }
  expectClean();
}

TEST_P(SoftVerbsPath, CompletionChannel) {
  Installed inst(config());
  {
    Node a(0, 4096, true), b(1);
    connect(a, b, roce());
    EXPECT_EQ(a.cq->channel, a.channel);
    EXPECT_EQ(a.cq->cq_context, &a);
    int fl = fcntl(a.channel->fd, F_GETFL);
    ASSERT_EQ(fcntl(a.channel->fd, F_SETFL, fl | O_NONBLOCK), 0);
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    EXPECT_EQ(api().getCqEvent(a.channel, &cq, &ctx), -1);
    EXPECT_EQ(errno, EAGAIN);

    ASSERT_EQ(api().reqNotifyCq(a.cq, 0), 0);
    ASSERT_EQ(postWrite(a, b, 1, 0, 8, true), 0);
    ASSERT_TRUE(readable(a.channel->fd, 2000));
    ASSERT_EQ(api().getCqEvent(a.channel, &cq, &ctx), 0);
    EXPECT_EQ(cq, a.cq);
    EXPECT_EQ(ctx, &a);
    EXPECT_FALSE(readable(a.channel->fd, 0));
    ASSERT_EQ(pollN(a.cq, 1).size(), 1u);

    // Not re-armed: the next CQE makes no event.
    ASSERT_EQ(postWrite(a, b, 2, 0, 8, true), 0);
    ASSERT_EQ(pollN(a.cq, 1).size(), 1u);
    EXPECT_FALSE(readable(a.channel->fd, 0));
    EXPECT_EQ(counters().cqEvents, 1u);
    api().ackCqEvents(a.cq, 1);
    EXPECT_EQ(counters().cqEventsAcked, 1u);
  }
  expectClean();
}

TEST(SoftVerbs, DestroyCqWithUnackedEventIsBusy) {
  Installed inst;
  const VerbsApi& v = api();
  ibv_context* ctx = v.openDevice(device(0));
  ibv_comp_channel* ch = v.createCompChannel(ctx);
  ibv_cq* cq = v.createCq(ctx, 4, nullptr, ch, 0);
  EXPECT_EQ(v.destroyCompChannel(ch), EBUSY);
  // Fabricate a completion through a flushed receive on a QP in error.
  ibv_pd* pd = v.allocPd(ctx);
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_recv_wr = 1;
  ibv_qp* qp = v.createQp(pd, &a);
  ibv_qp_attr e{};
  e.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(v.modifyQp(qp, &e, IBV_QP_STATE), 0);
  ASSERT_EQ(v.reqNotifyCq(cq, 0), 0);
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(v.postRecv(qp, &wr, &bad), 0);
  ibv_cq* got = nullptr;
  void* gotCtx = nullptr;
  ASSERT_EQ(v.getCqEvent(ch, &got, &gotCtx), 0);  // blocking fd, event already there
  EXPECT_EQ(got, cq);
  EXPECT_EQ(v.destroyCq(cq), EBUSY);  // the QP uses it
  EXPECT_EQ(v.destroyQp(qp), 0);
  EXPECT_EQ(v.destroyCq(cq), EBUSY);  // the event is not acked
  v.ackCqEvents(cq, 1);
  EXPECT_EQ(v.destroyCq(cq), 0);
  EXPECT_EQ(v.destroyCompChannel(ch), 0);
  EXPECT_EQ(v.deallocPd(pd), 0);
  EXPECT_EQ(v.closeDevice(ctx), 0);
  expectClean();
}

TEST(SoftVerbs, AsyncEventInjectionAndStrings) {
  Installed inst;
  const VerbsApi& v = api();
  ibv_context* ctx = v.openDevice(device(0));
  ibv_async_event ev{};
  EXPECT_EQ(v.getAsyncEvent(ctx, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
  injectAsyncEvent(ctx, IBV_EVENT_PORT_ERR, 1);
  ASSERT_TRUE(readable(ctx->async_fd, 0));
  ASSERT_EQ(v.getAsyncEvent(ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ERR);
  EXPECT_EQ(ev.element.port_num, 1);
  v.ackAsyncEvent(&ev);
  EXPECT_FALSE(readable(ctx->async_fd, 0));
  EXPECT_EQ(v.getAsyncEvent(ctx, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(counters().asyncEvents, 1u);
  EXPECT_EQ(counters().asyncEventsAcked, 1u);

  EXPECT_STREQ(v.eventTypeStr(IBV_EVENT_PORT_ERR), "port error");
  EXPECT_STREQ(v.eventTypeStr(IBV_EVENT_QP_FATAL), "local work queue catastrophic error");
  EXPECT_STREQ(v.eventTypeStr(IBV_EVENT_QP_ACCESS_ERR), "local access violation work queue error");
  EXPECT_STREQ(v.eventTypeStr(IBV_EVENT_CQ_ERR), "CQ error");
  EXPECT_STREQ(v.wcStatusStr(IBV_WC_SUCCESS), "success");
  EXPECT_STREQ(v.wcStatusStr(static_cast<ibv_wc_status>(999)), "unknown");
  EXPECT_EQ(v.closeDevice(ctx), 0);
  expectClean();
}

TEST_P(SoftVerbsPath, CqOverflowRaisesCqError) {
  Installed inst(config());
  {
    Node a(0, 4096, false, /*cqe=*/2), b(1);
    connect(a, b, roce());
    for (int i = 0; i < 3; ++i) ASSERT_EQ(postWrite(a, b, i, 0, 8, true), 0);
    ASSERT_TRUE(readable(a.ctx->async_fd, 2000));
    ibv_async_event ev{};
    ASSERT_EQ(api().getAsyncEvent(a.ctx, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
    EXPECT_EQ(ev.element.cq, a.cq);
    api().ackAsyncEvent(&ev);
    ibv_wc wc[4];
    EXPECT_LT(api().pollCq(a.cq, 4, wc), 0);
  }
  expectClean();
}

TEST_P(SoftVerbsPath, SendQueueSlotsFreeOnlyWhenPolled) {
  Installed inst(config());
  {
    Node a(0, 4096, false, 256, /*maxSendWr=*/2), b(1);
    connect(a, b, roce());
    ASSERT_EQ(postWrite(a, b, 1, 0, 8, false), 0);
    ASSERT_EQ(postWrite(a, b, 2, 0, 8, true), 0);
    EXPECT_EQ(postWrite(a, b, 3, 0, 8, true), ENOMEM);  // both slots held
    auto s = pollN(a.cq, 1);
    ASSERT_EQ(s.size(), 1u);  // frees the unsignaled one too
    EXPECT_EQ(postWrite(a, b, 3, 0, 8, false), 0);
    EXPECT_EQ(postWrite(a, b, 4, 0, 8, true), 0);
    EXPECT_EQ(pollN(a.cq, 1).size(), 1u);
    Counters c = counters();
    EXPECT_EQ(c.postSendWrs, 4u);
    EXPECT_EQ(c.bytesWritten, 32u);
    EXPECT_EQ(c.cqesPolled, 2u);
    EXPECT_EQ(c.regMr, 2u);
  }
  expectClean();
}

TEST_P(SoftVerbsPath, SendConsumesReceiveBuffers) {
  Installed inst(config());
  {
    Node a(0), b(1);
    connect(a, b, roce());
    std::memcpy(a.buf.data(), "hello", 6);
    ibv_sge rs{b.addr(100), 64, b.mr->lkey};
    ibv_recv_wr rw{};
    rw.wr_id = 8;
    rw.sg_list = &rs;
    rw.num_sge = 1;
    ibv_recv_wr* rbad = nullptr;
    ASSERT_EQ(api().postRecv(b.qp, &rw, &rbad), 0);
    ASSERT_EQ(postWrite(a, b, 1, 0, 6, true, IBV_WR_SEND), 0);
    auto r = pollN(b.cq, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].opcode, IBV_WC_RECV);
    EXPECT_EQ(r[0].byte_len, 6u);
    EXPECT_STREQ(b.buf.data() + 100, "hello");
    auto s = pollN(a.cq, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].opcode, IBV_WC_SEND);
  }
  expectClean();
}

// Four ranks as threads, each with its own context, in a ring: every rank
// writes-with-immediate into its right neighbour while receiving from its
// left one and checking that each write's data is there when its CQE is.
TEST_P(SoftVerbsPath, ConcurrentRing) {
  Config c = config();
  Installed inst(c);
  constexpr int kRanks = 4;
  constexpr int kWrites = 200;
  constexpr size_t kChunk = 64;
  {
    std::vector<std::unique_ptr<Node>> out, in;  // out[r] -> in[(r+1)%4]
    for (int r = 0; r < kRanks; ++r) {
      out.push_back(std::make_unique<Node>(r % 2, kChunk * kWrites, false, 1024, 32));
      in.push_back(std::make_unique<Node>(r % 2, kChunk * kWrites, false, 1024, 32));
    }
    for (int r = 0; r < kRanks; ++r) connect(*out[r], *in[(r + 1) % kRanks], roce());
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        Node& o = *out[r];
        Node& i = *in[r];
        Node& right = *in[(r + 1) % kRanks];
        int left = (r + kRanks - 1) % kRanks;
        for (int k = 0; k < kWrites; ++k) {
          if (postRecv(i, static_cast<uint64_t>(k)) != 0) failures++;
        }
        int posted = 0, sendDone = 0, received = 0;
        auto deadline = Clock::now() + std::chrono::seconds(10);
        while ((sendDone < kWrites || received < kWrites) && Clock::now() < deadline) {
          while (posted < kWrites && posted - sendDone < 32) {
            std::memset(o.buf.data() + posted * kChunk, r * 16 + posted % 16, kChunk);
            if (postWrite(o, right, static_cast<uint64_t>(posted), posted * kChunk, kChunk, true,
                          IBV_WR_RDMA_WRITE_WITH_IMM, htonl(static_cast<uint32_t>(posted))) != 0) {
              failures++;
              return;
            }
            posted++;
          }
          ibv_wc wc[16];
          int n = api().pollCq(o.cq, 16, wc);
          int progress = n;
          for (int j = 0; j < n; ++j) {
            if (wc[j].status != IBV_WC_SUCCESS) failures++;
            sendDone++;
          }
          n = api().pollCq(i.cq, 16, wc);
          for (int j = 0; j < n; ++j) {
            uint32_t k = ntohl(wc[j].imm_data);
            if (wc[j].status != IBV_WC_SUCCESS || k != static_cast<uint32_t>(received)) failures++;
            const char* p = i.buf.data() + k * kChunk;
            if (p[0] != static_cast<char>(left * 16 + k % 16) || p[kChunk - 1] != p[0]) failures++;
            received++;
          }
          if (progress + n == 0) std::this_thread::yield();
        }
        if (sendDone != kWrites || received != kWrites) failures++;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(counters().writesWithImm, static_cast<uint64_t>(kRanks * kWrites));
  }
  expectClean();
}

}  // namespace
}  // namespace gflow::testing::softverbs
