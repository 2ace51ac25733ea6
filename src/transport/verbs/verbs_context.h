// RDMA verbs transport: RC queue pairs per peer, RDMA WRITE with immediate
// into memory the receiver advertised, completion polling by the waiting
// thread. docs/backends.md describes the protocol; in short:
//
//   - Eager (messages <= GFLOW_IB_EAGER_BYTES, and control messages): each
//     direction of a pair has a ring of GFLOW_IB_EAGER_SLOTS slots in the
//     receiver's registered memory. The sender copies header + payload into
//     its own registered staging slot and writes it to the same slot of the
//     receiver's ring with an immediate naming the slot; the receiver copies
//     it out (into the posted receive, or staging when none is posted yet)
//     and returns credits as a zero-byte write whose immediate carries its
//     consumed count. Eager traffic uses the pair's first QP, so slots and
//     credits arrive in order.
//   - Rendezvous (larger messages), receiver-driven: posting the receive
//     registers the destination buffer and sends a CTS (address, rkey, id);
//     the sender writes straight from its registered buffer, striped over the
//     pair's QPs, each write carrying the id as immediate; the receiver
//     counts bytes. A send that finds no CTS yet announces itself (RTS), so
//     mismatched ops are caught before any data moves.
//   - Registrations come from RegCache (explicit regions, or per-op).
//   - Matching, staging accounting and failure live in the Engine
//     (transport/engine.h); this file is the wire.
//   - Connections (verbs_connect.cc; GFLOW_CONNECT, transport/connect_mode.h):
//     each pair's records (QP numbers, PSNs, the inbound ring) go through
//     the bootstrap store. With all, every pair at init; lazy, when an op
//     first names the peer, and asks the peer to open it too (a store
//     counter and key the peer's watcher reads): the lower rank publishes
//     its end at once; the higher rank waits for it (RecordFetcher),
//     connects its queue pairs and only then publishes its own, so the
//     lower rank may write as soon as it has connected; the lower rank's
//     first write is a READY immediate, until which the higher rank holds
//     its writes.
//   - Errors: work-completion errors and async events become gflow::Error
//     naming the peer and the verbs status; a waiter probes a silent peer
//     with a zero-length write, so a dead peer gives peer_lost, not a hang.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/engine.h"
#include "transport/verbs/device.h"
#include "transport/verbs/record_fetch.h"
#include "transport/verbs/reg_cache.h"
#include "transport/wait_policy.h"

namespace gflow::transport::verbs {

// The slot header that precedes every eager message (96 bytes).
struct SlotHeader {
  uint32_t magic;
  uint16_t type;
  uint16_t reserved;
  uint32_t payload;  // bytes following the header in this slot
  uint32_t seq;      // low 32 bits of the sender's eager message number
  uint64_t group;
  uint64_t index;
  uint64_t env[3];
  uint64_t len;       // message bytes (data, RTS, CTS) or error text bytes
  uint64_t stamp[3];  // data, RTS, CTS: the sender's ArrivalStamp (common/arrivals.h)
  uint64_t reserved2;
};
static_assert(sizeof(SlotHeader) == 96, "slot header layout");

enum SlotType : uint16_t {
  kSlotData = 1,
  kSlotRts = 2,
  kSlotCts = 3,
  kSlotError = 4,
  kSlotPing = 5,
  kSlotPong = 6,
  kSlotReject = 7  // this rank will not run op `group` (Context::reject); payload: why
};
constexpr uint32_t kSlotMagic = 0x67665653;  // "gfVS"

// Queue-pair attributes every rank reads from its parameters.
struct QpSettings {
  ibv_mtu mtu;
  uint8_t timeout;  // 4.096 us x 2^timeout
  uint8_t retry;
};

// Immediate data (network order on the wire): kind in the top 4 bits, slot
// index or rendezvous id below.
enum ImmKind : uint32_t { kImmSlot = 1, kImmData = 2, kImmCredit = 3, kImmReady = 4 };
inline uint32_t makeImm(ImmKind k, uint32_t v) {
  return (uint32_t(k) << 28) | (v & 0x0fffffffu);
}

// Work request ids: kind, peer, value.
enum WrKind : uint64_t {
  kWrSlot = 1,
  kWrData = 2,
  kWrRecv = 3,
  kWrCredit = 4,
  kWrProbe = 5,
  kWrReady = 6
};
inline uint64_t makeWrId(WrKind k, int peer, uint32_t value) {
  return (uint64_t(k) << 56) | (uint64_t(uint32_t(peer) & 0xffffff) << 32) | value;
}
inline WrKind wrKind(uint64_t id) {
  return static_cast<WrKind>(id >> 56);
}
inline int wrPeer(uint64_t id) {
  return static_cast<int>((id >> 32) & 0xffffff);
}
inline uint32_t wrValue(uint64_t id) {
  return static_cast<uint32_t>(id);
}

struct CtsPayload {
  uint64_t addr;
  uint32_t rkey;
  uint32_t rid;
};

// A control slot's payload (CTS info, a rejection's text): copied.
struct ControlPayload {
  const void* data = nullptr;
  size_t bytes = 0;
};

class VerbsContext final : public Engine {
 public:
  explicit VerbsContext(const ContextOptions& options);
  ~VerbsContext() override;

