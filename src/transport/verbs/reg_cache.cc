#include "transport/verbs/reg_cache.h"

#include <unistd.h>

#include <cstring>

#include "common/check.h"

namespace gflow::transport::verbs {
namespace {

uintptr_t pageSize() {
  static const uintptr_t p = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return p;
}

constexpr int kWritable = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

}  // namespace

RegCache::Ref& RegCache::Ref::operator=(Ref&& o) noexcept {
  if (this != &o) {
    reset();
    cache_ = o.cache_;
    entry_ = o.entry_;
    o.entry_ = nullptr;
  }
  return *this;
}

void RegCache::Ref::reset() {
  if (entry_) cache_->release(entry_);
  entry_ = nullptr;
}

RegCache::RegCache(std::shared_ptr<Device> device, uint64_t limitBytes, int rank)
    : device_(std::move(device)), limit_(limitBytes), rank_(rank) {}

RegCache::~RegCache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : entries_) {
    if (kv.second->mr) unpinMr(device_->api(), kv.second->mr, kv.second->end - kv.second->start);
  }
  entries_.clear();
}

RegCache::Entry* RegCache::findLocked(uintptr_t s, uintptr_t e, bool writable) {
  // Entries starting at or before s; explicit ones first (they never go).
  Entry* best = nullptr;
  for (auto it = entries_.upper_bound(s); it != entries_.begin();) {
    --it;
    Entry* en = it->second.get();
    if (en->start <= s && e <= en->end && !en->removed && (en->writable || !writable)) {
      if (en->explicitEntry) return en;
      if (!best) best = en;
    }
  }
  return best;
}

RegCache::Entry* RegCache::registerLocked(uintptr_t s, uintptr_t e, bool explicitEntry,
                                          bool writable) {
  const uintptr_t ps = pageSize();
  const uintptr_t as = s & ~(ps - 1);
  const uintptr_t ae = (e + ps - 1) & ~(ps - 1);
  const uint64_t bytes = ae - as;
  if (!explicitEntry && tempBytes_ + bytes > limit_) {
    for (auto it = entries_.begin(); it != entries_.end() && tempBytes_ + bytes > limit_;) {
      auto next = std::next(it);
      if (!it->second->explicitEntry && it->second->refs == 0) dropLocked(it);
      it = next;
    }
  }
  ibv_mr* mr = pinMr(device_->api(), device_->pd(), reinterpret_cast<void*>(as), bytes,
                     writable ? kWritable : 0);
  if (!mr && explicitEntry && (errno == EFAULT || errno == EACCES)) {
    // Read-only memory (constants, a PROT_READ mapping): usable for sends.
    mr = pinMr(device_->api(), device_->pd(), reinterpret_cast<void*>(as), bytes, 0);
    writable = false;
  }
  if (!mr) {
    const int err = errno;
    GFLOW_THROW(kInternal, ErrorContext().withRank(rank_))
        << "ibv_reg_mr of " << bytes << " bytes at " << reinterpret_cast<void*>(as) << " on "
        << device_->name() << " failed: " << std::strerror(err)
        << (err == ENOMEM || err == EPERM || err == EFAULT
                ? " (is the locked-memory limit high enough? ulimit -l unlimited)"
                : "");
  }
  ++counters_.registrations;
  auto en = std::make_unique<Entry>();
  en->mr = mr;
  en->lkey = mr->lkey;
  en->rkey = mr->rkey;
  en->writable = writable;
  en->start = as;
  en->end = ae;
  en->explicitEntry = explicitEntry;
  en->id = nextId_++;
  if (!explicitEntry) tempBytes_ += bytes;
  Entry* raw = en.get();
  entries_.emplace(as, std::move(en));
  return raw;
}

void RegCache::dropLocked(std::multimap<uintptr_t, std::unique_ptr<Entry>>::iterator it) {
  Entry* en = it->second.get();
  if (en->mr) unpinMr(device_->api(), en->mr, en->end - en->start);
  ++counters_.deregistrations;
  if (!en->explicitEntry) tempBytes_ -= en->end - en->start;
  entries_.erase(it);
}

RegCache::Ref RegCache::acquire(const void* p, size_t n, bool writable) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(p);
  const uintptr_t e = s + (n ? n : 1);
  std::lock_guard<std::mutex> lock(mu_);
  Entry* en = findLocked(s, e, writable);
  if (en) {
    ++counters_.hits;
  } else {
    en = registerLocked(s, e, false, writable);
  }
  ++en->refs;
  return Ref(this, en);
}

void RegCache::release(Entry* e) {
  std::lock_guard<std::mutex> lock(mu_);
  --e->refs;
  if (e->removed && e->refs == 0) {
    // Its owner dropped it while a transfer used it: deregister now.
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.get() == e) {
        dropLocked(it);
        break;
      }
    }
  }
}

uint64_t RegCache::addExplicit(const void* p, size_t n) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  return registerLocked(s, s + (n ? n : 1), true, true)->id;
}

void RegCache::removeExplicit(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    Entry* en = it->second.get();
    if (en->id != id) continue;
    if (en->refs > 0) {
      // A transfer still uses it: hidden from new transfers now,
      // deregistered when the last one finishes (release()).
      en->removed = true;
    } else {
      dropLocked(it);
    }
    return;
  }
}

void RegCache::endOp() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (!it->second->explicitEntry && it->second->refs == 0) dropLocked(it);
    it = next;
  }
}

RegCache::Counters RegCache::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace gflow::transport::verbs
