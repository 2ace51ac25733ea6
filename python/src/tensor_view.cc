// Python arrays as gflow::Tensor views, without copies: the buffer protocol
// (numpy, memoryview, bytearray) or DLPack (torch tensors on CPU or CUDA),
// plus the
// conversions of ops, dtypes and timeouts from their Python spellings.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "bindings.h"

namespace gflow {
namespace python {
namespace {

// The DLPack ABI (dlpack.h v0.x, the version torch 1.13 exports), declared
// from the specification: a capsule named "dltensor" holds a DLManagedTensor.
struct DLDevice {
  int32_t device_type;  // 1: CPU, 2: CUDA, 3: CUDA pinned host memory
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; nullptr: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

const char* kSupported =
    "float32, float16, bfloat16, float64, int32, int64, uint8, int8, int16, bool, complex64, "
    "complex128";

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, message);
}

std::string typeName(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__qualname__")).cast<std::string>();
}

// Row-major contiguity; dimensions of extent 1 may have any stride.
bool contiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                int64_t itemsize) {
  int64_t expected = itemsize;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return true;
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string describeStrides(const std::vector<int64_t>& strides) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < strides.size(); ++i) s << (i ? ", " : "") << strides[i];
  s << (strides.size() == 1 ? ",)" : ")");
  return s.str();
}

DataType fromBufferFormat(const std::string& format, size_t itemsize, const char* what) {
  std::string f = format;
  if (!f.empty() && (f[0] == '<' || f[0] == '@' || f[0] == '=')) f = f.substr(1);
  if (f == "f" && itemsize == 4) return DataType::kFloat32;
  if (f == "d" && itemsize == 8) return DataType::kFloat64;
  if (f == "e" && itemsize == 2) return DataType::kFloat16;
  if (f == "B" && itemsize == 1) return DataType::kUInt8;
  if (f == "?" && itemsize == 1) return DataType::kBool;
  if (f == "Zf" && itemsize == 8) return DataType::kComplex64;
  if (f == "Zd" && itemsize == 16) return DataType::kComplex128;
  if (f == "i" || f == "l" || f == "q" || f == "h" || f == "b") {
    if (itemsize == 1) return DataType::kInt8;
    if (itemsize == 2) return DataType::kInt16;
    if (itemsize == 4) return DataType::kInt32;
    if (itemsize == 8) return DataType::kInt64;
  }
  invalid(std::string(what) + ": element type with buffer format '" + format + "' (" +
          std::to_string(itemsize) + " bytes) is not supported; gflow takes " + kSupported);
}

HeldTensor viewBuffer(py::handle obj, const char* what, bool writable) {
  // buffer_info takes ownership of a heap Py_buffer (released and deleted).
  auto* view = new Py_buffer();
  const int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), view, flags) != 0) {
    delete view;
    py::error_already_set e;
    invalid(std::string(what) + ": cannot view the " + typeName(obj) + " " +
            (writable ? "as a writable buffer (is it read-only?)" : "as a buffer") + ": " +
            e.what());
  }
  auto info = std::make_shared<py::buffer_info>(view, /*ownview=*/true);
  HeldTensor h;
  h.owner = py::reinterpret_borrow<py::object>(obj);
  h.buffer = info;
  const DataType dtype = fromBufferFormat(info->format, static_cast<size_t>(info->itemsize), what);
  std::vector<int64_t> shape(info->shape.begin(), info->shape.end());
  std::vector<int64_t> strides(info->strides.begin(), info->strides.end());
  if (!contiguous(shape, strides, info->itemsize)) {
    invalid(std::string(what) + " is not contiguous (byte strides " + describeStrides(strides) +
            "); pass numpy.ascontiguousarray(x) or x.copy()");
  }
  h.tensor = Tensor(info->ptr, static_cast<size_t>(info->size), dtype);
  return h;
}

