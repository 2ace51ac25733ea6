// CUDA tensors on a machine without a usable GPU (this project's CI): every
// op that meets one fails with a clear invalid_argument naming why (the
// component not built or not loadable, or the CUDA runtime's reason), on
// every rank, without touching the memory. With a GPU, tests/gpu/ runs the
// staged collectives instead.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gflow/gflow.h"
#include "kernels/cuda/plugin.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

TEST(DeviceTensors, WithoutAUsableGpuEveryOpSaysWhy) {
  std::string why;
  if (cuda::load(&why)) GTEST_SKIP() << "this machine has a usable GPU (tests/gpu covers it)";
#ifdef GFLOW_TEST_CUDA_PLUGIN
  // The component is built here: the reason is the CUDA runtime's.
  EXPECT_NE(why.find("GPU"), std::string::npos) << why;
#else
  EXPECT_NE(why.find("could not be loaded"), std::string::npos) << why;
#endif
  const Device gpu{DeviceType::kCUDA, 0};
  // Each op on a fresh world: an invalid argument fails the communicator.
  for (int op = 0; op < 4; ++op) {
    testing::runRanksCollect(2, [&](Communicator& c) {
      std::vector<float> v(8, 1.0f), all(16);
      try {
        switch (op) {
          case 0: c.allreduce(Tensor(v.data(), 8, DataType::kFloat32, gpu)); break;
          case 1: c.broadcast(Tensor(v.data(), 8, DataType::kFloat32, gpu), 0); break;
          case 2:
            c.allgather(tensor(v.data(), 8), Tensor(all.data(), 16, DataType::kFloat32, gpu));
            break;
          default:
            c.reduceScatter(Tensor(all.data(), 16, DataType::kFloat32, gpu), tensor(v.data(), 8));
        }
        ADD_FAILURE() << "op " << op << " accepted a cuda tensor without a GPU";
      } catch (const Error& e) {
        // The peer may hear of it first (peer_lost); a rank's own check names it.
        if (e.code() == ErrorCode::kInvalidArgument) {
          EXPECT_NE(std::string(e.what()).find("is a cuda tensor, but " + why), std::string::npos)
              << e.what();
        }
      }
      EXPECT_EQ(v[7], 1.0f);
    });
  }
}

}  // namespace
}  // namespace gflow