  std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t size) override;
  RequestPtr isend(int peer, const void* data, size_t bytes, Tag tag, const Envelope& env) override;
  RequestPtr irecv(int peer, void* data, size_t bytes, Tag tag, const Envelope& env) override;
  void beginGroup(uint64_t group, const Envelope& env) override;
  void endOp() override;
  void notifyPeers(const Error& error) override;
  void reject(uint64_t group, const std::string& why) override;

  // Protocol counters of this context (benchmarks, tests).
  struct Counters {
    uint64_t eagerMessages = 0;     // slots written (data and control)
    uint64_t controlMessages = 0;   // of which RTS / CTS / error
    uint64_t rendezvousWrites = 0;  // RDMA writes of rendezvous data
    uint64_t creditWrites = 0;
    uint64_t completions = 0;  // work completions polled
    uint64_t cqEvents = 0;     // sleeps ended by a completion event
    uint64_t registrations = 0;
    uint64_t registrationHits = 0;
  };
  Counters counters() const;

 private:
  // A work request waiting for send-queue space.
  struct PendingWr {
    ibv_send_wr wr{};
    ibv_sge sge{};
    bool hasSge = false;
  };
  struct OutMsg {  // an eager slot to write
    SlotHeader hdr{};
    const char* payload = nullptr;
    std::vector<char> owned;  // control payloads
    RequestPtr req;           // completes once copied (data messages)
  };
  struct RecvMsg : Message {  // Message::staging: eager data that arrived first
    bool announced = false;   // an RTS arrived
    bool rendezvous = false;
    uint32_t rid = 0;
    uint64_t received = 0;
    RegCache::Ref reg;
  };
  struct SendOp {
    RequestPtr req;
    int peer = -1;
    Tag tag;
    Envelope env;
    const char* data = nullptr;
    uint64_t len = 0;
    int writesLeft = 0;
    RegCache::Ref reg;
  };
  struct CtsInfo {  // a CTS that arrived before its send was posted
    CtsPayload cts{};
    Envelope env;
    uint64_t len = 0;
  };
  struct Rdv {  // a posted rendezvous receive, by id
    int peer = -1;
    Tag tag;
    uint16_t gen = 0;
    bool used = false;
  };
  struct Peer {
    // On demand, a peer is opened (rings registered, queue pairs created
    // and receiving) when an op first names it or it asks this rank to
    // connect, and writable once its end is connected and ready to
    // receive; with the full mesh both at init.
    bool opened = false;
    bool writable = false;
    bool published = false;       // the higher rank: its record (or a refusal) is out
    std::vector<uint8_t> myEnd;   // the record of this rank's end
    std::vector<uint32_t> sqPsn;  // per QP: the PSN this side sends from
    std::vector<ibv_qp*> qps;
    std::vector<int> outstanding;  // send WRs posted, not completed, per QP
    int dataOutstanding = 0;       // eager and rendezvous writes not completed
    std::vector<std::deque<PendingWr>> waiting;
    // Outbound eager ring.
    uint64_t remoteRing = 0;
    uint32_t remoteRingKey = 0;
    uint64_t remoteCredit = 0;
    uint32_t remoteCreditKey = 0;
    uint64_t sent = 0;
    uint64_t creditSeen = 0;  // the peer's consumed count, from credit immediates
    char* outRing = nullptr;
    std::vector<bool> outBusy;
    std::deque<OutMsg> eagerQueue;
    // Inbound ring + the credit word the peer writes (one registered block),
    // and the outbound staging slots (local-only registration).
    char* inBlock = nullptr;
    ibv_mr* inMr = nullptr;
    char* outBlock = nullptr;
    ibv_mr* outMr = nullptr;
    char* inRing = nullptr;
    uint64_t consumed = 0;
    uint64_t creditReturned = 0;
    std::unordered_map<Tag, CtsInfo, TagHash> ctsArrived;
    std::unordered_map<Tag, uint32_t, TagHash> awaitingCts;  // tag -> send op id
    // A transfer to this peer failed while nothing was pending with it (e.g.
    // a credit return after the peer finished and left): raised when this
    // rank next needs the peer.
    std::optional<Error> lost;
    // `lost` names a fault of the transfer itself (an access, protection or
    // length error), not a flush or a peer that stopped answering, in op
    // `causeGroup`: the cause to name when another rank's report of that
    // op's failure arrives first.
    bool lostIsCause = false;
    uint64_t causeGroup = 0;
    // Liveness: a zero-byte write proves the peer's QP exists (a dead
    // process's does not); a PING slot answered with PONG (counted by the
    // Engine) proves its software is inside gflow.
    bool probeInFlight = false;
    std::chrono::steady_clock::time_point lastProbe{};
  };

