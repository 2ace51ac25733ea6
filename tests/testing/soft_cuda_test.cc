// The software CUDA and NCCL (tests/testing/soft_cuda.h, soft_nccl.h), driven
// through their tables as gflow drives the real ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cuda/plugin.h"
#include "kernels/reduce.h"
#include "kernels/sparse.h"
#include "testing/soft_cuda.h"
#include "testing/soft_nccl.h"

namespace gflow::testing {
namespace {

namespace sc = softcuda;
namespace sn = softnccl;
using gflow::cuda::Plugin;
using gflow::kernels::cuda::CopySegment;
using gflow::nccl::Api;
using Bytes = std::vector<unsigned char>;
using namespace std::chrono_literals;

// Holds a stream until released (the fixture releases every gate before
// uninstalling, so a failed check never leaves a worker blocked).
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [this] { return open; });
  }
  void release() {
    std::lock_guard<std::mutex> l(mu);
    open = true;
    cv.notify_all();
  }
};

// Polls until pred() or 2 s have passed.
bool eventually(const std::function<bool()>& pred) {
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

class SoftCuda : public ::testing::Test {
 protected:
  void SetUp() override { install(2); }
  void TearDown() override {
    for (auto& g : gates_) g->release();
    sc::uninstall();
  }
  void install(int devices) {
    sc::install(devices);
    std::string why;
    p = gflow::cuda::load(&why);
    ASSERT_EQ(p, sc::plugin()) << why;
  }
  std::shared_ptr<Gate> gate(int device, void* stream) {
    auto g = std::make_shared<Gate>();
    gates_.push_back(g);
    EXPECT_EQ(sc::enqueue(device, stream, [g] { g->wait(); }), 0);
    return g;
  }
  const Plugin* p = nullptr;

 private:
  std::vector<std::shared_ptr<Gate>> gates_;
};

TEST_F(SoftCuda, StreamRunsInFifoOrderAndSynchronizes) {
  void* s = nullptr;
  ASSERT_EQ(p->streamCreate(&s), 0);
  EXPECT_EQ(sc::streamsAlive(), 1);
  std::vector<int> order;
  for (int i = 0; i < 100; ++i)
    ASSERT_EQ(sc::enqueue(0, s, [&order, i] { order.push_back(i); }), 0);
  EXPECT_EQ(p->streamSynchronize(s), 0);
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);

  // memcpyAsync host -> device -> pinned host, in order on the stream.
  std::vector<int> src(256);
  for (int i = 0; i < 256; ++i) src[i] = i * 7;
  void* dev = sc::alloc(0, 1024);
  void* pinned = nullptr;
  ASSERT_EQ(p->hostAlloc(&pinned, 1024), 0);
  ASSERT_EQ(p->memcpyAsync(dev, src.data(), 1024, s), 0);
  ASSERT_EQ(p->memcpyAsync(pinned, dev, 1024, s), 0);
  EXPECT_EQ(p->streamSynchronize(s), 0);
  EXPECT_EQ(std::memcmp(pinned, src.data(), 1024), 0);
  EXPECT_EQ(sc::memcpys(), 2u);
  EXPECT_EQ(sc::bytesCopied(), 2048u);
  EXPECT_EQ(sc::hostAllocs(), 1u);
  EXPECT_EQ(sc::hostAllocsAlive(), 1);
  EXPECT_EQ(p->hostFree(pinned), 0);
  EXPECT_EQ(sc::hostAllocsAlive(), 0);
  EXPECT_TRUE(sc::free(dev));

  // The null stream is the current device's default stream.
  int value = 0;
  ASSERT_EQ(sc::enqueue(0, nullptr, [&value] { value = 5; }), 0);
  EXPECT_EQ(p->streamSynchronize(nullptr), 0);
  EXPECT_EQ(value, 5);
  EXPECT_EQ(sc::enqueue(1, s, [] {}), sc::kInvalidHandle);  // s is on device 0

  EXPECT_EQ(p->streamDestroy(s), 0);
  EXPECT_EQ(sc::streamsAlive(), 0);
  EXPECT_EQ(p->streamDestroy(s), sc::kInvalidHandle);
  EXPECT_EQ(p->streamSynchronize(s), sc::kInvalidHandle);
}

TEST_F(SoftCuda, EventsCaptureEarlierWorkAndStreamsWaitForThem) {
  void *s = nullptr, *s2 = nullptr, *ev = nullptr, *ev2 = nullptr, *late = nullptr;
  ASSERT_EQ(p->streamCreate(&s), 0);
  ASSERT_EQ(p->streamCreate(&s2), 0);
  ASSERT_EQ(p->eventCreate(&ev), 0);
  ASSERT_EQ(p->eventCreate(&ev2), 0);
  ASSERT_EQ(p->eventCreate(&late), 0);
  EXPECT_EQ(p->eventQuery(ev), 0);  // never recorded: done

  auto first = gate(0, s);
  int value = 0, seen = -1;
  ASSERT_EQ(sc::enqueue(0, s, [&value] { value = 42; }), 0);
  ASSERT_EQ(p->eventRecord(ev, s), 0);
  auto second = gate(0, s);  // after the record: not captured by ev
  ASSERT_EQ(p->eventRecord(late, s), 0);
  ASSERT_EQ(p->streamWaitEvent(s2, ev), 0);
  ASSERT_EQ(sc::enqueue(0, s2, [&] { seen = value; }), 0);
  ASSERT_EQ(p->eventRecord(ev2, s2), 0);

  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(p->eventQuery(ev), gflow::cuda::kNotReady);
  EXPECT_EQ(p->eventQuery(ev2), gflow::cuda::kNotReady);  // s2 waits for s
  first->release();
  EXPECT_EQ(p->streamSynchronize(s2), 0);  // does not need `second`
  EXPECT_EQ(seen, 42);
  EXPECT_EQ(p->eventQuery(ev), 0);
  EXPECT_EQ(p->eventQuery(ev2), 0);
  EXPECT_EQ(p->eventQuery(late), gflow::cuda::kNotReady);
  second->release();
  EXPECT_EQ(p->streamSynchronize(s), 0);
  EXPECT_EQ(p->eventQuery(late), 0);

  // Events belong to the device current at creation.
  ASSERT_EQ(p->setDevice(1), 0);
  void* s1 = nullptr;
  ASSERT_EQ(p->streamCreate(&s1), 0);
  EXPECT_EQ(p->eventRecord(ev, s1), sc::kInvalidHandle);
  EXPECT_EQ(p->streamWaitEvent(s1, ev), 0);  // across devices: fine
  EXPECT_EQ(p->streamSynchronize(s1), 0);
  ASSERT_EQ(p->setDevice(0), 0);
  for (void* e : {ev, ev2, late}) EXPECT_EQ(p->eventDestroy(e), 0);
  EXPECT_EQ(p->eventQuery(ev), sc::kInvalidHandle);
  for (void* x : {s, s2, s1}) EXPECT_EQ(p->streamDestroy(x), 0);
}

