#include "gradient/tensor_device.h"

#include "gradient/registration.h"

namespace gflow::gradient {

int commonDevice(const cuda::Plugin* plugin, const std::vector<Tensor>& tensors,
                 const std::vector<std::string>& names, std::string* why) {
  int device = -1;
  size_t first = 0;
  bool anyCpu = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.device.type != DeviceType::kCUDA) {
      anyCpu = true;
      continue;
    }
    if (t.stream == reinterpret_cast<void*>(0x2)) {
      *why = describeTensor(i, tensors, names) +
             " names cudaStreamPerThread; pass the stream itself (gflow works on its own threads)";
      return -2;
    }
    if (device < 0) {
      device = t.device.index;
      first = i;
    } else if (t.device.index != device || t.stream != tensors[first].stream) {
      *why = describeTensor(i, tensors, names) + " and " + describeTensor(first, tensors, names) +
             " are on different GPUs or streams; a reducer's gradients share one";
      return -2;
    }
  }
  if (device < 0) return -1;
  if (anyCpu) {
    *why = "the gradients mix cpu and cuda tensors; a reducer's gradients are all on one device";
    return -2;
  }
  if (!plugin) return device;  // the caller reports the missing component
  for (size_t i = 0; i < tensors.size(); ++i) {
    int dev = -1;
    if (tensors[i].count > 0 &&
        (plugin->pointerDevice(tensors[i].data, &dev) != 0 || dev != device)) {
      *why = describeTensor(i, tensors, names) + " says cuda:" + std::to_string(device) +
             " but its data is " +
             (dev < 0 ? std::string("host memory") : "memory of cuda:" + std::to_string(dev));
      return -2;
    }
  }
  return device;
}

}  // namespace gflow::gradient
