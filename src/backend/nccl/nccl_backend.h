// The NCCL backend: collectives on CUDA tensors run by NCCL on the caller's
// stream (docs/backends.md, "NCCL").
//
// A communicator owns one, idle until its first op on device tensors. That
// op decides, on every rank at once through the bootstrap store, whether
// NCCL runs the communicator's device ops (DeviceSetup::mode, which core
// resolves from Options::device.backend or GFLOW_DEVICE_BACKEND; every rank
// must load NCCL and the ranks of a host must use different GPUs, which
// NCCL requires) or gflow stages them through host memory. With NCCL, rank 0
// creates the ncclUniqueId and publishes it through the store, every rank
// creates a non-blocking NCCL communicator on its GPU, and, on several hosts
// with several ranks each, splits it (ncclCommSplit) into an intra-host and
// a cross-host communicator for the hierarchical allreduce.
//
// Each op is enqueued on the communicator's NCCL stream, behind an event
// recorded on the caller's stream when the op was called, and followed by
// an event; the
// executing thread polls the event, NCCL's asynchronous error, abort() and
// the op's deadline, and the peers' failure reports in the store. A failure
// or deadline aborts the NCCL communicators (ncclCommAbort), so kernels
// waiting for a dead peer end, and raises gflow::Error: no hang. Where the
// loaded NCCL can revoke and shrink, the communicator itself is revoked
// instead (its kernels end too) and kept for Communicator::shrink, which
// derives the survivors' communicator from it (ncclCommShrink).
//
// All calls except abort() come from the communicator's executing thread.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/nccl/op_check.h"
#include "backend/router.h"
#include "common/sticky_error.h"
#include "cuda/nccl_api.h"
#include "gflow/store.h"
#include "kernels/cuda/plugin.h"

namespace gflow::backend {

using NcclSetup = DeviceSetup;  // backend/router.h
class NcclP2P;                  // nccl_p2p.cc

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(NcclSetup setup);
  ~NcclBackend() override;
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  // Before every op on device tensors (`device`: the GPU of its first one):
  // whether NCCL runs this communicator's device ops. The first call decides
  // (collective: every rank makes it at the same op) and starts NCCL on
  // `device`. Throws gflow::Error when NCCL was required
  // (mode "nccl") but cannot run, or fails to start.
  bool use(const Op& op, const cuda::Plugin& plugin, int device);
  bool active() const { return state_ == State::kNccl; }
  // No device op has decided yet whether NCCL runs this communicator.
  bool undecided() const { return state_ == State::kUndecided; }
  // The configuration says "staged": NCCL never runs this communicator.
  bool stagedByConfiguration() const;
  int device() const { return device_; }
  // NCCL split by host (an intra-host and a cross-host communicator under
  // the hierarchical composition): made when NCCL starts on equal hosts
  // that are several with several ranks each; null otherwise.
  Backend* hierarchical() const { return hier_.get(); }
  // The op check (op_check.h; GFLOW_NCCL_VERIFY) of every collective from
  // now on: beside each op, after it is enqueued and before it is waited
  // for; before the hierarchical composition's phases. Before the first op.
  void setOpCheck(std::unique_ptr<NcclOpCheck> check) { check_ = std::move(check); }

  // Communicator::split, on this (the parent's) executing thread and
  // collective over its ranks: when NCCL runs this communicator, splits it
  // with ncclCommSplit (color < 0: joins none) and hands the new NCCL
  // communicator to `child` (the new communicator's NCCL backend, or
  // nullptr).
  void splitInto(const Op& op, int color, int key, Backend* child) override;
  // Communicator::shrink (backend.h): with ncclCommShrink, from the NCCL
  // communicator that runs this one's ops or that a failure revoked
  // (ncclCommRevoke, where the loaded NCCL has it, stops a failed op's
  // kernels and keeps the communicator for this; else the failure aborts it
  // and nothing is left to shrink).
  bool canShrink() const override;
  void shrinkInto(const Op& op, const std::vector<int>& excluded, bool failed,
                  Backend* child) override;