  // Setup (verbs_connect.cc).
  void connectAll(const ContextOptions& options);
  void connectMesh(const ContextOptions& options);
  int cqEntriesFor(int peers) const;
  std::string recordKey(int from, int to) const;
  // Registers the rings and creates the queue pairs for `peer`, receiving;
  // its record goes to Peer::myEnd.
  void openPeer(int peer);
  // Connects the queue pairs of `peer` to its end, as published.
  void connectPeerEnd(int peer, const std::vector<uint8_t>& record, const ErrorContext& ectx);
  // On demand: opens `peer` and starts its connection, once; `ask`: also
  // asks the peer to open this rank (its watcher, follow(askKey(peer))),
  // so that a peer that never names this rank in an op still connects.
  void needPeer(int peer, bool ask = true);
  std::string askKey(int target) const;
  // On demand: the records and requests that have arrived.
  void adoptRecords();
  void adoptRecord(RecordFetcher::Record& r);
  void adoptRequest(const RecordFetcher::Record& r);
  // The higher rank of a pair that will not connect publishes why (the
  // error's code and text), where the lower rank waits for its record, which
  // then fails with that code; refuseWaitingPeers does it for every peer
  // still connecting when this rank fails.
  void refuse(int peer, const Error& why);
  void refuseWaitingPeers(const Error& error);
  void sendReady(int peer);
  void createQueuePairs(Peer& p, int peer);
  void postReceives(int peer, int q, int n);
  void destroyAll();