TEST_F(SoftCuda, EventSynchronizeWaitsAndStaleHandlesAreCounted) {
  void *s = nullptr, *ev = nullptr;
  ASSERT_EQ(p->streamCreate(&s), 0);
  ASSERT_EQ(p->eventCreate(&ev), 0);
  EXPECT_EQ(p->eventSynchronize(ev), 0);  // never recorded: done
  auto g = gate(0, s);
  int value = 0;
  ASSERT_EQ(sc::enqueue(0, s, [&value] { value = 7; }), 0);
  ASSERT_EQ(p->eventRecord(ev, s), 0);
  std::thread opener([g] {
    std::this_thread::sleep_for(20ms);
    g->release();
  });
  EXPECT_EQ(p->eventSynchronize(ev), 0);  // returns once the gate opened
  EXPECT_EQ(value, 7);
  opener.join();

  // The stream dies before its event: the event still answers.
  auto g2 = gate(0, s);
  ASSERT_EQ(p->eventRecord(ev, s), 0);
  EXPECT_EQ(p->streamDestroy(s), 0);
  EXPECT_EQ(p->eventQuery(ev), gflow::cuda::kNotReady);
  g2->release();
  EXPECT_EQ(p->eventSynchronize(ev), 0);
  EXPECT_EQ(sc::staleHandleUses(), 0u);

  // Naming the dead stream, or the event once destroyed, counts; a handle
  // that never existed does not.
  EXPECT_EQ(p->streamSynchronize(s), sc::kInvalidHandle);
  EXPECT_EQ(sc::staleHandleUses(), 1u);
  EXPECT_EQ(p->eventDestroy(ev), 0);
  EXPECT_EQ(p->eventSynchronize(ev), sc::kInvalidHandle);
  EXPECT_EQ(p->eventRecord(ev, nullptr), sc::kInvalidHandle);
  EXPECT_EQ(sc::staleHandleUses(), 3u);
  int never = 0;
  EXPECT_EQ(p->streamSynchronize(&never), sc::kInvalidHandle);
  EXPECT_EQ(sc::staleHandleUses(), 3u);
  // install() starts the count afresh.
  sc::install(2);
  EXPECT_EQ(sc::staleHandleUses(), 0u);
}

TEST_F(SoftCuda, PointerDeviceAndCurrentDevice) {
  int n = 0;
  ASSERT_EQ(p->deviceCount(&n), 0);
  EXPECT_EQ(n, 2);
  char* d1 = static_cast<char*>(sc::alloc(1, 1000));
  ASSERT_NE(d1, nullptr);
  EXPECT_EQ(sc::alloc(2, 8), nullptr);
  int dev = -2;
  EXPECT_EQ(p->pointerDevice(d1 + 999, &dev), 0);
  EXPECT_EQ(dev, 1);
  int onStack = 0;
  EXPECT_EQ(p->pointerDevice(&onStack, &dev), 0);
  EXPECT_EQ(dev, -1);
  void* pinned = nullptr;
  ASSERT_EQ(p->hostAlloc(&pinned, 64), 0);
  EXPECT_EQ(p->pointerDevice(pinned, &dev), 0);
  EXPECT_EQ(dev, -1);
  EXPECT_EQ(sc::allocationsAlive(), 1);
  EXPECT_FALSE(sc::free(pinned));
  EXPECT_EQ(p->hostFree(pinned), 0);
  EXPECT_TRUE(sc::free(d1));
  EXPECT_EQ(p->pointerDevice(d1, &dev), 0);
  EXPECT_EQ(dev, -1);
  EXPECT_EQ(sc::allocationsAlive(), 0);

  // The current device is per thread; out of range is cudaErrorInvalidDevice.
  EXPECT_EQ(p->setDevice(2), sc::kInvalidDevice);
  ASSERT_EQ(p->setDevice(1), 0);
  std::thread([this] {
    int d = -1;
    EXPECT_EQ(p->getDevice(&d), 0);
    EXPECT_EQ(d, 0);
  }).join();
  ASSERT_EQ(p->getDevice(&dev), 0);
  EXPECT_EQ(dev, 1);
  EXPECT_STRNE(p->errorString(sc::kInvalidDevice), p->errorString(0));
}

