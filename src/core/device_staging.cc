#include "core/device_staging.h"

#include <cstring>

#include "common/check.h"
#include "cuda/device_guard.h"

namespace gflow {

DeviceStagingPool::~DeviceStagingPool() {
  for (void* s : streams_) {
    if (s) p_.streamDestroy(s);
  }
  if (host_) p_.hostFree(host_);
}

char* DeviceStagingPool::host(size_t bytes) {
  if (bytes > hostBytes_) {
    if (host_) p_.hostFree(host_);
    host_ = nullptr;
    hostBytes_ = 0;
    if (int e = p_.hostAlloc(&host_, bytes)) {
      GFLOW_THROW(kInternal, ErrorContext{})
          << "cudaHostAlloc of " << bytes << " bytes for staging failed: " << p_.errorString(e);
    }
    hostBytes_ = bytes;
  }
  return static_cast<char*>(host_);
}

void* DeviceStagingPool::stream(int device) {
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

std::shared_ptr<DeviceStaging> DeviceStaging::prepare(const cuda::Plugin* plugin, const char* op,
                                                      int rank, std::initializer_list<Item> items) {
  bool any = false;
  for (const Item& it : items) any = any || it.t.device.type == DeviceType::kCUDA;
  if (!any) return nullptr;
  auto st = std::shared_ptr<DeviceStaging>(new DeviceStaging());
  st->p_ = plugin;
  st->op_ = op;
  st->rank_ = rank;
  st->items_.assign(items.begin(), items.end());
  st->events_.assign(st->items_.size(), nullptr);
  st->ptr_.assign(st->items_.size(), nullptr);
  for (size_t i = 0; i < st->items_.size(); ++i) {
    const Tensor& t = st->items_[i].t;
    st->ptr_[i] = t.data;
    if (t.device.type != DeviceType::kCUDA) continue;
    void* ev = nullptr;
    st->check(cuda::onDevice(*plugin, t.device.index,
                             [&] {
                               if (int e = plugin->eventCreate(&ev)) return e;
                               return plugin->eventRecord(ev, t.stream);
                             }),
              "recording an event on the tensor's stream");
    st->events_[i] = ev;
  }
  return st;
}

bool DeviceStaging::single(int* device, void** ready) const {
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

void DeviceStaging::recordAgain() {
  for (size_t i = 0; i < items_.size(); ++i) {
    const Tensor& t = items_[i].t;
    if (!events_[i]) continue;
    check(
        cuda::onDevice(*p_, t.device.index, [&] { return p_->eventRecord(events_[i], t.stream); }),
        "recording an event on the tensor's stream");
  }
}

DeviceStaging::~DeviceStaging() {
  for (void* ev : events_) {
    if (ev) p_->eventDestroy(ev);
  }
}

void DeviceStaging::check(int err, const char* what) const {
  if (err == 0) return;
  GFLOW_THROW(kInternal, (ErrorContext{op_, 0, rank_, -1}))
      << "CUDA failed while " << what << ": " << p_->errorString(err);
}

void DeviceStaging::toHost(DeviceStagingPool& pool) {
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

void DeviceStaging::toDevice(DeviceStagingPool& pool) {
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

}  // namespace gflow