  // Data path (verbs_context.cc).
  uint64_t creditsConsumed(int peer) const;  // the peer's consumed count
  // A credit return's immediate on QP `q`; false when it is not a valid one.
  bool creditReturned(int peer, int q, uint32_t low28);
  void queueEager(int peer, OutMsg msg);
  void pumpEager(int peer);
  void postWr(int peer, int q, PendingWr w);
  void postOrQueue(int peer, int q, PendingWr w);
  void post(int peer, int q, PendingWr& w);  // now; the send queue has room
  void pumpWaiting(int peer, int q);
  void returnCredits(int peer, bool force);
  void sendControl(int peer, uint16_t type, Tag tag, const Envelope& env, uint64_t len,
                   ControlPayload payload = {});
  void startRendezvousRecv(int peer, RecvMsg& m);
  void matchCts(uint32_t opId, const CtsInfo& info);  // checks, then writes
  void handleSlot(int peer, const char* slot);
  void handleData(int peer, const SlotHeader& h, const char* payload);
  void handleAnnounce(int peer, const SlotHeader& h);
  void handleCts(int peer, const SlotHeader& h, const char* payload);
  void handleError(int peer, const SlotHeader& h, const char* payload);
  void handleRendezvousData(int peer, uint32_t rid, uint32_t bytes);
  bool hasPendingWith(int peer) const;
  void checkPeer(int peer);  // raises Peer::lost
  void checkLost();          // raises Peer::lost of a peer something waits on

  // Progress (verbs_progress.cc).
  int progress();  // polls completions; returns how many
  void handleCompletion(const ibv_wc& wc);
  // A completion with an error status: kept as Peer::lost (raised later).
  void recordFailedCompletion(int peer, WrKind kind, const ibv_wc& wc);
  // A receive completion on QP `q`: an eager slot, rendezvous data or a
  // credit return, told apart by the immediate.
  void handleInbound(int peer, int q, const ibv_wc& wc);
  void handleAsyncEvents();
  // returnCreditsFirst: false at teardown (peers may have left).
  void sleepForEvents(int timeoutMs, bool returnCreditsFirst = true);
  void probe(int peer);
  bool drained() const;  // no eager/rendezvous write in flight to a live peer
  [[noreturn]] void protocolError(int peer, const std::string& what);
  void errorQueuePairs();

  // Engine hooks.
  std::unique_ptr<Message> newMessage() override { return std::make_unique<RecvMsg>(); }
  void failWire(const Error& first) override;
  void wake() override;
  void pollOnce() override;
  void waitUntilDone(const RequestPtr& req, Deadline deadline) override;

  uint64_t stripeMin_ = 0;
  WaitPolicy waitPolicy_;
  int qpsPerPeer_ = 2;
  int slots_ = 32;
  size_t slotBytes_ = 0;  // header + eager payload
  size_t eagerMax_ = 0;
  int sendDepth_ = 0;
  int recvDepth_ = 0;
  uint64_t commId_ = 0;
  bool lazy_ = false;
  int peersOpened_ = 0;
  QpSettings qpSettings_{};
  std::mt19937 rng_;
  std::shared_ptr<Store> store_;
  std::string prefix_;
  std::unique_ptr<RecordFetcher> fetcher_;  // on demand

  std::shared_ptr<Device> device_;
  std::shared_ptr<RegCache> cache_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::unordered_map<uint32_t, std::pair<int, int>> qpIndex_;  // qp_num -> peer, QP
  size_t ringBytes_ = 0;                                       // slots_ x slotBytes_

  std::unordered_map<uint32_t, std::unique_ptr<SendOp>> sendOps_;
  uint32_t nextSendOp_ = 1;
  std::vector<Rdv> rdv_;
  std::vector<uint32_t> freeRdv_;

  bool qpsErrored_ = false;

  Counters counters_;
  int wakeFd_ = -1;
  // When a wait's start last read the device's async events.
  std::chrono::steady_clock::time_point asyncEventsRead_{};
  mutable std::mutex countersMutex_;
};

}  // namespace gflow::transport::verbs