TEST_F(SoftCuda, KernelsRejectHostPointersAndMatchTheCpuTwins) {
  constexpr size_t n = 300;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = 0.37f * static_cast<float>(i) - 50.0f;
  auto* src = static_cast<float*>(sc::alloc(0, n * 4));
  auto* half = sc::alloc(0, n * 2);
  auto* back = static_cast<float*>(sc::alloc(0, n * 4));
  auto* other = sc::alloc(1, n * 2);
  void* pinned = nullptr;
  ASSERT_EQ(p->hostAlloc(&pinned, n * 4), 0);
  const DataType bf = DataType::kBFloat16;
  EXPECT_EQ(p->narrow(half, host.data(), n, {bf, 1.0f}, nullptr, nullptr), sc::kInvalidValue);
  EXPECT_EQ(p->narrow(half, static_cast<float*>(pinned), n, {bf, 1.0f}, nullptr, nullptr),
            sc::kInvalidValue);
  EXPECT_EQ(p->narrow(other, src, n, {bf, 1.0f}, nullptr, nullptr), sc::kInvalidValue);  // device 1
  EXPECT_EQ(p->narrow(half, src, n + 1, {bf, 1.0f}, nullptr, nullptr),
            sc::kInvalidValue);  // too short
  EXPECT_EQ(p->narrow(half, src, n, {DataType::kFloat32, 1.0f}, nullptr, nullptr),
            sc::kInvalidValue);
  EXPECT_EQ(sc::kernelLaunches(), 0u);
  void* s0 = nullptr;
  ASSERT_EQ(p->streamCreate(&s0), 0);
  ASSERT_EQ(p->setDevice(1), 0);  // a kernel on a stream of another device fails
  EXPECT_EQ(p->narrow(half, src, n, {bf, 1.0f}, nullptr, s0), sc::kInvalidHandle);
  ASSERT_EQ(p->setDevice(0), 0);

  for (DataType wire : {DataType::kFloat16, bf}) {
    ASSERT_EQ(p->memcpyAsync(src, host.data(), n * 4, s0), 0);
    ASSERT_EQ(p->narrow(half, src, n, {wire, 0.5f}, nullptr, s0), 0);
    ASSERT_EQ(p->widen(back, half, n, {wire, 2.0f}, s0), 0);
    ASSERT_EQ(p->streamSynchronize(s0), 0);
    std::vector<uint16_t> h(n);
    std::vector<float> w(n);
    kernels::narrow(h.data(), host.data(), n, wire, 0.5f);
    kernels::widen(w.data(), h.data(), n, wire, 2.0f);
    EXPECT_EQ(std::memcmp(half, h.data(), n * 2), 0);
    EXPECT_EQ(std::memcmp(back, w.data(), n * 4), 0);
  }
  auto* flag = static_cast<int*>(sc::alloc(0, sizeof(int)));
  *flag = 0;
  ASSERT_EQ(p->flagNonFinite(src, n, DataType::kFloat32, flag, s0), 0);
  ASSERT_EQ(p->streamSynchronize(s0), 0);
  EXPECT_EQ(*flag, 0);
  src[7] = std::nanf("");
  ASSERT_EQ(p->flagNonFinite(src, n, DataType::kFloat32, flag, s0), 0);
  ASSERT_EQ(p->streamSynchronize(s0), 0);
  EXPECT_EQ(*flag, 1);
  EXPECT_EQ(p->flagNonFinite(src, n, DataType::kFloat32, reinterpret_cast<int*>(pinned), s0),
            sc::kInvalidValue);
  // The float32 scale: in place, on device memory only.
  EXPECT_EQ(p->scale(host.data(), n, 3.0f, s0), sc::kInvalidValue);
  EXPECT_EQ(p->scale(back, n + 1, 3.0f, s0), sc::kInvalidValue);  // too short
  ASSERT_EQ(p->memcpyAsync(back, host.data(), n * 4, s0), 0);
  ASSERT_EQ(p->scale(back, n, 0.3f, s0), 0);
  ASSERT_EQ(p->streamSynchronize(s0), 0);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], host[i] * 0.3f) << i;
  EXPECT_EQ(sc::kernelLaunches(), 7u);
  EXPECT_EQ(p->hostFree(pinned), 0);
  EXPECT_EQ(p->streamDestroy(s0), 0);
  for (void* x :
       {static_cast<void*>(src), half, static_cast<void*>(back), other, static_cast<void*>(flag)})
    EXPECT_TRUE(sc::free(x));
}

TEST_F(SoftCuda, BatchedCopyReadsItsTableWhenTheStreamGetsThere) {
  void* s = nullptr;
  ASSERT_EQ(p->streamCreate(&s), 0);
  auto* a = static_cast<char*>(sc::alloc(0, 64));
  auto* b = static_cast<char*>(sc::alloc(0, 64));
  auto* scratch = sc::alloc(0, 3 * sizeof(CopySegment));
  void* pinned = nullptr;
  ASSERT_EQ(p->hostAlloc(&pinned, 3 * sizeof(CopySegment)), 0);
  auto* segs = static_cast<CopySegment*>(pinned);
  for (int i = 0; i < 64; ++i) a[i] = static_cast<char>(i + 1);
  std::memset(b, 0, 64);
  segs[0] = {a, b + 32, 16};
  segs[1] = {a + 16, b, 8};
  segs[2] = {a + 40, b + 50, 4};
  EXPECT_EQ(p->batchedCopy(segs, 3, sc::alloc(0, 8), s), sc::kInvalidValue);  // scratch too small
  EXPECT_EQ(p->batchedCopy(segs, 3, pinned, s), sc::kInvalidValue);           // host scratch
  auto g = gate(0, s);
  ASSERT_EQ(p->batchedCopy(segs, 3, scratch, s), 0);
  segs[2].bytes = 8;  // the copy has not started: it sees this
  g->release();
  ASSERT_EQ(p->streamSynchronize(s), 0);
  EXPECT_EQ(std::memcmp(b + 32, a, 16), 0);
  EXPECT_EQ(std::memcmp(b, a + 16, 8), 0);
  EXPECT_EQ(std::memcmp(b + 50, a + 40, 8), 0);
  EXPECT_EQ(std::memcmp(scratch, segs, 3 * sizeof(CopySegment)), 0);
  EXPECT_EQ(sc::bytesCopied(), 32u);

  // A host pointer inside a segment is an asynchronous, sticky fault.
  std::vector<char> hostBuf(16);
  segs[0] = {a, hostBuf.data(), 16};
  void *ev = nullptr, *s2 = nullptr;
  ASSERT_EQ(p->streamCreate(&s2), 0);
  ASSERT_EQ(p->eventCreate(&ev), 0);
  ASSERT_EQ(p->batchedCopy(segs, 1, scratch, s2), 0);
  ASSERT_EQ(p->eventRecord(ev, s2), 0);
  EXPECT_EQ(p->streamSynchronize(s2), sc::kIllegalAddress);
  EXPECT_EQ(p->eventQuery(ev), sc::kIllegalAddress);
  EXPECT_EQ(sc::asyncErrors(), 1u);
  EXPECT_EQ(hostBuf[0], 0);
  EXPECT_EQ(p->streamSynchronize(s), 0);  // other streams are unaffected
  EXPECT_EQ(p->hostFree(pinned), 0);
}