DataType fromDLPack(const DLDataType& t, const char* what) {
  if (t.lanes == 1) {
    if (t.code == 2 && t.bits == 32) return DataType::kFloat32;
    if (t.code == 2 && t.bits == 16) return DataType::kFloat16;
    if (t.code == 4 && t.bits == 16) return DataType::kBFloat16;
    if (t.code == 2 && t.bits == 64) return DataType::kFloat64;
    if (t.code == 0 && t.bits == 32) return DataType::kInt32;
    if (t.code == 0 && t.bits == 64) return DataType::kInt64;
    if (t.code == 1 && t.bits == 8) return DataType::kUInt8;
    if (t.code == 0 && t.bits == 8) return DataType::kInt8;
    if (t.code == 0 && t.bits == 16) return DataType::kInt16;
    if (t.code == 6 && t.bits == 8) return DataType::kBool;  // kDLBool
    if (t.code == 5 && t.bits == 64) return DataType::kComplex64;
    if (t.code == 5 && t.bits == 128) return DataType::kComplex128;
  }
  invalid(std::string(what) + ": DLPack element type (code " + std::to_string(t.code) + ", " +
          std::to_string(t.bits) + " bits, " + std::to_string(t.lanes) +
          " lanes) is not supported; gflow takes " + kSupported);
}

// DLPack device types gflow takes: CPU memory (and CUDA's pinned host
// memory, which is CPU memory to gflow) and CUDA device memory.
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3;

// Where `src` lives, from __dlpack_device__ (CPU for producers without it).
// Pinned host memory counts as CPU.
DLDevice dlpackDevice(const py::object& src, py::handle obj, const char* what) {
  DLDevice d{kDLCPU, 0};
  if (!py::hasattr(src, "__dlpack_device__")) return d;
  try {
    py::tuple t = src.attr("__dlpack_device__")();
    d.device_type = t[0].cast<int32_t>();
    d.device_id = t[1].cast<int32_t>();
  } catch (const std::exception& e) {
    invalid(std::string(what) + ": __dlpack_device__ of the " + typeName(obj) +
            " failed: " + e.what());
  }
  if (d.device_type == kDLCUDAHost) d.device_type = kDLCPU;
  if (d.device_type != kDLCPU && d.device_type != kDLCUDA) {
    invalid(std::string(what) + " is on DLPack device type " + std::to_string(d.device_type) +
            "; gflow takes CPU (1) and CUDA (2) memory");
  }
  return d;
}

// __dlpack__(stream=1) of a CUDA array. torch orders the legacy default
// stream after the current stream of the *current* device, so a torch
// tensor is exported with its own device made current.
py::object exportOnDevice(const py::object& src, int32_t device) {
  py::object guard = py::none();
  py::object modules = py::module_::import("sys").attr("modules");
  if (modules.contains("torch")) {
    py::object torch = modules["torch"];
    if (py::isinstance(src, torch.attr("Tensor"))) {
      guard = torch.attr("cuda").attr("device")(device);
    }
  }
  if (guard.is_none()) return src.attr("__dlpack__")(py::arg("stream") = 1);
  guard.attr("__enter__")();
  try {
    py::object capsule = src.attr("__dlpack__")(py::arg("stream") = 1);
    guard.attr("__exit__")(py::none(), py::none(), py::none());
    return capsule;
  } catch (...) {
    guard.attr("__exit__")(py::none(), py::none(), py::none());
    throw;
  }
}

