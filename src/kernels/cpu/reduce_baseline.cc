// Portable kernels: plain C++ for any x86-64 (SSE2 at most, which the compiler
// may use on its own). They define the reference semantics (scalar.h) that the
// SIMD tables must reproduce bit for bit, and serve CPUs without AVX2/F16C.
#include "kernels/cpu/simd_driver.h"

namespace gflow::kernels::cpu {
namespace {

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
                    ScalarLane<int32_t>, ScalarLane<int64_t>, ScalarLane<uint8_t>,
                    ScalarLane<int8_t>, ScalarLane<int16_t>>(Isa::kBaseline);

}  // namespace

const KernelTable& baselineTable() {
  return kBaselineTable;
}

}  // namespace gflow::kernels::cpu