TEST_F(SoftCuda, SparseKernelsFollowTheContract) {
  constexpr size_t n = 1000, chunk = 64, chunks = (n + chunk - 1) / chunk, k = 5;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v0(n), u0(n), g0(n);
  for (size_t i = 0; i < n; ++i) v0[i] = dist(rng), u0[i] = dist(rng), g0[i] = dist(rng);
  auto dev = [](const std::vector<float>& h) {
    auto* d = static_cast<float*>(sc::alloc(0, h.size() * 4));
    std::memcpy(d, h.data(), h.size() * 4);
    return d;
  };
  float *v = dev(v0), *u = dev(u0), *g = dev(g0), *norms = dev(std::vector<float>(chunks));
  ASSERT_EQ(p->accumulateChunkNorms({v, u, n, chunk}, g, 0.9f, norms, nullptr), 0);
  ASSERT_EQ(p->streamSynchronize(nullptr), 0);
  std::vector<float> v1 = v0, u1 = u0, n1(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    const size_t b = c * chunk;
    n1[c] = kernels::accumulateMomentumL1(&v1[b], &u1[b], &g0[b], 0.9f, std::min(chunk, n - b));
  }
  EXPECT_EQ(std::memcmp(v, v1.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(u, u1.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(norms, n1.data(), chunks * 4), 0);
  norms[3] = std::nanf("");

  const size_t tempBytes = p->topChunksTempBytes(chunks);
  void* temp = sc::alloc(0, tempBytes);
  auto* idx = static_cast<uint32_t*>(sc::alloc(0, k * 4));
  EXPECT_EQ(p->topChunks(norms, chunks, k, idx, {temp, tempBytes - 1}, nullptr), sc::kInvalidValue);
  ASSERT_EQ(p->topChunks(norms, chunks, k, idx, {temp, tempBytes}, nullptr), 0);
  ASSERT_EQ(p->streamSynchronize(nullptr), 0);
  const std::vector<size_t> top = kernels::topChunks(norms, chunks, k);
  ASSERT_EQ(top.size(), k);
  for (size_t j = 0; j < k; ++j) EXPECT_EQ(idx[j], top[j]);
  EXPECT_EQ(idx[0] == 3 || idx[1] == 3 || idx[2] == 3 || idx[3] == 3 || idx[4] == 3, true);

  idx[k - 1] = chunks - 1;  // the short last chunk: zero past the end of v
  auto* packed = static_cast<float*>(sc::alloc(0, k * chunk * 4));
  ASSERT_EQ(p->gatherChunks(packed, {v, nullptr, n, chunk}, {idx, k}, nullptr), 0);
  auto* grad = static_cast<float*>(sc::alloc(0, n * 4));
  ASSERT_EQ(p->scatterChunks(grad, {v, u, n, chunk}, packed, {idx, k}, nullptr), 0);
  ASSERT_EQ(p->streamSynchronize(nullptr), 0);
  std::vector<bool> picked(n);
  for (size_t j = 0; j < k; ++j) {
    for (size_t t = 0; t < chunk; ++t) {
      const size_t e = idx[j] * chunk + t;
      EXPECT_EQ(packed[j * chunk + t], e < n ? v1[e] : 0.0f);
      if (e < n) picked[e] = true;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(grad[i], picked[i] ? v1[i] : 0.0f) << i;
    EXPECT_EQ(v[i], picked[i] ? 0.0f : v1[i]) << i;
    EXPECT_EQ(u[i], picked[i] ? 0.0f : u1[i]) << i;
  }
  std::vector<float> hostGrad(n);
  EXPECT_EQ(p->scatterChunks(hostGrad.data(), {v, u, n, chunk}, packed, {idx, k}, nullptr),
            sc::kInvalidValue);
}

TEST_F(SoftCuda, FailNextCallAndTheNcclEntry) {
  void* s = nullptr;
  ASSERT_EQ(p->streamCreate(&s), 0);
  void* ev = nullptr;
  ASSERT_EQ(p->eventCreate(&ev), 0);
  sc::failNextCall("eventRecord", 719);
  sc::failNextCall("eventRecord", 2);
  EXPECT_EQ(p->eventRecord(ev, s), 719);
  EXPECT_EQ(p->eventRecord(ev, s), 2);
  EXPECT_EQ(p->eventRecord(ev, s), 0);
  sc::failNextCall("streamCreate", sc::kMemoryAllocation);
  void* s2 = nullptr;
  EXPECT_EQ(p->streamCreate(&s2), sc::kMemoryAllocation);
  EXPECT_EQ(sc::streamsAlive(), 1);

  const char* why = nullptr;
  EXPECT_EQ(p->nccl(&why), nullptr);
  EXPECT_STREQ(why, "soft CUDA: NCCL not enabled");
  sn::enable();
  EXPECT_EQ(p->nccl(&why), sn::api());
  EXPECT_EQ(sn::api()->version, sn::kVersion);
  sc::failNextCall("nccl", 3);
  EXPECT_EQ(p->nccl(&why), nullptr);
  EXPECT_NE(std::string(why).find("injected"), std::string::npos);
  sn::disable();
  EXPECT_EQ(p->nccl(&why), nullptr);
  EXPECT_EQ(p->eventDestroy(ev), 0);
  EXPECT_EQ(p->streamDestroy(s), 0);
}

// --- The software NCCL. ---

class SoftNccl : public SoftCuda {
 protected:
  void SetUp() override { start(3); }
  void start(int devices) {
    install(devices);
    sn::enable();
    const char* why = nullptr;
    a = p->nccl(&why);
    ASSERT_EQ(a, sn::api()) << (why ? why : "");
  }
  // Inits one comm per entry of `devices` (rank r on devices[r], each from its
  // own thread) and waits for them; `result` gets each rank's async result.
  std::vector<void*> init(const std::vector<int>& devices, std::vector<int>* result = nullptr) {
    const int n = static_cast<int>(devices.size());
    nccl::UniqueId id{};
    EXPECT_EQ(a->getUniqueId(&id), nccl::kSuccess);
    std::vector<void*> comms(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        EXPECT_EQ(p->setDevice(devices[r]), 0);
        EXPECT_EQ(a->commInitRank(&comms[r], n, &id, r), nccl::kInProgress);
      });
    }
    for (auto& t : threads) t.join();
    std::vector<int> res(n, nccl::kInProgress);
    for (int r = 0; r < n; ++r) {
      res[r] = settled(comms[r]);
      if (!result) {
        EXPECT_EQ(res[r], nccl::kSuccess) << a->getLastError(comms[r]);
      }
    }
    if (result) *result = res;
    return comms;
  }
  std::vector<void*> init(int n) {
    std::vector<int> devices(n);
    for (int r = 0; r < n; ++r) devices[r] = r;
    return init(devices);
  }
  // Runs call(rank, in, out, stream) for every rank (on its own thread and
  // device, with device buffers filled from inputs[r]) and returns the outputs.
  std::vector<Bytes> run(const std::vector<Bytes>& inputs, size_t outBytes,
                         const std::function<int(int, const void*, void*, void*)>& call,
                         bool inPlace = false) {
    const int n = static_cast<int>(inputs.size());
    std::vector<Bytes> outputs(n, Bytes(outBytes));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        EXPECT_EQ(p->setDevice(r), 0);
        void* s = nullptr;
        EXPECT_EQ(p->streamCreate(&s), 0);
        void* in = sc::alloc(r, std::max(inputs[r].size(), outBytes));
        void* out = inPlace ? in : sc::alloc(r, outBytes);
        EXPECT_EQ(p->memcpyAsync(in, inputs[r].data(), inputs[r].size(), s), 0);
        EXPECT_EQ(call(r, in, out, s), nccl::kSuccess) << a->getLastError(nullptr);
        EXPECT_EQ(p->memcpyAsync(outputs[r].data(), out, outBytes, s), 0);
        EXPECT_EQ(p->streamSynchronize(s), 0);
        EXPECT_EQ(p->streamDestroy(s), 0);
        sc::free(in);
        if (!inPlace) sc::free(out);
      });
    }
    for (auto& t : threads) t.join();
    return outputs;
  }
  // commGetAsyncError's answer once it is no longer kInProgress (2 s at most).
  int settled(void* comm) {
    int result = nccl::kInProgress;
    EXPECT_TRUE(eventually([&] {
      EXPECT_EQ(a->commGetAsyncError(comm, &result), nccl::kSuccess);
      return result != nccl::kInProgress;
    }));
    return result;
  }
  const Api* a = nullptr;
};

