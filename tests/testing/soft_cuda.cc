// The software CUDA (soft_cuda.h): state, streams, events and the table.
//
// Simplified against real CUDA:
// - One host address space: device memory is host memory and kernels run
//   on the stream's worker thread; there is no peer access to enable and no
//   context: the sticky asynchronous error is per stream, not per process.
// - Streams are all non-blocking; the per-device default stream (the null
//   stream) does not synchronize with the others (no legacy semantics).
// - streamDestroy returns at once; the stream's worker finishes the work
//   already enqueued and is joined later (uninstall, or a later destroy).
// - No event timing, no events/streams flags, no graph capture.
#include "testing/soft_cuda.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cuda/plugin.h"
#include "kernels/sparse.h"
#include "testing/soft_nccl.h"

namespace gflow::testing::softcuda {
namespace {

using gflow::kernels::cuda::ChunkedResidual;
using gflow::kernels::cuda::CopySegment;
using gflow::kernels::cuda::PickedChunks;
using gflow::kernels::cuda::Scratch;
using gflow::kernels::cuda::WireFormat;

// A stream: FIFO work on its own worker thread.
struct Stream {
  int device = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;  // guarded by mu
  uint64_t enqueued = 0;                    // guarded by mu
  uint64_t completed = 0;                   // guarded by mu
  int error = 0;                            // sticky asynchronous error; guarded by mu
  bool stopping = false;                    // guarded by mu
  std::atomic<bool> exited{false};
  std::thread worker;

  explicit Stream(int d) : device(d) {
    worker = std::thread([this] { run(); });
  }

  void run() {
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      cv.wait(l, [this] { return stopping || !queue.empty(); });
      if (queue.empty()) break;
      std::function<void()> f = std::move(queue.front());
      queue.pop_front();
      l.unlock();
      f();
      f = nullptr;
      l.lock();
      ++completed;
      cv.notify_all();
    }
    exited.store(true);
  }
  void push(std::function<void()> f) {
    std::lock_guard<std::mutex> l(mu);
    queue.push_back(std::move(f));
    ++enqueued;
    cv.notify_all();
  }
  uint64_t mark() {
    std::lock_guard<std::mutex> l(mu);
    return enqueued;
  }
  void waitFor(uint64_t target) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return completed >= target; });
  }
  // 0 / the sticky error once work up to `target` finished, else kNotReady.
  int query(uint64_t target) {
    std::lock_guard<std::mutex> l(mu);
    return completed >= target ? error : kNotReady;
  }
  int stickyError() {
    std::lock_guard<std::mutex> l(mu);
    return error;
  }
  void fault(int e) {
    std::lock_guard<std::mutex> l(mu);
    if (error == 0) error = e;
  }
  void stop() {
    std::lock_guard<std::mutex> l(mu);
    stopping = true;
    cv.notify_all();
  }
};

struct Event {
  int device = 0;
  std::shared_ptr<Stream> stream;  // null: never recorded
  uint64_t target = 0;
};

struct Alloc {
  size_t bytes = 0;
  int device = -1;  // -1: hostAlloc memory
};

struct State {
  std::mutex mu;
  int devices = 0;  // guarded by mu, like everything below but the atomics
  bool installed = false;
  std::map<uintptr_t, Alloc> allocs;  // by first byte
  std::map<void*, std::shared_ptr<Stream>> streams;
  std::vector<std::shared_ptr<Stream>> defaults;  // per device, made on first use
  std::vector<std::shared_ptr<Stream>> retired;   // destroyed, worker not joined yet
  std::map<void*, std::unique_ptr<Event>> events;
  std::set<void*> dead;  // destroyed stream and event handles (until reused)
  std::atomic<uint64_t> staleUses{0};
  std::map<std::string, std::deque<int>> failures;
  std::map<std::string, uint64_t> calls;  // by entry
  std::atomic<uint64_t> generation{0};
  std::atomic<uint64_t> kernelLaunches{0}, memcpys{0}, hostAllocs{0}, bytesCopied{0},
      asyncErrors{0};
};

