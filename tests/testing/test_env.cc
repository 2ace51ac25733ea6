// Test-binary defaults: tiny ring pieces, windows and shm chunks so that pipelining,
// several pieces per segment and several rounds per op are exercised with
// small buffers. Set before any GFLOW_* parameter is first read (and cached).
#include <cstdlib>

namespace {
struct TestEnvironment {
  TestEnvironment() {
    setenv("GFLOW_PIECE_BYTES", "1024", 0);
    setenv("GFLOW_RING_WINDOW", "3", 0);
    // Shared-memory slots of 4 KiB: collectives of a few KiB already take
    // several chunk iterations (both slots, wrap-around).
    setenv("GFLOW_SHM_CHUNK", "4K", 0);
    // Shared-memory allreduces of 16 KiB and more read peers' buffers
    // directly (where the kernel allows it) at every group size, smaller
    // ones use the slots.
    setenv("GFLOW_SHM_SINGLE_COPY", "16K-", 0);
    // Network-transport messages of 4 KiB and more between the ranks of one
    // host (point-to-point under GFLOW_SHM=1) go by single copy.
    setenv("GFLOW_LOCAL_SINGLE_COPY", "4K", 0);
    // ... and every frame between them goes through local rings of 4 KiB,
    // which wrap and fill all the time.
    setenv("GFLOW_LOCAL_RING", "4K", 0);
    // TCP messages of 64 KiB and more wait for their receive (rendezvous).
    setenv("GFLOW_RENDEZVOUS", "64K", 0);
    // Hierarchical allreduces of more than 8 KiB run as pipelined segments.
    setenv("GFLOW_HIER_SEGMENT", "4K", 0);
    // verbs: ring pieces (1 KiB) go zero-copy (rendezvous), smaller messages
    // through a ring of 8 eager slots, so credits run out and come back.
    setenv("GFLOW_IB_EAGER_BYTES", "512", 0);
    setenv("GFLOW_IB_EAGER_SLOTS", "8", 0);
#ifdef GFLOW_TEST_CUDA_PLUGIN
    // The CUDA component of this build (the test binary links libgflow
    // statically, so "next to libgflow" is not where it is).
    setenv("GFLOW_CUDA_PLUGIN", GFLOW_TEST_CUDA_PLUGIN, 0);
#endif
  }
} testEnvironment;
}  // namespace