template <class T>
Bytes bytesOf(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
template <class T>
T at(const Bytes& b, size_t i) {
  T v;
  std::memcpy(&v, b.data() + i * sizeof(T), sizeof(T));
  return v;
}

TEST_F(SoftNccl, AllReduceFloat32SumAndAvg) {
  auto comms = init(3);
  constexpr size_t n = 1001;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> in(3, std::vector<float>(n));
  std::vector<Bytes> inputs;
  for (auto& v : in) {
    for (float& x : v) x = dist(rng);
    inputs.push_back(bytesOf(v));
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    auto out = run(
        inputs, n * 4,
        [&](int r, const void* i, void* o, void* s) {
          return a->allReduce({i, o, n, int(DataType::kFloat32), int(op), 0}, comms[r], s);
        },
        /*inPlace=*/op == ReduceOp::kAvg);
    for (size_t i = 0; i < n; ++i) {
      double ref = double(in[0][i]) + double(in[1][i]) + double(in[2][i]);
      if (op == ReduceOp::kAvg) ref /= 3;
      EXPECT_NEAR(at<float>(out[0], i), ref, 1e-6);
    }
    EXPECT_EQ(out[0], out[1]);
    EXPECT_EQ(out[0], out[2]);
  }
  EXPECT_EQ(sn::collectivesRun(), 6);
  EXPECT_EQ(sn::inits(), 3);
}

TEST_F(SoftNccl, AllReduceHalfTypesRoundOnce) {
  auto comms = init(3);
  constexpr size_t n = 500;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  struct Half {
    DataType t;
    float (*toFloat)(uint16_t);
    uint16_t (*fromFloat)(float);
    double tol;
  };
  for (const Half& h :
       {Half{DataType::kBFloat16, kernels::bfloat16ToFloat, kernels::floatToBfloat16, 1.0 / 128},
        Half{DataType::kFloat16, kernels::halfToFloat, kernels::floatToHalf, 1.0 / 1024}}) {
    std::vector<std::vector<uint16_t>> in(3, std::vector<uint16_t>(n));
    std::vector<Bytes> inputs;
    for (auto& v : in) {
      for (auto& x : v) x = h.fromFloat(dist(rng));
      inputs.push_back(bytesOf(v));
    }
    auto out = run(inputs, n * 2, [&](int r, const void* i, void* o, void* s) {
      return a->allReduce({i, o, n, int(h.t), int(ReduceOp::kSum), 0}, comms[r], s);
    });
    for (size_t i = 0; i < n; ++i) {
      const float acc = (h.toFloat(in[0][i]) + h.toFloat(in[1][i])) + h.toFloat(in[2][i]);
      EXPECT_EQ(at<uint16_t>(out[1], i), h.fromFloat(acc)) << i;  // rounded once
      const double ref =
          double(h.toFloat(in[0][i])) + h.toFloat(in[1][i]) + double(h.toFloat(in[2][i]));
      EXPECT_NEAR(h.toFloat(at<uint16_t>(out[1], i)), ref, std::fabs(ref) * h.tol + 1e-3);
    }
    EXPECT_EQ(out[0], out[1]);
    EXPECT_EQ(out[0], out[2]);
  }
}

TEST_F(SoftNccl, AllReduceInt64EveryOp) {
  auto comms = init(3);
  const std::vector<std::vector<int64_t>> in = {
      {-7, 5, 1LL << 40, 3, -1}, {2, -5, 3, 4, -1}, {1, 9, -2, -8, -1}};
  const size_t n = in[0].size();
  std::vector<Bytes> inputs;
  for (auto& v : in) inputs.push_back(bytesOf(v));
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd}) {
    auto out = run(
        inputs, n * 8,
        [&](int r, const void* i, void* o, void* s) {
          return a->allReduce({i, o, n, int(DataType::kInt64), int(op), 0}, comms[r], s);
        },
        /*inPlace=*/true);
    for (size_t i = 0; i < n; ++i) {
      const int64_t x = in[0][i], y = in[1][i], z = in[2][i];
      int64_t ref = 0;
      switch (op) {
        case ReduceOp::kSum: ref = x + y + z; break;
        case ReduceOp::kAvg: ref = (x + y + z) / 3; break;
        case ReduceOp::kMin: ref = std::min({x, y, z}); break;
        case ReduceOp::kMax: ref = std::max({x, y, z}); break;
        case ReduceOp::kProd: ref = x * y * z; break;
        case ReduceOp::kBand:
        case ReduceOp::kBor:
        case ReduceOp::kBxor: break;  // not NCCL ops
      }
      for (int r = 0; r < 3; ++r) EXPECT_EQ(at<int64_t>(out[r], i), ref) << toString(op) << i;
    }
  }
}

