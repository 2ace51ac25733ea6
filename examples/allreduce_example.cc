// Averages a "gradient" across ranks. Run: gflowrun -n 4 ./allreduce_example
#include <gflow/gflow.h>

#include <cstdio>
#include <vector>

int main() {
  try {
    auto comm = gflow::init();  // rank, size, root and token from the environment
    std::vector<float> grad(1 << 20, static_cast<float>(comm->rank() + 1));

    gflow::allreduce(gflow::tensor(grad.data(), grad.size()), gflow::ReduceOp::kAvg);

    // Overlap: start a second allreduce and wait for it later.
    std::vector<float> more(1000, 1.0f);
    gflow::Work work = comm->allreduceAsync(gflow::tensor(more.data(), more.size()));
    work.wait();

    const float want = (comm->size() + 1) / 2.0f;
    if (grad[0] != want || more[999] != static_cast<float>(comm->size())) {
      std::fprintf(stderr, "rank %d: wrong result %f (want %f)\n", comm->rank(), grad[0], want);
      return 1;
    }
    if (comm->rank() == 0)
      std::printf("ok: %d ranks averaged %zu floats\n", comm->size(), grad.size());
    gflow::finalize();
  } catch (const gflow::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
