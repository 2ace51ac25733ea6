// A software RDMA device for tests: an in-process implementation of the
// verbs table (src/transport/verbs/verbs_api.h) with the semantics of a real
// HCA and rdma-core, so the verbs transport runs in CI without hardware.
//
// install() builds the table and installs it with
// gflow::transport::verbs::installApiForTesting; from then on api() returns
// it. All devices of one install form one fabric: any QP can reach any other
// QP of any device (ranks run as threads of one process, each opening its
// own ibv_context). RC QPs only; the operations are RDMA WRITE, RDMA WRITE
// WITH IMMEDIATE, SEND and SEND WITH IMMEDIATE.
//
// What it checks like hardware: MR access rules and lkeys/rkeys (local and
// remote protection errors), the QP state machine with the kernel's
// required/optional attribute masks, the address (LID for InfiniBand, GID
// for RoCE) and the peer QP number, queue capacities (a send slot is freed
// only when a later-or-equal completion of that QP is polled, as in
// rdma-core providers), receiver-not-ready (rnr_retry 7 waits for a receive),
// transport retries against an unreachable or dead peer, CQ overflow, and
// flushing on the error state. See soft_verbs.cc for what is simplified.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace gflow::testing::softverbs {

struct Config {
  // Devices named "soft_0", "soft_1", ...; one port each.
  int devices = 1;
  // false: InfiniBand link layer, LID = device index + 1, addressed by dlid.
  // true: Ethernet link layer (RoCE), LID 0, addressed by GID (is_global).
  bool roce = false;
  // RoCE: GID i of device d is ::ffff:10.0.d.(i+1). InfiniBand: GID i of
  // device d is fe80::i:(d+1) (only the LID is used for addressing).
  int gidTableLen = 4;
  // true: posted work runs on a device thread (completions are
  // asynchronous). false: it runs inside postSend/postRecv, and a transport
  // retry or RNR retry (rnr_retry < 7) fails at once instead of after a while.
  bool deviceThread = true;
  // Upper bound on how long a WR is retried against an unreachable peer (not
  // connected yet, wrong address, destroyed or killed QP) before it completes
  // with IBV_WC_RETRY_EXC_ERR; the QP's own timeout/retry_cnt apply when
  // shorter. Also bounds RNR retries (rnr_retry < 7).
  int transportRetryMs = 20;
};

struct Counters {
  uint64_t regMr = 0;
  uint64_t deregMr = 0;
  uint64_t postSendWrs = 0;  // WRs accepted by postSend
  uint64_t postRecvWrs = 0;  // WRs accepted by postRecv
  uint64_t cqesPolled = 0;
  uint64_t bytesWritten = 0;  // by RDMA writes and sends that landed
  uint64_t writesWithImm = 0;
  uint64_t cqEvents = 0;  // returned by getCqEvent
  uint64_t cqEventsAcked = 0;
  uint64_t asyncEvents = 0;  // returned by getAsyncEvent
  uint64_t asyncEventsAcked = 0;
};

// Builds the table and installs it (uninstalling a previous install first).
// Resets all state and counters.
void install(const Config& config = {});
// installApiForTesting(nullptr), stops the device thread and frees the
// devices. Objects still alive are reported on stderr (see liveObjects) and
// freed.
void uninstall();

Counters counters();
void resetCounters();

// Like kill -9 of a process: every ibv_context opened by `thread` dies. Its
// QPs stop responding, so peers' WRs to them complete with
// IBV_WC_RETRY_EXC_ERR (after the retry time) and their QPs go to the error
// state. Its own pending WRs are dropped. Its later calls do not crash:
// posts, modifyQp and creates fail with EIO, pollCq returns -1, getCqEvent
// returns -1/EIO (its channel fds become readable so a blocked waiter
// wakes); destroying its objects still works.
void killContextsOpenedBy(std::thread::id thread);
// The live contexts `thread` opened (to inject events into a rank's).
std::vector<ibv_context*> contextsOpenedBy(std::thread::id thread);
// Queues an async event on `ctx` (element.port_num = port); async_fd becomes
// readable.
void injectAsyncEvent(ibv_context* ctx, ibv_event_type type, int port = 1);
// The next RDMA write executed (from a context `from` opened; default: any)
// behaves as if its rkey were wrong.
void injectRemoteAccessErrorOnNextWrite(std::thread::id from = {});

// Contexts + PDs + MRs + CQs + QPs + completion channels not yet destroyed.
size_t liveObjects();
// One line per live object, for failure messages ("" when none).
std::string describeLiveObjects();
// How many objects the last uninstall() found alive (and freed).
size_t leakedAtLastUninstall();

struct Installed {
  explicit Installed(const Config& c = {}) { install(c); }
  ~Installed() { uninstall(); }
  Installed(const Installed&) = delete;
  Installed& operator=(const Installed&) = delete;
};

}  // namespace gflow::testing::softverbs