TEST_F(SoftNccl, ReduceScatterAllGatherBroadcast) {
  auto comms = init(3);
  constexpr size_t c = 4;
  std::vector<std::vector<float>> in(3, std::vector<float>(3 * c));
  std::vector<Bytes> inputs;
  for (int r = 0; r < 3; ++r) {
    for (size_t i = 0; i < 3 * c; ++i) in[r][i] = float(100 * r + i);
    inputs.push_back(bytesOf(in[r]));
  }
  auto rs = run(inputs, c * 4, [&](int r, const void* i, void* o, void* s) {
    return a->reduceScatter({i, o, c, int(DataType::kFloat32), int(ReduceOp::kSum), 0}, comms[r],
                            s);
  });
  for (int r = 0; r < 3; ++r)
    for (size_t i = 0; i < c; ++i)
      EXPECT_EQ(at<float>(rs[r], i), in[0][r * c + i] + in[1][r * c + i] + in[2][r * c + i]);
  auto ag = run(inputs, 3 * c * 4, [&](int r, const void* i, void* o, void* s) {
    return a->allGather({i, o, c, int(DataType::kFloat32), 0, 0}, comms[r], s);
  });
  for (int r = 0; r < 3; ++r)
    for (int q = 0; q < 3; ++q)
      for (size_t i = 0; i < c; ++i) EXPECT_EQ(at<float>(ag[r], q * c + i), in[q][i]);
  auto bc = run(inputs, c * 4, [&](int r, const void* i, void* o, void* s) {
    return a->broadcast({r == 1 ? i : nullptr, o, c, int(DataType::kFloat32), 0, 1}, comms[r], s);
  });
  for (int r = 0; r < 3; ++r)
    for (size_t i = 0; i < c; ++i) EXPECT_EQ(at<float>(bc[r], i), in[1][i]);
}

TEST_F(SoftNccl, ReduceWritesTheRootOnly) {
  auto comms = init(3);
  constexpr size_t c = 5;
  std::vector<std::vector<int32_t>> in(3, std::vector<int32_t>(c));
  std::vector<Bytes> inputs;
  for (int r = 0; r < 3; ++r) {
    for (size_t i = 0; i < c; ++i) in[r][i] = int32_t(10 * r - int(i));
    inputs.push_back(bytesOf(in[r]));
  }
  // Off the root, recvbuff is never checked: pass null there.
  auto out = run(inputs, c * 4, [&](int r, const void* i, void* o, void* s) {
    return a->reduce({i, r == 1 ? o : nullptr, c, int(DataType::kInt32), int(ReduceOp::kMax), 1},
                     comms[r], s);
  });
  for (size_t i = 0; i < c; ++i) EXPECT_EQ(at<int32_t>(out[1], i), in[2][i]);
  EXPECT_EQ(sn::collectivesRun(), 3);
}

