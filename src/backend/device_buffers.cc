#include "backend/device_buffers.h"

#include "backend/backend.h"
#include "common/check.h"
#include "common/resource_counts.h"
#include "cuda/device_guard.h"
#include "kernels/cuda/plugin.h"

namespace gflow::backend {

StagingPool::~StagingPool() {
  for (void* s : streams_) {
    if (s) p_.streamDestroy(s);
  }
  releaseHost();
}

void StagingPool::releaseHost() {
  if (host_) p_.hostFree(host_);
  resources::pinned(-static_cast<int64_t>(hostBytes_));
  host_ = nullptr;
  hostBytes_ = 0;
}

char* StagingPool::host(size_t bytes) {
  if (bytes > hostBytes_) {
    releaseHost();
    if (int e = p_.hostAlloc(&host_, bytes)) {
      host_ = nullptr;
      GFLOW_THROW(kInternal, ErrorContext{})
          << "cudaHostAlloc of " << bytes << " bytes for staging failed: " << p_.errorString(e);
    }
    hostBytes_ = bytes;
    resources::pinned(static_cast<int64_t>(bytes));
  }
  return static_cast<char*>(host_);
}

void* StagingPool::stream(int device) {
  if (static_cast<size_t>(device) >= streams_.size()) streams_.resize(device + 1, nullptr);
  if (!streams_[device]) {
    void* s = nullptr;
    if (int e = cuda::onDevice(p_, device, [&] { return p_.streamCreate(&s); })) {
      GFLOW_THROW(kInternal, ErrorContext{})
          << "creating a CUDA stream on device " << device << " failed: " << p_.errorString(e);
    }
    streams_[device] = s;
  }
  return streams_[device];
}

std::shared_ptr<DeviceBuffers> DeviceBuffers::bind(const Binding& at, std::vector<Item> items) {
  bool any = false;
  for (const Item& it : items) any = any || it.t.device.type == DeviceType::kCUDA;
  if (!any) return nullptr;
  std::string why;
  const cuda::Plugin* plugin = cuda::load(&why);
  GFLOW_ENFORCE(plugin != nullptr);  // checkPlacement accepted the tensors
  GFLOW_ENFORCE(at.events != nullptr);
  auto st = std::shared_ptr<DeviceBuffers>(new DeviceBuffers());
  st->p_ = plugin;
  st->op_ = at.op;
  st->rank_ = at.rank;
  st->pool_ = at.events;
  st->items_ = std::move(items);
  st->events_.assign(st->items_.size(), nullptr);
  st->owns_.assign(st->items_.size(), false);
  st->ptr_.assign(st->items_.size(), nullptr);
  for (size_t i = 0; i < st->items_.size(); ++i) {
    st->ptr_[i] = static_cast<char*>(st->items_[i].t.data);
    if (st->items_[i].t.device.type == DeviceType::kCUDA) st->mark(i);
  }
  return st;
}

void DeviceBuffers::mark(size_t i) {
  const Tensor& t = items_[i].t;
  for (size_t j = 0; j < i; ++j) {
    const Tensor& u = items_[j].t;
    if (events_[j] && u.device.index == t.device.index && u.stream == t.stream) {
      events_[i] = events_[j];
      return;
    }
  }
  void* ev = nullptr;
  check(cuda::onDevice(*p_, t.device.index,
                       [&] {
                         if (int e = pool_->take(*p_, t.device.index, &ev)) return e;
                         events_[i] = ev;
                         owns_[i] = true;
                         return p_->eventRecord(ev, t.stream);
                       }),
        "recording an event on the tensor's stream");
}

template <typename F>
void DeviceBuffers::forEachEvent(F&& fn) const {
  for (size_t i = 0; i < items_.size(); ++i) {
    if (owns_[i]) fn(items_[i].t, events_[i]);
  }
}

bool DeviceBuffers::single(int* device, void** ready) const {
  *device = -1;
  *ready = nullptr;
  void* stream = nullptr;
  bool same = true;
  for (size_t i = 0; i < items_.size(); ++i) {
    const Tensor& t = items_[i].t;
    if (t.device.type != DeviceType::kCUDA) {
      same = false;
      continue;
    }
    if (*device < 0) {
      *device = t.device.index;
      *ready = events_[i];
      stream = t.stream;
    } else if (t.device.index != *device || t.stream != stream) {
      same = false;
    }
  }
  return same;
}

bool DeviceBuffers::leading(int* device, void** ready) const {
  *device = -1;
  *ready = nullptr;
  if (items_.empty() || items_[0].t.device.type != DeviceType::kCUDA) return false;
  *device = items_[0].t.device.index;
  *ready = events_[0];
  return true;
}

void* DeviceBuffers::eventOf(const void* p) const {
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < items_.size(); ++i) {
    const char* base = static_cast<const char*>(items_[i].t.data);
    if (c == base || (c > base && c < base + items_[i].t.nbytes())) return events_[i];
  }
  return nullptr;
}