// Never destroyed: workers may still run while the process exits.
State& st() {
  static State* s = new State;
  return *s;
}

struct TlsDevice {
  uint64_t generation = 0;
  int device = 0;
};
thread_local TlsDevice tlsDevice;

int curDevice() {
  return tlsDevice.generation == st().generation.load() ? tlsDevice.device : 0;
}

int injected(const char* entry) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  ++s.calls[entry];
  auto it = s.failures.find(entry);
  if (it == s.failures.end() || it->second.empty()) return 0;
  const int code = it->second.front();
  it->second.pop_front();
  return code;
}

// The allocation holding [p, p + bytes), or nullptr. Under s.mu.
const Alloc* findLocked(const void* p, size_t bytes) {
  State& s = st();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = s.allocs.upper_bound(a);
  if (it == s.allocs.begin()) return nullptr;
  --it;
  const size_t size = std::max<size_t>(it->second.bytes, 1);
  if (a - it->first >= size || bytes > it->second.bytes - (a - it->first)) return nullptr;
  return &it->second;
}

// What an entry answers for a handle it does not know: kInvalidHandle,
// counting it in staleHandleUses() when the handle was destroyed (real CUDA
// may crash on those). Under s.mu.
int unknownHandleLocked(void* h) {
  State& s = st();
  if (s.dead.count(h)) s.staleUses.fetch_add(1);
  return kInvalidHandle;
}

// nullptr: default stream of `device`. Null for an unknown stream (a
// destroyed one counted, unknownHandleLocked). Under s.mu.
std::shared_ptr<Stream> resolveLocked(void* stream, int device) {
  State& s = st();
  if (stream == nullptr) {
    if (device < 0 || device >= s.devices) return nullptr;
    if (s.defaults.size() < static_cast<size_t>(s.devices)) s.defaults.resize(s.devices);
    if (!s.defaults[device]) s.defaults[device] = std::make_shared<Stream>(device);
    return s.defaults[device];
  }
  auto it = s.streams.find(stream);
  if (it != s.streams.end()) return it->second;
  unknownHandleLocked(stream);
  return nullptr;
}

std::shared_ptr<Stream> resolve(void* stream) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  return resolveLocked(stream, curDevice());
}

// A kernel launch: the injected failure, the stream (of the current device),
// the pointers (device memory of the stream's device), then the work.
class Launch {
 public:
  explicit Launch(const char* entry) : error_(injected(entry)) {}
  int error() const { return error_; }

  Launch& on(void* stream) {
    if (error_) return *this;
    State& s = st();
    std::lock_guard<std::mutex> l(s.mu);
    const int dev = curDevice();
    stream_ = resolveLocked(stream, dev);
    if (!stream_ || stream_->device != dev) error_ = kInvalidHandle;
    return *this;
  }
  // `p` must be device memory of the stream's device for `bytes` bytes.
  Launch& dev(const void* p, size_t bytes) {
    if (error_ || bytes == 0) return *this;
    State& s = st();
    std::lock_guard<std::mutex> l(s.mu);
    const Alloc* a = p ? findLocked(p, bytes) : nullptr;
    if (!a || a->device != stream_->device) error_ = kInvalidValue;
    return *this;
  }
  int submit(std::function<void()> work) {
    if (error_) return error_;
    st().kernelLaunches.fetch_add(1);
    stream_->push(std::move(work));
    return 0;
  }
  Stream* stream() const { return stream_.get(); }

 private:
  int error_;
  std::shared_ptr<Stream> stream_;
};

// Reaps destroyed streams whose worker has finished. Under s.mu.
void reapLocked() {
  auto& r = st().retired;
  for (auto it = r.begin(); it != r.end();) {
    if ((*it)->exited.load()) {
      (*it)->worker.join();
      it = r.erase(it);
    } else {
      ++it;
    }
  }
}

// --- The table's entries. ---

