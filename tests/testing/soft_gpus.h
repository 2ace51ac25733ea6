// A fixture base for tests on the software CUDA and NCCL (soft_cuda.h,
// soft_nccl.h): each test gets `kDevices` fresh soft GPUs with the software
// NCCL enabled, and ends by checking that gflow freed every device and
// pinned allocation it made (the test frees its own first) and never named
// a stream or event after it was destroyed.
#pragma once

#include <gtest/gtest.h>

#include "testing/soft_cuda.h"
#include "testing/soft_nccl.h"

namespace gflow::testing {

template <int kDevices, class Base = ::testing::Test>
class OnSoftGpus : public Base {
 protected:
  void SetUp() override {
    softcuda::install(kDevices);
    softnccl::enable();
  }
  void TearDown() override {
    // Communicators (and reducers) gone: gflow freed its device memory.
    EXPECT_EQ(softcuda::allocationsAlive(), 0);
    EXPECT_EQ(softcuda::hostAllocsAlive(), 0);
    EXPECT_EQ(softcuda::staleHandleUses(), 0u);
    softcuda::uninstall();
  }
};

}  // namespace gflow::testing
