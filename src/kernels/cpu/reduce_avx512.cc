// AVX-512 kernels (512-bit; F, BW, DQ, VL). Compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512dq -mavx2 -mfma -mf16c; only reached through
// tableFor(Isa::kAvx512), which checks the CPU and that the OS saves ZMM state.
//
// The same lanes as reduce_avx2.cc at twice the width, with mask registers in
// place of blends; see that file for why each op gives the scalar bits.
// GCC 12 reports its own _mm512_undefined_*() placeholders as "maybe
// uninitialized" once the intrinsics are inlined (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include "kernels/cpu/simd_driver.h"

namespace gflow::kernels::cpu {
namespace {

// ---- float32 / float64 ---------------------------------------------------------

struct F32x16 {
  using T = float;
  using V = __m512;
  static constexpr size_t kLanes = 16;
  static V load(const void* p) { return _mm512_loadu_ps(p); }
  static void store(void* p, V v) { _mm512_storeu_ps(p, v); }
  static V nan() { return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(kNanF32))); }
  static V canon(V r) {
    return _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q), nan());
  }
  static V nanIfEither(V r, V a, V b) {
    return _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), nan());
  }
  static V sum(V a, V b) { return canon(_mm512_add_ps(a, b)); }
  static V prod(V a, V b) { return canon(_mm512_mul_ps(a, b)); }
  static V min(V a, V b) {
    return nanIfEither(_mm512_or_ps(_mm512_min_ps(a, b), _mm512_min_ps(b, a)), a, b);
  }
  static V max(V a, V b) {
    return nanIfEither(_mm512_and_ps(_mm512_max_ps(a, b), _mm512_max_ps(b, a)), a, b);
  }
};

struct F64x8 {
  using T = double;
  using V = __m512d;
  static constexpr size_t kLanes = 8;
  static V load(const void* p) { return _mm512_loadu_pd(p); }
  static void store(void* p, V v) { _mm512_storeu_pd(p, v); }
  static V nan() { return _mm512_castsi512_pd(_mm512_set1_epi64(static_cast<long long>(kNanF64))); }
  static V canon(V r) {
    return _mm512_mask_mov_pd(r, _mm512_cmp_pd_mask(r, r, _CMP_UNORD_Q), nan());
  }
  static V nanIfEither(V r, V a, V b) {
    return _mm512_mask_mov_pd(r, _mm512_cmp_pd_mask(a, b, _CMP_UNORD_Q), nan());
  }
  static V sum(V a, V b) { return canon(_mm512_add_pd(a, b)); }
  static V prod(V a, V b) { return canon(_mm512_mul_pd(a, b)); }
  static V min(V a, V b) {
    return nanIfEither(_mm512_or_pd(_mm512_min_pd(a, b), _mm512_min_pd(b, a)), a, b);
  }
  static V max(V a, V b) {
    return nanIfEither(_mm512_and_pd(_mm512_max_pd(a, b), _mm512_max_pd(b, a)), a, b);
  }
};

// ---- float16 / bfloat16: widen to float32, apply the float32 op, round once ----

struct F16x16 : F32x16 {
  using T = uint16_t;
  static V load(const void* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  }
  static void store(void* p, V v) {
    _mm256_storeu_si256(static_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

struct BF16x16 : F32x16 {
  using T = uint16_t;
  static V load(const void* p) {
    const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // RNE by integer add (floatToBfloat16Scalar without its NaN branch), in the
  // low 16 bits of each 32-bit lane.
  static __m512i round(__m512i x) {
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)),
                             16);
  }
  // Every lane is <= 0xFFFF, so the truncating narrow is exact.
  static void pack(void* p, __m512i r) {
    _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  // Reduce results carry no NaN but the canonical one, which rounds to the
  // canonical bfloat16 NaN on its own.
  static void store(void* p, V v) { pack(p, round(_mm512_castps_si512(v))); }
};

// Narrowing arbitrary floats: NaN lanes keep sign and top payload, made quiet.
struct BF16x16Convert : BF16x16 {
  static void store(void* p, V v) {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    pack(p, _mm512_mask_mov_epi32(round(x), _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), quiet));
  }
};

// ---- integers (wrap around) ------------------------------------------------------

struct IntLoadStore {
  using V = __m512i;
  static V load(const void* p) { return _mm512_loadu_si512(p); }
  static void store(void* p, V v) { _mm512_storeu_si512(p, v); }
};

struct I32x16 : IntLoadStore {
  using T = int32_t;
  static constexpr size_t kLanes = 16;
  static V sum(V a, V b) { return _mm512_add_epi32(a, b); }
  static V prod(V a, V b) { return _mm512_mullo_epi32(a, b); }
  static V min(V a, V b) { return _mm512_min_epi32(a, b); }
  static V max(V a, V b) { return _mm512_max_epi32(a, b); }
};

struct I64x8 : IntLoadStore {
  using T = int64_t;
  static constexpr size_t kLanes = 8;
  static V sum(V a, V b) { return _mm512_add_epi64(a, b); }
  static V prod(V a, V b) { return _mm512_mullo_epi64(a, b); }  // AVX-512DQ
  static V min(V a, V b) { return _mm512_min_epi64(a, b); }
  static V max(V a, V b) { return _mm512_max_epi64(a, b); }
};

struct U8x64 : IntLoadStore {
  using T = uint8_t;
  static constexpr size_t kLanes = 64;
  static V sum(V a, V b) { return _mm512_add_epi8(a, b); }
  // No byte multiply: multiply even and odd bytes as 16-bit words and keep the
  // low byte of each product.
  static V prod(V a, V b) {
    const V even = _mm512_and_si512(_mm512_mullo_epi16(a, b), _mm512_set1_epi16(0x00FF));
    const V odd =
        _mm512_slli_epi16(_mm512_mullo_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(b, 8)), 8);
    return _mm512_or_si512(even, odd);
  }
  static V min(V a, V b) { return _mm512_min_epu8(a, b); }
  static V max(V a, V b) { return _mm512_max_epu8(a, b); }
};

struct I8x64 : U8x64 {
  using T = int8_t;  // sum and prod: the same low bits as unsigned
  static V min(V a, V b) { return _mm512_min_epi8(a, b); }
  static V max(V a, V b) { return _mm512_max_epi8(a, b); }
};

struct I16x32 : IntLoadStore {
  using T = int16_t;
  static constexpr size_t kLanes = 32;
  static V sum(V a, V b) { return _mm512_add_epi16(a, b); }
  static V prod(V a, V b) { return _mm512_mullo_epi16(a, b); }
  static V min(V a, V b) { return _mm512_min_epi16(a, b); }
  static V max(V a, V b) { return _mm512_max_epi16(a, b); }
};

constexpr KernelTable kAvx512Table =
    makeVectorTable<F32x16, F16x16, BF16x16, F64x8, I32x16, I64x8, U8x64, I8x64, I16x32,
                    BF16x16Convert>(Isa::kAvx512);

}  // namespace

const KernelTable& avx512Table() {
  return kAvx512Table;
}

}  // namespace gflow::kernels::cpu