HeldTensor viewDLPack(py::handle obj, const char* what) {
  py::object src = py::reinterpret_borrow<py::object>(obj);
  // torch refuses to export a tensor that requires grad; its detached view
  // shares the memory, which is what a collective on a parameter wants.
  if (py::hasattr(src, "requires_grad") && src.attr("requires_grad").cast<bool>()) {
    src = src.attr("detach")();
  }
  // torch (1.13) exports no bool tensor through DLPack: its bytes go as a
  // uint8 view of the same memory, and gflow reduces them as bool.
  const bool torchBool =
      py::hasattr(src, "dtype") && py::str(src.attr("dtype")).cast<std::string>() == "torch.bool";
  if (torchBool) src = src.attr("view")(py::module_::import("torch").attr("uint8"));
  const DLDevice where = dlpackDevice(src, obj, what);
  py::object capsule;
  try {
    // CUDA: the DLPack stream protocol. The producer makes the legacy
    // default stream (1) wait for the work it has enqueued on its current
    // stream, and gflow's op then waits for the legacy default stream
    // (Tensor::stream null).
    capsule = where.device_type == kDLCUDA ? exportOnDevice(src, where.device_id)
                                           : src.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    invalid(std::string(what) + ": cannot export the " + typeName(obj) +
            " through DLPack: " + e.what());
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (!managed) {
    PyErr_Clear();
    invalid(std::string(what) + ": __dlpack__ of the " + typeName(obj) +
            " did not return a 'dltensor' capsule");
  }
  const DLTensor& t = managed->dl_tensor;
  const int32_t type = t.device.device_type == kDLCUDAHost ? kDLCPU : t.device.device_type;
  if (type != where.device_type || (type == kDLCUDA && t.device.device_id != where.device_id)) {
    invalid(std::string(what) + ": the " + typeName(obj) + " exported DLPack device (" +
            std::to_string(t.device.device_type) + ", " + std::to_string(t.device.device_id) +
            ") but __dlpack_device__ said (" + std::to_string(where.device_type) + ", " +
            std::to_string(where.device_id) + ")");
  }
  const DataType dtype = torchBool ? DataType::kBool : fromDLPack(t.dtype, what);
  const int64_t itemsize = static_cast<int64_t>(dataTypeSize(dtype));
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  int64_t count = 1;
  for (int64_t s : shape) count *= s;
  if (t.strides) {
    std::vector<int64_t> strides(t.ndim);
    for (int i = 0; i < t.ndim; ++i) strides[i] = t.strides[i] * itemsize;
    if (!contiguous(shape, strides, itemsize)) {
      std::vector<int64_t> elems(t.strides, t.strides + t.ndim);
      invalid(std::string(what) + " is not contiguous (strides " + describeStrides(elems) +
              "); pass x.contiguous()");
    }
  }
  HeldTensor h;
  // The tensor object itself (and its detached view): the capsule alone keeps
  // the storage, but not the object a caller may be watching.
  h.owner = py::make_tuple(py::reinterpret_borrow<py::object>(obj), src);
  h.capsule = capsule;  // not consumed: its destructor runs the deleter
  const Device device = where.device_type == kDLCUDA
                            ? Device{DeviceType::kCUDA, static_cast<int>(where.device_id)}
                            : Device{};
  h.tensor =
      Tensor(static_cast<char*>(t.data) + t.byte_offset, static_cast<size_t>(count), dtype, device);
  return h;
}

}  // namespace

HeldTensor viewTensor(py::handle obj, const char* what, bool writable) {
  if (PyObject_CheckBuffer(obj.ptr())) return viewBuffer(obj, what, writable);
  if (py::hasattr(obj, "__dlpack__")) return viewDLPack(obj, what);
  invalid(std::string(what) + ": expected a numpy array or a torch tensor (CPU or CUDA), got " +
          typeName(obj));
}

ReduceOp toReduceOp(py::handle obj) {
  if (py::isinstance<ReduceOp>(obj)) return obj.cast<ReduceOp>();
  if (py::isinstance<py::str>(obj)) return parseReduceOp(obj.cast<std::string>());
  invalid(
      "op: expected a gflow.ReduceOp or a name ('sum', 'avg', 'min', 'max', 'prod', 'band', "
      "'bor', 'bxor'), got " +
      typeName(obj));
}

DataType toDataType(py::handle obj) {
  if (py::isinstance<DataType>(obj)) return obj.cast<DataType>();
  // str(torch.float16) == "torch.float16"; numpy dtypes and types have names.
  std::string name;
  if (py::isinstance<py::str>(obj)) {
    name = obj.cast<std::string>();
  } else if (py::hasattr(obj, "__module__") && py::hasattr(obj, "__name__")) {
    name = py::str(obj.attr("__name__")).cast<std::string>();  // numpy.float16
  } else {
    name = py::str(obj).cast<std::string>();  // torch.bfloat16, numpy.dtype('float16')
  }
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  return parseDataType(name);
}

std::chrono::milliseconds toTimeout(py::handle obj) {
  if (obj.is_none()) return std::chrono::milliseconds(0);
  double seconds;
  try {
    if (py::hasattr(obj, "total_seconds")) {
      seconds = obj.attr("total_seconds")().cast<double>();
    } else {
      seconds = obj.cast<double>();
    }
  } catch (const py::cast_error&) {
    invalid("timeout: expected seconds (a number or a datetime.timedelta) or None, got " +
            typeName(obj));
  }
  if (std::isnan(seconds) || !(seconds > 0)) {
    invalid("timeout must be positive seconds (or None), got " + py::str(obj).cast<std::string>());
  }
  if (std::isinf(seconds)) return std::chrono::milliseconds(0);  // no limit
  // At least 1 ms (0 would mean "no limit"); beyond ~292 million years, none.
  const double ms = std::ceil(seconds * 1000.0);
  if (ms >= 9.2e18) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(ms)));
}

}  // namespace python
}  // namespace gflow
