// Memory registrations of one verbs context.
//
// Two kinds of entry:
//   - explicit: registered through Context::registerMemory (the caller keeps
//     the memory alive and unchanged in place until it drops the handle); they
//     serve every later transfer inside them, so a buffer reused every step is
//     registered once.
//   - per-op: registered on demand for a message outside every explicit
//     region (its range, rounded to pages). They serve later transfers inside
//     that range in the op and are deregistered when the next op begins, because gflow
//     cannot see the caller free and re-map memory: a registration kept across
//     that would pin the old pages and move data to the wrong memory. Their
//     total size is bounded (GFLOW_IB_REG_CACHE): past it, idle entries are
//     dropped first.
// Receive buffers and explicit entries allow local and remote write (an
// explicit region that is read-only memory falls back to no access flags,
// enough for sends); per-op send entries need none. Thread-safe (the
// caller's thread registers explicit memory while the progress thread
// transfers).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "transport/verbs/device.h"

namespace gflow::transport::verbs {

class RegCache {
 public:
  struct Entry {
    ibv_mr* mr = nullptr;
    uintptr_t start = 0, end = 0;
    uint32_t lkey = 0, rkey = 0;  // copied: valid even after mr goes
    int refs = 0;
    bool explicitEntry = false;
    bool writable = true;  // registered for local and remote write
    bool removed = false;  // owner dropped it while in use
    uint64_t id = 0;
  };
  // Holds an entry in use (a transfer in flight); releasing it lets the
  // entry be dropped.
  class Ref {
   public:
    Ref() = default;
    Ref(RegCache* c, Entry* e) : cache_(c), entry_(e) {}
    Ref(Ref&& o) noexcept : cache_(o.cache_), entry_(o.entry_) { o.entry_ = nullptr; }
    Ref& operator=(Ref&& o) noexcept;
    ~Ref() { reset(); }
    void reset();
    uint32_t lkey() const { return entry_->lkey; }
    uint32_t rkey() const { return entry_->rkey; }
    explicit operator bool() const { return entry_ != nullptr; }

   private:
    RegCache* cache_ = nullptr;
    Entry* entry_ = nullptr;
  };

  struct Counters {
    uint64_t registrations = 0;    // ibv_reg_mr calls
    uint64_t deregistrations = 0;  // ibv_dereg_mr calls
    uint64_t hits = 0;             // transfers served by an existing entry
  };

  RegCache(std::shared_ptr<Device> device, uint64_t limitBytes, int rank);
  ~RegCache();

  // An entry covering [p, p+n), registering one if needed; `writable`: the
  // peer writes into it (receives), else it is only read (sends, which may
  // come from read-only memory). Throws Error(kInternal) naming the range
  // and errno when registration fails.
  Ref acquire(const void* p, size_t n, bool writable);
  // Explicit registration; returns its id for removeExplicit.
  uint64_t addExplicit(const void* p, size_t n);
  void removeExplicit(uint64_t id);
  // Drops per-op entries not in use (the op ended, or the context failed).
  void endOp();

  Counters counters() const;

 private:
  Entry* findLocked(uintptr_t s, uintptr_t e, bool writable);
  Entry* registerLocked(uintptr_t s, uintptr_t e, bool explicitEntry, bool writable);
  void dropLocked(std::multimap<uintptr_t, std::unique_ptr<Entry>>::iterator it);
  void release(Entry* e);

  std::shared_ptr<Device> device_;
  uint64_t limit_;
  int rank_;
  mutable std::mutex mu_;
  std::multimap<uintptr_t, std::unique_ptr<Entry>> entries_;  // by start
  uint64_t tempBytes_ = 0;
  uint64_t nextId_ = 1;
  Counters counters_;
};

}  // namespace gflow::transport::verbs
