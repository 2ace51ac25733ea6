// Portable kernels: plain C++ for any x86-64 (SSE2 at most, which the compiler
// may use on its own). They define the reference semantics (scalar.h) that the
// SIMD tables must reproduce bit for bit, and serve CPUs without AVX2/F16C.
#include "kernels/cpu/simd_driver.h"

namespace gflow::kernels::cpu {
namespace {

// One element per "vector": the shared driver then supplies the 4-way unrolled
// loop. Loads and stores go through memcpy because the buffers carry no
// alignment promise, not even the element's own.
template <class Elem>
struct ScalarLane {
  using T = Elem;
  using V = Elem;
  static constexpr size_t kLanes = 1;
  static V load(const void* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(void* p, V v) { std::memcpy(p, &v, sizeof v); }
  static V sum(V a, V b) { return applyScalar<kOpSum>(a, b); }
  static V prod(V a, V b) { return applyScalar<kOpProd>(a, b); }
  static V min(V a, V b) { return applyScalar<kOpMin>(a, b); }
  static V max(V a, V b) { return applyScalar<kOpMax>(a, b); }
};

// Half types: widen to float32, apply the float32 op, round once.
struct HalfLane : ScalarLane<float> {
  using T = uint16_t;
  static V load(const void* p) { return halfToFloatScalar(ScalarLane<uint16_t>::load(p)); }
  static void store(void* p, V v) { ScalarLane<uint16_t>::store(p, floatToHalfScalar(v)); }
};

struct Bfloat16Lane : ScalarLane<float> {
  using T = uint16_t;
  static V load(const void* p) { return bfloat16ToFloatScalar(ScalarLane<uint16_t>::load(p)); }
  static void store(void* p, V v) { ScalarLane<uint16_t>::store(p, floatToBfloat16Scalar(v)); }
};

constexpr KernelTable kBaselineTable =
    makeVectorTable<ScalarLane<float>, HalfLane, Bfloat16Lane, ScalarLane<double>,
                    ScalarLane<int32_t>, ScalarLane<int64_t>, ScalarLane<uint8_t>>(Isa::kBaseline);

}  // namespace

const KernelTable& baselineTable() {
  return kBaselineTable;
}

}  // namespace gflow::kernels::cpu
