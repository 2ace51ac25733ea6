// AVX2 + F16C kernels (256-bit). Compiled with -mavx2 -mfma -mf16c; only
// reached through tableFor(Isa::kAvx2), which checks the CPU and the OS first.
//
// Every op is a single elementwise IEEE operation, so results equal the scalar
// kernels bit for bit. -ffp-contract=off keeps the compiler from fusing a
// multiply and an add of the shared loops (block_quant.h) into an FMA.
#include <immintrin.h>

#include "kernels/cpu/simd_driver.h"

namespace gflow::kernels::cpu {
namespace {

// ---- float32 / float64 ---------------------------------------------------------
// min/max: x86 MINPS returns its second operand when the inputs are equal or
// unordered, so min(a,b) | min(b,a) gives -0 for {-0,+0} and the common value
// otherwise (max uses &, giving +0). Any NaN input then selects the canonical NaN.

struct F32x8 {
  using T = float;
  using V = __m256;
  static constexpr size_t kLanes = 8;
  static V load(const void* p) { return _mm256_loadu_ps(static_cast<const float*>(p)); }
  static void store(void* p, V v) { _mm256_storeu_ps(static_cast<float*>(p), v); }
  static V nan() { return _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kNanF32))); }
  static V canon(V r) { return _mm256_blendv_ps(r, nan(), _mm256_cmp_ps(r, r, _CMP_UNORD_Q)); }
  static V nanIfEither(V r, V a, V b) {
    return _mm256_blendv_ps(r, nan(), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  static V sum(V a, V b) { return canon(_mm256_add_ps(a, b)); }
  static V prod(V a, V b) { return canon(_mm256_mul_ps(a, b)); }
  static V min(V a, V b) {
    return nanIfEither(_mm256_or_ps(_mm256_min_ps(a, b), _mm256_min_ps(b, a)), a, b);
  }
  static V max(V a, V b) {
    return nanIfEither(_mm256_and_ps(_mm256_max_ps(a, b), _mm256_max_ps(b, a)), a, b);
  }
};

struct F64x4 {
  using T = double;
  using V = __m256d;
  static constexpr size_t kLanes = 4;
  static V load(const void* p) { return _mm256_loadu_pd(static_cast<const double*>(p)); }
  static void store(void* p, V v) { _mm256_storeu_pd(static_cast<double*>(p), v); }
  static V nan() {
    return _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(kNanF64)));
  }
  static V canon(V r) { return _mm256_blendv_pd(r, nan(), _mm256_cmp_pd(r, r, _CMP_UNORD_Q)); }
  static V nanIfEither(V r, V a, V b) {
    return _mm256_blendv_pd(r, nan(), _mm256_cmp_pd(a, b, _CMP_UNORD_Q));
  }
  static V sum(V a, V b) { return canon(_mm256_add_pd(a, b)); }
  static V prod(V a, V b) { return canon(_mm256_mul_pd(a, b)); }
  static V min(V a, V b) {
    return nanIfEither(_mm256_or_pd(_mm256_min_pd(a, b), _mm256_min_pd(b, a)), a, b);
  }
  static V max(V a, V b) {
    return nanIfEither(_mm256_and_pd(_mm256_max_pd(a, b), _mm256_max_pd(b, a)), a, b);
  }
};

// ---- float16 / bfloat16: widen to float32, apply the float32 op, round once ----

struct F16x8 : F32x8 {
  using T = uint16_t;
  static V load(const void* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  }
  static void store(void* p, V v) {
    _mm_storeu_si128(static_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

struct BF16x8 : F32x8 {
  using T = uint16_t;
  static V load(const void* p) {
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // RNE by integer add (floatToBfloat16Scalar without its NaN branch), in the
  // low 16 bits of each 32-bit lane.
  static __m256i round(__m256i x) {
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)),
                             16);
  }
  static void pack(void* p, __m256i r) {
    // Every lane is <= 0xFFFF, so the unsigned saturating pack is exact.
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(static_cast<__m128i*>(p), packed);
  }
  // Reduce results carry no NaN but the canonical one, which rounds to the
  // canonical bfloat16 NaN on its own; skipping the NaN fix-up is ~10% in cache.
  static void store(void* p, V v) { pack(p, round(_mm256_castps_si256(v))); }
};

// Narrowing arbitrary floats: a NaN payload could round into inf, so NaN lanes
// keep sign and top payload and are made quiet instead.
struct BF16x8Convert : BF16x8 {
  static void store(void* p, V v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    pack(p, _mm256_blendv_epi8(round(x), quiet, nan));
  }
};

// ---- integers (wrap around) ------------------------------------------------------

struct IntLoadStore {
  using V = __m256i;
  static V load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static void store(void* p, V v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
};

struct I32x8 : IntLoadStore {
  using T = int32_t;
  static constexpr size_t kLanes = 8;
  static V sum(V a, V b) { return _mm256_add_epi32(a, b); }
  static V prod(V a, V b) { return _mm256_mullo_epi32(a, b); }
  static V min(V a, V b) { return _mm256_min_epi32(a, b); }
  static V max(V a, V b) { return _mm256_max_epi32(a, b); }
};

struct I64x4 : IntLoadStore {
  using T = int64_t;
  static constexpr size_t kLanes = 4;
  static V sum(V a, V b) { return _mm256_add_epi64(a, b); }
  // No 64-bit multiply before AVX-512DQ: the low 64 bits of a*b are
  // lo(a)*lo(b) + ((hi(a)*lo(b) + lo(a)*hi(b)) << 32).
  static V prod(V a, V b) {
    const V lo = _mm256_mul_epu32(a, b);
    const V cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                     _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
  }
  static V min(V a, V b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b)); }
  static V max(V a, V b) { return _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b)); }
};

struct U8x32 : IntLoadStore {
  using T = uint8_t;
  static constexpr size_t kLanes = 32;
  static V sum(V a, V b) { return _mm256_add_epi8(a, b); }
  // No byte multiply: multiply even and odd bytes as 16-bit words and keep the
  // low byte of each product.
  static V prod(V a, V b) {
    const V even = _mm256_and_si256(_mm256_mullo_epi16(a, b), _mm256_set1_epi16(0x00FF));
    const V odd =
        _mm256_slli_epi16(_mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8)), 8);
    return _mm256_or_si256(even, odd);
  }
  static V min(V a, V b) { return _mm256_min_epu8(a, b); }
  static V max(V a, V b) { return _mm256_max_epu8(a, b); }
};

struct I8x32 : U8x32 {
  using T = int8_t;  // sum and prod: the same low bits as unsigned
  static V min(V a, V b) { return _mm256_min_epi8(a, b); }
  static V max(V a, V b) { return _mm256_max_epi8(a, b); }
};

struct I16x16 : IntLoadStore {
  using T = int16_t;
  static constexpr size_t kLanes = 16;
  static V sum(V a, V b) { return _mm256_add_epi16(a, b); }
  static V prod(V a, V b) { return _mm256_mullo_epi16(a, b); }
  static V min(V a, V b) { return _mm256_min_epi16(a, b); }
  static V max(V a, V b) { return _mm256_max_epi16(a, b); }
};

constexpr KernelTable kAvx2Table =
    makeVectorTable<F32x8, F16x8, BF16x8, F64x4, I32x8, I64x4, U8x32, I8x32, I16x16, BF16x8Convert>(
        Isa::kAvx2);

}  // namespace

const KernelTable& avx2Table() {
  return kAvx2Table;
}

}  // namespace gflow::kernels::cpu