  // Buffers: memory of the chosen GPU, described by op.buffers (whose
  // event after the work producing the inputs the NCCL stream waits for).
  // Return once the GPU has finished the op.
  void allreduce(const Op& op, const void* in, void* out) override;
  void reduceScatter(const Op& op, const void* in, void* out) override;
  void allgather(const Op& op, const void* in, void* out) override;
  void broadcast(const Op& op, void* buf) override;
  // An allreduce of one int32 in device memory of this communicator's GPU.
  void barrier(const Op& op) override;
  // ncclReduce (types and ops NCCL has: use() says).
  void reduce(const Op& op, const void* in, void* out) override;
  // Grouped ncclSend/ncclRecv of bytes (nccl_grouped.cc): each block goes
  // straight to its rank, all in one NCCL group.
  void gather(const Op& op, const void* in, void* out) override;
  void scatter(const Op& op, const void* in, void* out) override;
  void alltoall(const Op& op, const void* in, void* out) override;
  void alltoallv(const Op& op, const void* in, const Blocks& inBlocks, void* out,
                 const Blocks& outBlocks) override;
  void gatherv(const Op& op, const void* in, void* out, const Blocks& blocks) override;
  void scatterv(const Op& op, const void* in, const Blocks& blocks, void* out) override;
  // Point-to-point through NCCL (nccl_p2p.cc, GFLOW_NCCL_P2P), once active():
  // each message's header goes through `host`'s point-to-point (tags, any
  // source, size checks), its payload through NCCL, the call's transfers in
  // one NCCL group. Calls enqueue their groups in the order they were made.
  std::unique_ptr<P2PInFlight> startNcclPointToPoint(const Op& op, std::vector<P2PMessage> msgs,
                                                     Backend& host);
  // Enqueues the NCCL groups of the point-to-point calls made before,
  // oldest first, until `until` (nullptr: every one) is enqueued; `block`:
  // waits for their headers, else stops at the first whose headers are not
  // all done. The router calls it before every collective, so a rank's ops
  // start in program order.
  void launchP2P(const NcclP2P* until, bool block);
  const char* name() const override { return "nccl"; }

  // Any thread: a running op aborts NCCL and raises `error`.
  void abort(const Error& error) override;
  // The communicator failed: tell the peers waiting in NCCL (store).
  void notifyPeers(const Error& error) override;
  // True while NCCL has run nothing here (undecided, or staged through the
  // host backend, which tells the peers): no peer can wait in an NCCL
  // kernel for this rank's op. Once NCCL runs, false: a peer's kernel for
  // the op cannot be recalled.
  bool reject(uint64_t seq, const std::string& why) override;
  // NCCL keeps no per-peer counters.
  PeerStats peerStats(int) const override { return {}; }
  // Device memory is never registered with a host transport.
  void registerMemory(void*, size_t,
                      std::vector<std::unique_ptr<transport::MemoryRegion>>*) override {}

 private:
  enum class State { kUndecided, kDeciding, kStaged, kNccl, kBroken };
  void decide(const Op& op, int device);
  void start(const Op& op);
  // A store key a peer writes, waited for under op.deadline, abort() and
  // the peers' failure reports; `what` names the wait in a timeout.
  std::vector<uint8_t> waitForKey(const Op& op, const std::string& key, const char* what);
  // After the NCCL communicator exists: the op event and stream and, on
  // several hosts, the hierarchical parts.
  void prepare(const Op& op);
  // ncclCommSplit of comm_ (collective over its ranks), waited for.
  void* splitComm(const Op& op, int color, int key, const char* what);
  // Runs the NCCL communicator `comm`, split or shrunk off `from`'s.
  // `pending`: the call that made `comm`, still in progress: waited for
  // here first (under this backend's abort, peers' reports and op's
  // deadline, so a failure of a peer's call reaches this one).
  void adopt(const Op& op, const NcclBackend& from, void* comm, const char* pending = nullptr);
  // A hierarchical part: rank `rank` of `size` in the split (color, key).
  std::unique_ptr<NcclBackend> part(const Op& op, int color, int key, int rank, int size,
                                    const char* what);
  // Polls revoked_ until it is quiescent (kInProgress ends), under op's
  // deadline.
  void quiesce(const Op& op);
  // Polls `comm` until its pending call completed (kInProgress ends).
  void waitReady(const Op& op, void* comm, const char* what);
  // The result of enqueueing `what` on `comm`: waits out kInProgress,
  // raises a failure.
  void check(const Op& op, void* comm, const char* what, int result);
  // Makes the NCCL stream wait for the op's inputs (op.buffers).
  void begin(const Op& op);
  // Records the event after the op on the NCCL stream and waits for the GPU.
  // The op check runs between the two (`counts`: an all-to-all-v's).
  void finish(const Op& op, const char* what, const CheckedCounts& counts = {});
  // The op check; a failing one aborts NCCL, then raises.
  void runCheck(const Op& op, const CheckedCounts& counts);
  // Waits until the GPU passed `event` (recorded after the op's work), under
  // the op's deadline counted from when its inputs were ready.
  void await(const Op& op, void* event, const char* what);
  // One look: true once the GPU passed `event`; raises NCCL's asynchronous
  // error and what checkWaiting raises.
  bool passed(const Op& op, void* event, const Deadline& deadline, const char* what,
              std::chrono::steady_clock::time_point* poll);
  // One NCCL group of byte sends and receives (nccl_grouped.cc): this rank
  // sends `sends[i]` to its peer and receives each of `recvs`; between a
  // pair, the k-th send matches the peer's k-th receive.
  struct Transfer {
    int peer;
    const void* data;
    size_t bytes;
  };
  void exchange(const Op& op, std::vector<Transfer> sends, std::vector<Transfer> recvs,
                const char* what, const CheckedCounts& counts = {});
  // A rooted op's root-only buffer `p` (`bytes`) on the root, as NCCL uses
  // it: `p` itself when every buffer of the op is on this GPU and stream,
  // else a device copy that `copy` owns (an input copied in on the NCCL
  // stream, after the work producing it). Call under a DeviceGuard.
  struct DeviceCopy {
    const cuda::Plugin* plugin = nullptr;
    void* mem = nullptr;
    ~DeviceCopy();
  };
  void* rootBuffer(const Op& op, const void* p, size_t bytes, bool input, DeviceCopy* copy);
  // After the op: an output copy goes back to `p`.
  void copyBack(const Op& op, void* p, size_t bytes, const DeviceCopy& copy);
  // begin(op), then the group enqueued on the NCCL stream (no wait).
  void enqueueGroup(const Op& op, const std::vector<Transfer>& sends,
                    const std::vector<Transfer>& recvs);