const char* errorString(int err) {
  switch (err) {
    case 0: return "no error";
    case kInvalidValue: return "soft CUDA: invalid argument";
    case kMemoryAllocation: return "soft CUDA: out of memory";
    case kInvalidDevice: return "soft CUDA: invalid device ordinal";
    case kInvalidHandle: return "soft CUDA: invalid resource handle";
    case kNotReady: return "soft CUDA: device not ready";
    case kIllegalAddress: return "soft CUDA: an illegal memory access was encountered";
    default: return "soft CUDA: unknown error";
  }
}

int deviceCount(int* n) {
  if (int e = injected("deviceCount")) return e;
  if (!n) return kInvalidValue;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  *n = s.devices;
  return 0;
}

int pointerDevice(const void* p, int* device) {
  if (int e = injected("pointerDevice")) return e;
  if (!device) return kInvalidValue;
  *device = deviceOf(p, 0);
  return 0;
}

int getDevice(int* device) {
  if (int e = injected("getDevice")) return e;
  if (!device) return kInvalidValue;
  *device = curDevice();
  return 0;
}

int setDevice(int device) {
  if (int e = injected("setDevice")) return e;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (device < 0 || device >= s.devices) return kInvalidDevice;
  tlsDevice.generation = s.generation.load();
  tlsDevice.device = device;
  return 0;
}

int streamCreate(void** stream) {
  if (int e = injected("streamCreate")) return e;
  if (!stream) return kInvalidValue;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  const int dev = curDevice();
  if (dev >= s.devices) return kInvalidDevice;
  auto str = std::make_shared<Stream>(dev);
  *stream = str.get();
  s.dead.erase(*stream);
  s.streams.emplace(str.get(), std::move(str));
  return 0;
}

int streamDestroy(void* stream) {
  if (int e = injected("streamDestroy")) return e;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.streams.find(stream);
  if (it == s.streams.end()) return unknownHandleLocked(stream);
  it->second->stop();
  s.dead.insert(stream);
  s.retired.push_back(std::move(it->second));
  s.streams.erase(it);
  reapLocked();
  return 0;
}

int streamSynchronize(void* stream) {
  if (int e = injected("streamSynchronize")) return e;
  std::shared_ptr<Stream> str = resolve(stream);
  if (!str) return kInvalidHandle;
  str->waitFor(str->mark());
  return str->stickyError();
}

int eventCreate(void** event) {
  if (int e = injected("eventCreate")) return e;
  if (!event) return kInvalidValue;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  auto ev = std::make_unique<Event>();
  ev->device = curDevice();
  *event = ev.get();
  s.dead.erase(*event);
  s.events.emplace(ev.get(), std::move(ev));
  return 0;
}

int eventDestroy(void* event) {
  if (int e = injected("eventDestroy")) return e;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (!s.events.erase(event)) return unknownHandleLocked(event);
  s.dead.insert(event);
  return 0;
}

int eventRecord(void* event, void* stream) {
  if (int e = injected("eventRecord")) return e;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.events.find(event);
  if (it == s.events.end()) return unknownHandleLocked(event);
  std::shared_ptr<Stream> str = resolveLocked(stream, curDevice());
  if (!str || str->device != it->second->device) return kInvalidHandle;
  it->second->target = str->mark();
  it->second->stream = std::move(str);
  return 0;
}

int streamWaitEvent(void* stream, void* event) {
  if (int e = injected("streamWaitEvent")) return e;
  State& s = st();
  std::shared_ptr<Stream> str, waited;
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> l(s.mu);
    auto it = s.events.find(event);
    if (it == s.events.end()) return unknownHandleLocked(event);
    str = resolveLocked(stream, curDevice());
    if (!str) return kInvalidHandle;
    waited = it->second->stream;
    target = it->second->target;
  }
  if (!waited) return 0;  // never recorded: nothing to wait for
  // Ordered with the stream's other work, so the push stays under no lock.
  str->push([waited, target] { waited->waitFor(target); });
  return 0;
}

// The stream and mark an event captured (a null stream: never recorded);
// kInvalidHandle for an unknown event.
int captured(void* event, std::shared_ptr<Stream>* str, uint64_t* target) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.events.find(event);
  if (it == s.events.end()) return unknownHandleLocked(event);
  *str = it->second->stream;
  *target = it->second->target;
  return 0;
}