// Each rank sends its input to its right neighbour as two messages and
// receives its left neighbour's two into its output, all in one group;
// odd ranks post their receives first. Between a pair, messages match in
// order.
TEST_F(SoftNccl, GroupedSendRecvMatchInOrderWhateverTheCallOrder) {
  auto comms = init(3);
  constexpr size_t n = 64, h = n / 2;
  std::vector<std::vector<float>> in(3, std::vector<float>(n));
  std::vector<Bytes> inputs;
  for (int r = 0; r < 3; ++r) {
    for (size_t i = 0; i < n; ++i) in[r][i] = float(1000 * r + i);
    inputs.push_back(bytesOf(in[r]));
  }
  const int f32 = int(DataType::kFloat32);
  auto out = run(inputs, n * 4, [&](int r, const void* i, void* o, void* s) {
    const int right = (r + 1) % 3, left = (r + 2) % 3;
    const float* src = static_cast<const float*>(i);
    float* dst = static_cast<float*>(o);
    int e = a->groupStart();
    auto sends = [&] {
      e |= a->send(src, h, f32, right, comms[r], s);
      e |= a->send(src + h, h, f32, right, comms[r], s);
    };
    auto recvs = [&] {
      e |= a->recv(dst, h, f32, left, comms[r], s);
      e |= a->recv(dst + h, h, f32, left, comms[r], s);
    };
    if (r % 2) {
      recvs();
      sends();
    } else {
      sends();
      recvs();
    }
    return e | a->groupEnd();
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[r], inputs[(r + 2) % 3]) << r;
  EXPECT_EQ(sn::collectivesRun(), 3);
}

TEST_F(SoftNccl, PointToPointArgumentErrorsFailTheGroup) {
  auto comms = init(2);
  void* buf = sc::alloc(0, 64);
  ASSERT_EQ(p->setDevice(0), 0);
  EXPECT_EQ(a->groupStart(), nccl::kSuccess);
  EXPECT_EQ(a->send(buf, 4, int(DataType::kFloat32), 1, comms[0], nullptr), nccl::kSuccess);
  EXPECT_EQ(a->send(buf, 4, int(DataType::kFloat32), 7, comms[0], nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(a->groupEnd(), nccl::kInvalidArgument) << "a failed call fails its group";
  EXPECT_NE(std::string(a->getLastError(comms[0])).find("invalid peer 7"), std::string::npos);
  EXPECT_EQ(a->recv(buf, 64, int(DataType::kFloat32), 1, comms[0], nullptr), nccl::kInvalidArgument)
      << "256 bytes do not fit the 64-byte buffer";
  EXPECT_EQ(a->groupEnd(), nccl::kInvalidUsage) << "groupEnd without groupStart";
  EXPECT_EQ(a->allReduce({buf, buf, 0, 0, 0, 0}, comms[0], nullptr), nccl::kSuccess);
  EXPECT_EQ(a->groupStart(), nccl::kSuccess);
  EXPECT_EQ(a->allReduce({buf, buf, 4, 0, 0, 0}, comms[0], nullptr), nccl::kInvalidUsage)
      << "collectives inside a group are not modelled";
  EXPECT_EQ(a->groupEnd(), nccl::kSuccess);
  sc::free(buf);
  EXPECT_EQ(sn::collectivesRun(), 0);
}

TEST_F(SoftNccl, PointToPointCountMismatchHangsUntilAbort) {
  auto comms = init(2);
  std::vector<void*> streams(2), bufs(2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(p->setDevice(r), 0);
    ASSERT_EQ(p->streamCreate(&streams[r]), 0);
    bufs[r] = sc::alloc(r, 64);
  }
  const int f32 = int(DataType::kFloat32);
  ASSERT_EQ(p->setDevice(0), 0);
  ASSERT_EQ(a->send(bufs[0], 16, f32, 1, comms[0], streams[0]), nccl::kSuccess);
  ASSERT_EQ(p->setDevice(1), 0);
  ASSERT_EQ(a->recv(bufs[1], 8, f32, 0, comms[1], streams[1]), nccl::kSuccess);
  EXPECT_TRUE(eventually([] { return sn::mismatches() == 1; }));
  EXPECT_NE(std::string(a->getLastError(comms[1])).find("matched a send of 16"), std::string::npos);
  ASSERT_EQ(a->commAbort(comms[0]), nccl::kSuccess);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(p->streamSynchronize(streams[r]), 0);
  EXPECT_EQ(sn::collectivesRun(), 0);
  for (void* b : bufs) sc::free(b);
}

TEST_F(SoftNccl, MissingRankBlocksUntilAbort) {
  auto comms = init(3);
  constexpr size_t n = 16;
  std::vector<void*> streams(2), outs(2), events(2);
  for (int r = 0; r < 2; ++r) {  // rank 2 never calls
    ASSERT_EQ(p->setDevice(r), 0);
    ASSERT_EQ(p->streamCreate(&streams[r]), 0);
    ASSERT_EQ(p->eventCreate(&events[r]), 0);
    outs[r] = sc::alloc(r, n * 4);
    std::memset(outs[r], 0xab, n * 4);
    void* in = sc::alloc(r, n * 4);
    ASSERT_EQ(a->allReduce({in, outs[r], n, int(DataType::kFloat32), int(ReduceOp::kSum), 0},
                           comms[r], streams[r]),
              nccl::kSuccess);
    ASSERT_EQ(p->eventRecord(events[r], streams[r]), 0);
  }
  std::this_thread::sleep_for(20ms);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(p->eventQuery(events[r]), gflow::cuda::kNotReady);
  ASSERT_EQ(a->commAbort(comms[0]), nccl::kSuccess);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(p->streamSynchronize(streams[r]), 0);
    EXPECT_EQ(p->eventQuery(events[r]), 0);
    for (size_t i = 0; i < n * 4; ++i) ASSERT_EQ(static_cast<unsigned char*>(outs[r])[i], 0xab);
  }
  int result = -1;
  EXPECT_EQ(a->commGetAsyncError(comms[1], &result), nccl::kSuccess);
  EXPECT_EQ(result, nccl::kRemoteError);
  EXPECT_EQ(a->allReduce({outs[0], outs[0], n, 0, 0, 0}, comms[0], streams[0]),
            nccl::kInvalidUsage);
  EXPECT_EQ(a->commGetAsyncError(comms[0], &result), nccl::kInvalidUsage);  // tombstone
  EXPECT_EQ(sn::collectivesRun(), 0);
  EXPECT_EQ(sn::aborts(), 1);
  EXPECT_EQ(sn::comms().size(), 2u);
  EXPECT_EQ(a->commAbort(comms[1]), nccl::kSuccess);
  EXPECT_EQ(a->commAbort(comms[2]), nccl::kSuccess);
  EXPECT_TRUE(sn::comms().empty());
}

TEST_F(SoftNccl, MismatchedCallsHangAndAreCounted) {
  auto comms = init(3);
  std::vector<void*> streams(3);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(p->setDevice(r), 0);
    ASSERT_EQ(p->streamCreate(&streams[r]), 0);
    void* buf = sc::alloc(r, 64);
    ASSERT_EQ(a->allReduce({buf, buf, r == 2 ? size_t{8} : size_t{16}, int(DataType::kFloat32),
                            int(ReduceOp::kSum), 0},
                           comms[r], streams[r]),
              nccl::kSuccess);
  }
  EXPECT_TRUE(eventually([] { return sn::mismatches() == 1; }));
  EXPECT_NE(std::string(a->getLastError(comms[0])).find("mismatch"), std::string::npos);
  ASSERT_EQ(a->commAbort(comms[2]), nccl::kSuccess);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(p->streamSynchronize(streams[r]), 0);
  EXPECT_EQ(sn::collectivesRun(), 0);
}

TEST_F(SoftNccl, DuplicateDeviceFailsTheInit) {
  std::vector<int> result;
  auto comms = init({0, 0}, &result);
  EXPECT_EQ(result, (std::vector<int>{nccl::kInvalidUsage, nccl::kInvalidUsage}));
  for (void* c : comms) {
    EXPECT_STREQ(a->getLastError(c), "Duplicate GPU detected: rank 0 and rank 1 both on device 0");
    EXPECT_EQ(a->commDestroy(c), nccl::kSuccess);
  }
}

TEST_F(SoftNccl, RejectsBadArguments) {
  nccl::UniqueId id{};
  ASSERT_EQ(a->getUniqueId(&id), nccl::kSuccess);
  void* c = nullptr;
  EXPECT_EQ(a->commInitRank(&c, 3, &id, 3), nccl::kInvalidArgument);
  EXPECT_EQ(a->commInitRank(&c, 0, &id, 0), nccl::kInvalidArgument);
  ASSERT_EQ(a->commInitRank(&c, 2, &id, 0), nccl::kInProgress);  // rank 1 not there yet
  void* buf = sc::alloc(0, 64);
  EXPECT_EQ(a->allReduce({buf, buf, 4, 0, 0, 0}, c, nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(a->commAbort(c), nccl::kSuccess);

  auto comms = init(2);
  std::vector<float> host(16);
  void* other = sc::alloc(1, 64);
  EXPECT_EQ(a->allReduce({buf, buf, 4, 0, 0, 0}, nullptr, nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(a->allReduce({buf, buf, 4, 9, 0, 0}, comms[0], nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(a->allReduce({buf, buf, 4, 0, 7, 0}, comms[0], nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(a->broadcast({buf, buf, 4, 0, 0, 2}, comms[0], nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(a->allReduce({host.data(), buf, 4, 0, 0, 0}, comms[0], nullptr),
            nccl::kInvalidArgument);
  EXPECT_NE(std::string(a->getLastError(comms[0])).find("sendbuff"), std::string::npos);
  EXPECT_EQ(a->allReduce({buf, other, 4, 0, 0, 0}, comms[0], nullptr), nccl::kInvalidArgument);
  EXPECT_EQ(a->allReduce({buf, buf, 17, 0, 0, 0}, comms[0], nullptr), nccl::kInvalidArgument);
  void* s1 = nullptr;
  ASSERT_EQ(p->setDevice(1), 0);
  ASSERT_EQ(p->streamCreate(&s1), 0);
  EXPECT_EQ(a->allReduce({buf, buf, 4, 0, 0, 0}, comms[0], s1), nccl::kUnhandledCudaError);
  EXPECT_EQ(a->allReduce({buf, buf, 0, 0, 0, 0}, comms[0], nullptr), nccl::kSuccess);  // no-op
  sn::failNextCall("allReduce", nccl::kSystemError);
  EXPECT_EQ(a->allReduce({buf, buf, 4, 0, 0, 0}, comms[0], nullptr), nccl::kSystemError);
  sn::injectAsyncError(comms[1], nccl::kRemoteError);
  int result = -1;
  EXPECT_EQ(a->commGetAsyncError(comms[1], &result), nccl::kSuccess);
  EXPECT_EQ(result, nccl::kRemoteError);
  EXPECT_EQ(a->allReduce({other, other, 4, 0, 0, 0}, comms[1], s1), nccl::kRemoteError);
  EXPECT_EQ(sn::collectivesRun(), 0);
  EXPECT_STRNE(a->getErrorString(nccl::kInvalidUsage), a->getErrorString(nccl::kSuccess));
}

TEST_F(SoftNccl, SplitIntoTwoColors) {
  start(4);
  auto parent = init(4);
  // Colors 0 (ranks 0, 2; keys reverse them), 1 (rank 1), none (rank 3).
  const int colors[] = {0, 1, 0, -1};
  std::vector<void*> child(4);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(a->commSplit(parent[r], colors[r], -r, &child[r]),
              colors[r] < 0 ? nccl::kSuccess : nccl::kInProgress);
  }
  EXPECT_EQ(child[3], nullptr);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(settled(child[r]), nccl::kSuccess);
  }
  EXPECT_EQ(sn::splits(), 4);
  int seen = 0;
  for (const sn::CommInfo& info : sn::comms()) {
    if (info.comm == child[0]) {
      EXPECT_EQ(info.rank, 1);
      EXPECT_EQ(info.nranks, 2);
      ++seen;
    } else if (info.comm == child[2]) {
      EXPECT_EQ(info.rank, 0);
      EXPECT_EQ(info.device, 2);
      ++seen;
    } else if (info.comm == child[1]) {
      EXPECT_EQ(info.nranks, 1);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 3);
  // An allreduce within color 0 (parent ranks 0 and 2 on devices 0 and 2).
  std::vector<std::thread> threads;
  std::vector<float> got(4, 0.0f);
  for (int r : {0, 2}) {
    threads.emplace_back([&, r] {
      EXPECT_EQ(p->setDevice(r), 0);
      auto* buf = static_cast<float*>(sc::alloc(r, 4));
      *buf = float(r + 1);
      EXPECT_EQ(a->allReduce({buf, buf, 1, int(DataType::kFloat32), int(ReduceOp::kSum), 0},
                             child[r], nullptr),
                nccl::kSuccess);
      EXPECT_EQ(p->streamSynchronize(nullptr), 0);
      got[r] = *buf;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[0], 4.0f);
  EXPECT_EQ(got[2], 4.0f);
}

TEST_F(SoftNccl, FinalizeThenDestroy) {
  auto comms = init(2);
  std::vector<Bytes> inputs(2, bytesOf(std::vector<int32_t>{1, 2, 3}));
  run(inputs, 12, [&](int r, const void* i, void* o, void* s) {
    return a->allReduce({i, o, 3, int(DataType::kInt32), int(ReduceOp::kSum), 0}, comms[r], s);
  });
  for (void* c : comms) {
    EXPECT_EQ(a->commFinalize(c), nccl::kInProgress);
    EXPECT_EQ(settled(c), nccl::kSuccess);
    EXPECT_EQ(a->allReduce({nullptr, nullptr, 1, 0, 0, 0}, c, nullptr), nccl::kInvalidUsage);
  }
  for (void* c : comms) EXPECT_EQ(a->commDestroy(c), nccl::kSuccess);
  EXPECT_EQ(a->commDestroy(comms[0]), nccl::kInvalidUsage);
  EXPECT_EQ(a->commDestroy(nullptr), nccl::kSuccess);
  EXPECT_TRUE(sn::comms().empty());
  EXPECT_EQ(sn::collectivesRun(), 2);
}

}  // namespace
}  // namespace gflow::testing