  // Checks abort, the deadline and the peers' reports; throws after
  // aborting NCCL. `what` names the NCCL call being waited for.
  void checkWaiting(const Op& op, const Deadline& deadline, const char* what,
                    std::chrono::steady_clock::time_point* poll);
  // Raises the first failure report a peer wrote in the store (waiting up
  // to `wait` for it) as a peer report naming that peer. `announced`: the
  // store's count says there is one (an unreadable one is raised as an
  // unknown failure); else no report returns quietly.
  void raiseReport(const Op& op, std::chrono::milliseconds wait, bool announced);
  // The error of NCCL call `what` on `comm` that returned `result`.
  Error ncclError(const Op& op, int result, const char* what, void* comm) const;
  [[noreturn]] void failNccl(const Op& op, int result, const char* what, void* comm);
  [[noreturn]] void failCuda(const Op& op, int err, const char* what);
  // Ends NCCL's work here: aborts the communicators, except that the
  // communicator itself (not a hierarchical part) is revoked instead where
  // NCCL can revoke and shrink, and kept in revoked_ for shrinkInto.
  void abortComms();
  // Aborts revoked_, if any: nothing to shrink from any more.
  void dropRevoked();
  // ncclCommFinalize, polled to the end (kSuccess) or a failure / `d`.
  int finalize(void* comm, const Deadline& d);

  NcclSetup s_;
  const cuda::Plugin* plugin_ = nullptr;
  const nccl::Api* api_ = nullptr;
  State state_ = State::kUndecided;
  int device_ = -1;
  void* comm_ = nullptr;
  void* revoked_ = nullptr;    // comm_ after a failure revoked it (abortComms)
  bool part_ = false;          // a hierarchical part (part()), never shrunk
  bool shrinkFailed_ = false;  // shrinkInto failed: canShrink() is false from then on
  // Several hosts with the same number of ranks each: the hierarchical
  // allreduce (backend/hierarchical) over an intra-host part (the ranks of
  // this host) and a cross-host part (the ranks with this local rank), both
  // NCCL communicators split off comm_ and owned by hier_.
  std::unique_ptr<Backend> hier_;
  std::unique_ptr<NcclOpCheck> check_;  // null: GFLOW_NCCL_VERIFY=0 or one rank
  NcclBackend* intra_ = nullptr;
  NcclBackend* cross_ = nullptr;
  std::atomic<Backend*> hierarchical_{nullptr};  // hier_, for abort()
  void* event_ = nullptr;
  void* barrierWord_ = nullptr;  // device memory, on the first barrier
  // NCCL runs on this stream of the communicator, after the event on the
  // caller's stream: communicators sharing a caller stream never order each
  // other's kernels (which could deadlock ranks that issue them in
  // different orders).
  void* stream_ = nullptr;

  // Point-to-point (nccl_p2p.cc): per peer, the NCCL messages sent to and
  // received from it so far (a header carries the sender's count), and the
  // calls whose NCCL group is not enqueued yet, in call order.
  friend class NcclP2P;
  std::vector<uint64_t> p2pSent_, p2pReceived_;
  std::deque<NcclP2P*> unlaunched_;

  // abort()'s error (the first one wins); checkWaiting polls it.
  StickyError abortError_;
  bool failed_ = false;  // notifyPeers() was called
};

}  // namespace gflow::backend
