"""CUDA memory for the Python tests without a GPU: the software CUDA built as
a loadable gflow CUDA component (tests/testing/soft_cuda_component.cc,
$GFLOW_BUILD_DIR/tests/libgflow_softcuda.so). DeviceArray is soft device
memory that exports itself through DLPack as CUDA memory (device type 2),
the way a torch CUDA tensor does, and records the stream each export was
asked to order itself before (the DLPack stream protocol)."""

import ctypes
import os

import numpy as np

_CAPSULE_NAME = b"dltensor"  # outlives every capsule (module constant)

_DLPACK_TYPES = {  # numpy dtype -> (DLPack code, bits)
    np.dtype(np.float32): (2, 32), np.dtype(np.float64): (2, 64),
    np.dtype(np.float16): (2, 16), np.dtype(np.int32): (0, 32),
    np.dtype(np.int64): (0, 64), np.dtype(np.uint8): (1, 8), np.dtype(np.int8): (0, 8),
}


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def component_path():
    build = os.environ.get("GFLOW_BUILD_DIR") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "build")
    return os.path.join(os.path.abspath(build), "tests", "libgflow_softcuda.so")


class SoftGpu:
    """The software CUDA component of this process (loaded once by path)."""

    def __init__(self, path=None):
        self.path = path or component_path()
        self.lib = ctypes.CDLL(self.path)
        self.lib.gflow_softcuda_alloc.restype = ctypes.c_void_p
        self.lib.gflow_softcuda_alloc.argtypes = [ctypes.c_int, ctypes.c_size_t]
        self.lib.gflow_softcuda_free.argtypes = [ctypes.c_void_p]
        self.lib.gflow_softcuda_alive.restype = ctypes.c_int

    def array(self, device, values):
        return DeviceArray(self, device, np.ascontiguousarray(values))

    def alive(self):
        """Soft device allocations alive in this process."""
        return self.lib.gflow_softcuda_alive()


class DeviceArray:
    """A 1-d array in soft device memory of `device`, exported as CUDA memory."""

    def __init__(self, gpu, device, values, dlpack_device=None):
        self.gpu, self.device, self.dtype = gpu, device, values.dtype
        self.count = values.size
        self.nbytes = values.nbytes
        self.ptr = gpu.lib.gflow_softcuda_alloc(device, max(self.nbytes, 1))
        assert self.ptr, "soft device memory of device %d" % device
        ctypes.memmove(self.ptr, values.ctypes.data, self.nbytes)
        self.streams = []  # the stream argument of each __dlpack__ call
        self.dlpack_device = dlpack_device or (2, device)
        self._exports = []  # what each capsule points at, alive with the array

    def host(self):
        """A host copy of the values (soft device memory is host memory)."""
        raw = (ctypes.c_char * self.nbytes).from_address(self.ptr)
        return np.frombuffer(bytes(raw), dtype=self.dtype).copy()

    def free(self):
        if self.ptr:
            self.gpu.lib.gflow_softcuda_free(self.ptr)
            self.ptr = None

    def __dlpack_device__(self):
        return self.dlpack_device

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        shape = (ctypes.c_int64 * 1)(self.count)
        code, bits = _DLPACK_TYPES[self.dtype]
        t = _DLManagedTensor(self.ptr, 2, self.device, 1, code, bits, 1, shape, None, 0, None, None)
        self._exports.append((t, shape))
        return _new_capsule(ctypes.addressof(t), _CAPSULE_NAME, None)