void DeviceBuffers::recordAgain() {
  forEachEvent([&](const Tensor& t, void* ev) {
    check(cuda::onDevice(*p_, t.device.index, [&] { return p_->eventRecord(ev, t.stream); }),
          "recording an event on the tensor's stream");
  });
}

DeviceBuffers::~DeviceBuffers() {
  forEachEvent([&](const Tensor& t, void* ev) { pool_->give(t.device.index, ev); });
}

void DeviceBuffers::check(int err, const char* what) const {
  if (err == 0) return;
  GFLOW_THROW(kInternal, ErrorContext::forOp(op_).withRank(rank_))
      << "CUDA failed while " << what << ": " << p_->errorString(err);
}

void DeviceBuffers::toHost(StagingPool& pool) {
  size_t total = 0;
  for (const Item& it : items_) {
    if (it.t.device.type == DeviceType::kCUDA) total += (it.t.nbytes() + 255) & ~size_t(255);
  }
  char* host = pool.host(total > 0 ? total : 1);
  size_t off = 0;
  for (size_t i = 0; i < items_.size(); ++i) {
    const Tensor& t = items_[i].t;
    if (t.device.type != DeviceType::kCUDA) continue;
    ptr_[i] = host + off;
    off += (t.nbytes() + 255) & ~size_t(255);
    if (items_[i].role == kOut || t.nbytes() == 0) continue;
    void* s = pool.stream(t.device.index);
    check(cuda::onDevice(*p_, t.device.index,
                         [&] {
                           if (int e = p_->streamWaitEvent(s, events_[i])) return e;
                           if (int e = p_->memcpyAsync(ptr_[i], t.data, t.nbytes(), s)) return e;
                           return p_->streamSynchronize(s);
                         }),
          "copying a device tensor to host memory");
  }
}

void* DeviceBuffers::host(const void* p) const {
  if (p == nullptr) return nullptr;  // a rooted op's root-only buffer, off the root
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < items_.size(); ++i) {
    const char* base = static_cast<const char*>(items_[i].t.data);
    if (c == base || (c > base && c < base + items_[i].t.nbytes())) return ptr_[i] + (c - base);
  }
  GFLOW_ENFORCE(false);  // every buffer of an op is one of its items
  return nullptr;
}

void DeviceBuffers::toDevice(StagingPool& pool) {
  for (size_t i = 0; i < items_.size(); ++i) {
    const Tensor& t = items_[i].t;
    if (t.device.type != DeviceType::kCUDA || items_[i].role == kIn || t.nbytes() == 0) continue;
    void* s = pool.stream(t.device.index);
    check(cuda::onDevice(*p_, t.device.index,
                         [&] {
                           if (int e = p_->streamWaitEvent(s, events_[i])) return e;
                           if (int e = p_->memcpyAsync(t.data, ptr_[i], t.nbytes(), s)) return e;
                           return p_->streamSynchronize(s);
                         }),
          "copying the result back to device memory");
  }
}

std::string checkPlacement(const Tensor& t) {
  if (t.device.type == DeviceType::kCPU) return "";
  if (t.device.type != DeviceType::kCUDA) {
    return " has an invalid device type (" + std::to_string(static_cast<int>(t.device.type)) + ")";
  }
  std::string why;
  const cuda::Plugin* p = cuda::load(&why);
  if (!p) return " is a cuda tensor, but " + why;
  int n = 0;
  p->deviceCount(&n);
  if (t.device.index < 0 || t.device.index >= n) {
    return " is on cuda:" + std::to_string(t.device.index) + ", but this process sees " +
           std::to_string(n) + " GPU(s)";
  }
  int dev = -1;
  p->pointerDevice(t.data, &dev);
  if (t.count > 0 && dev != t.device.index) {
    return ".data is not memory of cuda:" + std::to_string(t.device.index) + " (it is " +
           (dev < 0 ? std::string("host memory") : "memory of cuda:" + std::to_string(dev)) + ")";
  }
  // cudaStreamPerThread names the calling thread's stream, which is not
  // the thread gflow works on.
  if (t.stream == reinterpret_cast<void*>(0x2)) {
    return ".stream is cudaStreamPerThread; pass the stream itself";
  }
  return "";
}

void inputsProduced(const Op& op) {
  if (op.buffers) op.buffers->recordAgain();
}

}  // namespace gflow::backend