int eventQuery(void* event) {
  if (int e = injected("eventQuery")) return e;
  std::shared_ptr<Stream> str;
  uint64_t target = 0;
  if (int e = captured(event, &str, &target)) return e;
  return str ? str->query(target) : 0;
}

int eventSynchronize(void* event) {
  if (int e = injected("eventSynchronize")) return e;
  std::shared_ptr<Stream> str;
  uint64_t target = 0;
  if (int e = captured(event, &str, &target)) return e;
  if (!str) return 0;
  str->waitFor(target);
  return str->query(target);
}

int memcpyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  if (int e = injected("memcpyAsync")) return e;
  std::shared_ptr<Stream> str = resolve(stream);
  if (!str) return kInvalidHandle;
  if (bytes > 0 && (!dst || !src)) return kInvalidValue;
  st().memcpys.fetch_add(1);
  str->push([dst, src, bytes] {
    if (bytes > 0) std::memmove(dst, src, bytes);
    st().bytesCopied.fetch_add(bytes);
  });
  return 0;
}

// Device memory of the current device (alloc() of the test API).
int deviceAlloc(void** p, size_t bytes) {
  if (int e = injected("deviceAlloc")) return e;
  if (!p) return kInvalidValue;
  *p = softcuda::alloc(curDevice(), bytes);
  return *p ? 0 : kMemoryAllocation;
}

int deviceFree(void* p) {
  if (int e = injected("deviceFree")) return e;
  return softcuda::free(p) ? 0 : kInvalidValue;
}

// A bus id per soft device, as cudaDeviceGetPCIBusId writes it.
int pciBusId(int device, char* out, int len) {
  if (int e = injected("pciBusId")) return e;
  if (device < 0 || device >= st().devices) return kInvalidDevice;
  std::snprintf(out, static_cast<size_t>(len), "0000:%02x:00.0", device + 0x10);
  return 0;
}

int hostAlloc(void** p, size_t bytes) {
  if (int e = injected("hostAlloc")) return e;
  if (!p) return kInvalidValue;
  const size_t size = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
  void* m = std::aligned_alloc(4096, size);
  if (!m) return kMemoryAllocation;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  s.allocs[reinterpret_cast<uintptr_t>(m)] = Alloc{bytes, -1};
  s.hostAllocs.fetch_add(1);
  *p = m;
  return 0;
}

int hostFree(void* p) {
  if (int e = injected("hostFree")) return e;
  if (!p) return 0;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.allocs.end() || it->second.device != -1) return kInvalidValue;
  s.allocs.erase(it);
  std::free(p);
  return 0;
}

// --- Kernels (contracts in kernels/cuda/kernels.h). ---

int batchedCopy(const CopySegment* segments, size_t n, void* scratch, void* stream) {
  Launch l("batchedCopy");
  if (l.error() || n == 0) return l.error();
  if (!segments) return kInvalidValue;
  l.on(stream).dev(scratch, n * sizeof(CopySegment));
  Stream* str = l.stream();
  return l.submit([segments, n, scratch, str] {
    // The table is read when the stream reaches the copy, not at the call.
    std::vector<CopySegment> table(segments, segments + n);
    std::memcpy(scratch, table.data(), n * sizeof(CopySegment));
    for (const CopySegment& seg : table) {
      if (seg.bytes == 0) continue;
      if (deviceOf(seg.src, seg.bytes) != str->device ||
          deviceOf(seg.dst, seg.bytes) != str->device) {
        st().asyncErrors.fetch_add(1);
        str->fault(kIllegalAddress);
        continue;
      }
      std::memmove(seg.dst, seg.src, seg.bytes);
      st().bytesCopied.fetch_add(seg.bytes);
    }
  });
}

bool isWire(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16 || isQuantized(t);
}

// Bytes of `wire` for `count` float32 values.
size_t wireBytes(DataType wire, size_t count) {
  return wireElements(wire, count) * dataTypeSize(wire);
}

