"""cuda tensors from Python (docs/python.md): objects whose DLPack device is
CUDA become gflow cuda tensors on the legacy default stream, which the
producer is asked to order after its own work (the DLPack stream protocol).
No GPU here: soft_gpu.py's DeviceArray exports soft device memory of the
software CUDA component (libgflow_softcuda.so) as CUDA memory, and gflow
stages it through host memory (worker_cuda.py), as it would real device
memory without NCCL. Unusable devices and a component that cannot load are
argument errors that leave the communicator usable."""

import os

import numpy as np
import pytest

import gflow
from conftest import assert_all_ok, launch, make_single
from soft_gpu import DeviceArray, SoftGpu, component_path

pytestmark = pytest.mark.skipif(not os.path.exists(component_path()),
                                reason="the software CUDA component is not built")


@pytest.mark.parametrize("ranks", [2, 3])
def test_cuda_tensors_through_every_kind_of_op(ranks):
    ranks_out = launch(ranks, ["worker_cuda.py"], env={"GFLOW_SOFTCUDA_DEVICES": "2"})
    assert_all_ok(ranks_out)


def _expect_invalid(comm, call, match):
    with pytest.raises(gflow.InvalidArgumentError, match=match) as info:
        call()
    assert info.value.op == "allreduce"
    x = np.arange(3.0)
    comm.allreduce(x)  # rejected, not failed: the communicator goes on
    np.testing.assert_array_equal(x, np.arange(3.0))


def test_devices_gflow_cannot_use_are_rejected_by_name():
    gpu = SoftGpu()
    comm = make_single()
    rocm = DeviceArray(gpu, 0, np.zeros(4, np.float32), dlpack_device=(10, 0))
    _expect_invalid(comm, lambda: comm.allreduce(rocm),
                    "DLPack device type 10; gflow takes CPU \\(1\\) and CUDA \\(2\\) memory")
    liar = DeviceArray(gpu, 0, np.zeros(4, np.float32), dlpack_device=(2, 1))
    _expect_invalid(comm, lambda: comm.allreduce(liar),
                    "exported DLPack device \\(2, 0\\) but __dlpack_device__ said \\(2, 1\\)")
    for a in (rocm, liar):
        a.free()


def test_cuda_tensor_without_a_cuda_component_is_rejected():
    # This process never set the component: libgflow_cuda.so of the build is
    # found but sees no GPU (or is absent), which the error names.
    gpu = SoftGpu()
    comm = make_single()
    x = DeviceArray(gpu, 0, np.zeros(4, np.float32))
    _expect_invalid(comm, lambda: comm.allreduce(x), "is a cuda tensor, but|is not memory of cuda")
    assert x.streams == [1]
    x.free()