int narrow(void* dst, const float* src, size_t count, WireFormat format, float* residual,
           void* stream) {
  const DataType wire = format.type;
  const float scale = format.scale;
  Launch l("narrow");
  if (l.error() || count == 0) return l.error();
  if (!isWire(wire) || (residual && !isQuantized(wire))) return kInvalidValue;
  l.on(stream).dev(dst, wireBytes(wire, count)).dev(src, count * sizeof(float));
  if (residual) l.dev(residual, count * sizeof(float));
  return l.submit([=] { kernels::narrow(dst, src, count, wire, scale, residual); });
}

int widen(float* dst, const void* src, size_t count, WireFormat format, void* stream) {
  const DataType wire = format.type;
  const float scale = format.scale;
  Launch l("widen");
  if (l.error() || count == 0) return l.error();
  if (!isWire(wire)) return kInvalidValue;
  l.on(stream).dev(dst, count * sizeof(float)).dev(src, wireBytes(wire, count));
  return l.submit([=] { kernels::widen(dst, src, count, wire, scale); });
}

int scale(float* data, size_t count, float k, void* stream) {
  Launch l("scale");
  if (l.error() || count == 0) return l.error();
  l.on(stream).dev(data, count * sizeof(float));
  return l.submit([=] {
    for (size_t i = 0; i < count; ++i) data[i] *= k;
  });
}

int flagNonFinite(const void* data, size_t count, DataType dtype, int* flag, void* stream) {
  Launch l("flagNonFinite");
  if (l.error() || count == 0) return l.error();
  if (dtype != DataType::kFloat32 && dtype != DataType::kFloat64 && !isWire(dtype)) return 0;
  l.on(stream).dev(data, count * dataTypeSize(dtype)).dev(flag, sizeof(int));
  return l.submit([=] {
    if (kernels::anyNonFinite(data, count, dtype)) *flag = 1;
  });
}

int accumulateChunkNorms(const ChunkedResidual& r, const float* g, float m, float* norms,
                         void* stream) {
  float* v = r.v;
  float* u = r.u;
  const size_t n = r.n, chunk = r.chunk;
  Launch l("accumulateChunkNorms");
  if (l.error() || n == 0) return l.error();
  if (chunk == 0) return kInvalidValue;
  const size_t chunks = kernels::numChunks(n, chunk);
  l.on(stream).dev(v, n * 4).dev(g, n * 4).dev(norms, chunks * 4);
  if (u) l.dev(u, n * 4);
  return l.submit([=] {
    for (size_t c = 0; c < chunks; ++c) {
      const size_t b = c * chunk, len = std::min(chunk, n - b);
      norms[c] = u ? kernels::accumulateMomentumL1(v + b, u + b, g + b, m, len)
                   : kernels::accumulateL1(v + b, g + b, len);
    }
  });
}

size_t topChunksTempBytes(size_t count) {
  return 4 * ((count * sizeof(uint32_t) + 255) / 256 * 256) + 256;
}

int topChunks(const float* norms, size_t count, size_t k, uint32_t* idx, Scratch scratch,
              void* stream) {
  void* temp = scratch.data;
  const size_t tempBytes = scratch.bytes;
  Launch l("topChunks");
  if (l.error()) return l.error();
  k = std::min(k, count);
  if (k == 0) return 0;
  if (tempBytes < topChunksTempBytes(count) || count > 0x7fffffffu) return kInvalidValue;
  l.on(stream).dev(norms, count * 4).dev(idx, k * 4).dev(temp, tempBytes);
  return l.submit([=] {
    const std::vector<size_t> top = kernels::topChunks(norms, count, k);
    for (size_t j = 0; j < k; ++j) idx[j] = static_cast<uint32_t>(top[j]);
  });
}

int gatherChunks(float* packed, const ChunkedResidual& r, PickedChunks picked, void* stream) {
  const float* v = r.v;
  const size_t n = r.n, chunk = r.chunk;
  const uint32_t* idx = picked.idx;
  const size_t k = picked.k;
  Launch l("gatherChunks");
  if (l.error() || k == 0) return l.error();
  l.on(stream).dev(packed, k * chunk * 4).dev(v, n * 4).dev(idx, k * 4);
  return l.submit([=] {
    for (size_t i = 0; i < k * chunk; ++i) {
      const size_t e = static_cast<size_t>(idx[i / chunk]) * chunk + i % chunk;
      packed[i] = e < n ? v[e] : 0.0f;
    }
  });
}

int scatterChunks(float* grad, const ChunkedResidual& r, const float* packed, PickedChunks picked,
                  void* stream) {
  float* v = r.v;
  float* u = r.u;
  const size_t n = r.n, chunk = r.chunk;
  const uint32_t* idx = picked.idx;
  const size_t k = picked.k;
  Launch l("scatterChunks");
  if (l.error()) return l.error();
  l.on(stream).dev(grad, n * 4);
  if (k > 0) {
    l.dev(v, n * 4).dev(packed, k * chunk * 4).dev(idx, k * 4);
    if (u) l.dev(u, n * 4);
  }
  return l.submit([=] {
    if (n > 0) std::memset(grad, 0, n * sizeof(float));
    for (size_t i = 0; i < k * chunk; ++i) {
      const size_t e = static_cast<size_t>(idx[i / chunk]) * chunk + i % chunk;
      if (e >= n) continue;
      grad[e] = packed[i];
      v[e] = 0.0f;
      if (u) u[e] = 0.0f;
    }
  });
}

const nccl::Api* ncclEntry(const char** why) {
  static const char* kNotEnabled = "soft CUDA: NCCL not enabled";
  if (int e = injected("nccl")) {
    thread_local std::string reason;
    reason = "soft CUDA: injected failure of the nccl entry (code " + std::to_string(e) + ")";
    if (why) *why = reason.c_str();
    return nullptr;
  }
  if (softnccl::enabled()) return softnccl::api();
  if (why) *why = kNotEnabled;
  return nullptr;
}

gflow::cuda::Plugin makeTable() {
  gflow::cuda::Plugin t;
  t.abi = gflow::cuda::kComponentAbi;
  t.errorString = errorString;
  t.deviceCount = deviceCount;
  t.pointerDevice = pointerDevice;
  t.getDevice = getDevice;
  t.setDevice = setDevice;
  t.streamCreate = streamCreate;
  t.streamDestroy = streamDestroy;
  t.streamSynchronize = streamSynchronize;
  t.eventCreate = eventCreate;
  t.eventDestroy = eventDestroy;
  t.eventRecord = eventRecord;
  t.streamWaitEvent = streamWaitEvent;
  t.eventQuery = eventQuery;
  t.eventSynchronize = eventSynchronize;
  t.memcpyAsync = memcpyAsync;
  t.deviceAlloc = deviceAlloc;
  t.deviceFree = deviceFree;
  t.pciBusId = pciBusId;
  t.hostAlloc = hostAlloc;
  t.hostFree = hostFree;
  t.batchedCopy = batchedCopy;
  t.narrow = narrow;
  t.widen = widen;
  t.scale = scale;
  t.flagNonFinite = flagNonFinite;
  t.accumulateChunkNorms = accumulateChunkNorms;
  t.topChunksTempBytes = topChunksTempBytes;
  t.topChunks = topChunks;
  t.gatherChunks = gatherChunks;
  t.scatterChunks = scatterChunks;
  t.nccl = ncclEntry;
  return t;
}

int countAllocs(bool device) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  return static_cast<int>(std::count_if(s.allocs.begin(), s.allocs.end(), [device](const auto& kv) {
    return (kv.second.device >= 0) == device;
  }));
}

}  // namespace

void install(int devices) {
  uninstall();
  State& s = st();
  {
    std::lock_guard<std::mutex> l(s.mu);
    s.devices = std::max(devices, 0);
    s.installed = true;
    s.generation.fetch_add(1);
    s.allocs.clear();
    s.events.clear();
    s.dead.clear();
    s.staleUses = 0;
    s.failures.clear();
    s.calls.clear();
    s.kernelLaunches = 0;
    s.memcpys = 0;
    s.hostAllocs = 0;
    s.bytesCopied = 0;
    s.asyncErrors = 0;
  }
  gflow::cuda::installPluginForTesting(plugin());
}

void uninstall() {
  State& s = st();
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (!s.installed) return;
  }
  softnccl::disable();  // no stream stays blocked in a collective
  std::vector<std::shared_ptr<Stream>> all;
  {
    std::lock_guard<std::mutex> l(s.mu);
    s.installed = false;
    s.devices = 0;  // later calls through a stale table fail instead of making workers
    for (auto& kv : s.streams) all.push_back(kv.second);
    for (auto& d : s.defaults)
      if (d) all.push_back(d);
    for (auto& r : s.retired) all.push_back(r);
    s.streams.clear();
    s.defaults.clear();
    s.retired.clear();
    s.events.clear();
  }
  for (auto& str : all) str->stop();  // each worker drains its queue first
  for (auto& str : all) str->worker.join();
  // Memory still allocated (device and pinned) goes with the soft GPUs.
  std::lock_guard<std::mutex> l(s.mu);
  for (auto& kv : s.allocs) std::free(reinterpret_cast<void*>(kv.first));
  s.allocs.clear();
  gflow::cuda::installPluginForTesting(nullptr);
}

const gflow::cuda::Plugin* plugin() {
  static const gflow::cuda::Plugin table = makeTable();
  return &table;
}

void* alloc(int device, size_t bytes) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (device < 0 || device >= s.devices) return nullptr;
  void* m = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (m) s.allocs[reinterpret_cast<uintptr_t>(m)] = Alloc{bytes, device};
  return m;
}

bool free(void* p) {
  if (!p) return true;
  State& s = st();
  // Like cudaFree, which synchronizes implicitly: work already enqueued on
  // the allocation's device (that may still read it) runs first.
  std::vector<std::shared_ptr<Stream>> busy;
  {
    std::lock_guard<std::mutex> l(s.mu);
    auto it = s.allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == s.allocs.end() || it->second.device < 0) return false;
    const int device = it->second.device;
    for (auto& [key, str] : s.streams) {
      if (str->device == device) busy.push_back(str);
    }
    if (device < static_cast<int>(s.defaults.size()) && s.defaults[device]) {
      busy.push_back(s.defaults[device]);
    }
  }
  for (auto& str : busy) str->waitFor(str->mark());
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.allocs.end()) return false;
  s.allocs.erase(it);
  std::free(p);
  return true;
}

void failNextCall(const char* entry, int code) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  s.failures[entry].push_back(code);
}

int streamsAlive() {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  return static_cast<int>(s.streams.size());
}

uint64_t kernelLaunches() {
  return st().kernelLaunches.load();
}
int eventsAlive() {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  return static_cast<int>(s.events.size());
}
uint64_t calls(const char* entry) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.calls.find(entry);
  return it == s.calls.end() ? 0 : it->second;
}
uint64_t memcpys() {
  return st().memcpys.load();
}
uint64_t hostAllocs() {
  return st().hostAllocs.load();
}
uint64_t bytesCopied() {
  return st().bytesCopied.load();
}
uint64_t asyncErrors() {
  return st().asyncErrors.load();
}
uint64_t staleHandleUses() {
  return st().staleUses.load();
}

int hostAllocsAlive() {
  return countAllocs(false);
}
int allocationsAlive() {
  return countAllocs(true);
}

int currentDevice() {
  return curDevice();
}

int deviceOf(const void* p, size_t bytes) {
  if (!p) return -1;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  const Alloc* a = findLocked(p, bytes);
  return a ? a->device : -1;
}

int enqueue(int device, void* stream, std::function<void()> work) {
  std::shared_ptr<Stream> str;
  {
    State& s = st();
    std::lock_guard<std::mutex> l(s.mu);
    str = resolveLocked(stream, device);
  }
  if (!str || str->device != device) return kInvalidHandle;
  str->push(std::move(work));
  return 0;
}

}  // namespace gflow::testing::softcuda
