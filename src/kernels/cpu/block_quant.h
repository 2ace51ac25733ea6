// Block quantization (kQInt8, kQInt4; docs/compression.md): the scalar
// definition, written as plain loops over one block of kQuantBlock values so
// that each ISA's translation unit (compiled with its own -m flags and
// -ffp-contract=off) vectorises them. Every step is one IEEE operation per
// value (multiply, add, compare) or an order-free maximum, so every ISA
// gives the same bits.
//
// A block is a float32 scale s followed by kQuantBlock signed integers q
// (int8, or int4 packed two per byte, the even value in the low nibble);
// it stands for the values q[i] * s. Quantizing values y: m = max |y[i]|,
// s = m / Q and q[i] = round-to-nearest-even(y[i] * (Q / m)), clamped to
// [-Q, Q] (Q = 127 or 7). A block holding inf or NaN becomes the NaN block
// (s = NaN, q = 0); a block whose m is below kQuantTiny becomes zero.
//
// Internal linkage, like scalar.h: each ISA file instantiates these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gflow/types.h"
#include "kernels/cpu/scalar.h"

namespace gflow::kernels::cpu {
namespace {

constexpr size_t kQB = kQuantBlock;
// 2^-120: below it Q / m could overflow float32; such a block is zero.
constexpr float kQuantTiny = 7.52316384526264e-37f;

struct QInt8Format {
  static constexpr float kQ = 127.0f;
  static constexpr size_t kBytes = kQB;
  static void pack(unsigned char* __restrict out, const float* __restrict q) {
    for (size_t i = 0; i < kQB; ++i) out[i] = static_cast<unsigned char>(static_cast<int8_t>(q[i]));
  }
  static void unpack(float* __restrict q, const unsigned char* __restrict in) {
    for (size_t i = 0; i < kQB; ++i) q[i] = static_cast<float>(static_cast<int8_t>(in[i]));
  }
};

struct QInt4Format {
  static constexpr float kQ = 7.0f;
  static constexpr size_t kBytes = kQB / 2;
  static void pack(unsigned char* __restrict out, const float* __restrict q) {
    for (size_t j = 0; j < kBytes; ++j) {
      const auto lo = static_cast<unsigned>(static_cast<int>(q[2 * j])) & 0xFu;
      const auto hi = static_cast<unsigned>(static_cast<int>(q[2 * j + 1])) & 0xFu;
      out[j] = static_cast<unsigned char>(lo | (hi << 4));
    }
  }
  static void unpack(float* __restrict q, const unsigned char* __restrict in) {
    for (size_t j = 0; j < kBytes; ++j) {
      q[2 * j] =
          static_cast<float>(static_cast<int8_t>(static_cast<unsigned char>(in[j] << 4)) >> 4);
      q[2 * j + 1] = static_cast<float>(static_cast<int8_t>(in[j]) >> 4);
    }
  }
};

template <class Fmt>
constexpr size_t blockBytes() {
  return sizeof(float) + Fmt::kBytes;
}

// Whether any of the block's values is inf or NaN, and its largest magnitude
// (meaningful only when none is). The magnitudes' bit patterns order as the
// magnitudes do, and inf and NaN sort above every finite one, so one integer
// maximum answers both.
inline bool scanBlock(const float* y, float* maxAbs) {
  uint32_t top = 0;
  for (size_t i = 0; i < kQB; ++i) {
    const uint32_t u = bitsOf(y[i]) & 0x7FFFFFFFu;
    top = u > top ? u : top;
  }
  *maxAbs = floatFromBits(top);
  return top >= 0x7F800000u;
}

// out = the block of y (kQB values).
template <class Fmt>
void quantizeBlock(unsigned char* out, const float* y) {
  alignas(64) float q[kQB];
  float m;
  float s;
  if (scanBlock(y, &m)) {
    s = floatFromBits(kNanF32);
    for (float& v : q) v = 0.0f;
  } else if (m < kQuantTiny) {
    s = 0.0f;
    for (float& v : q) v = 0.0f;
  } else {
    s = m / Fmt::kQ;
    const float inv = Fmt::kQ / m;
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer (RNE)
    for (size_t i = 0; i < kQB; ++i) {
      float r = y[i] * inv;
      r = (r + kRound) - kRound;
      r = r > Fmt::kQ ? Fmt::kQ : r;
      q[i] = r < -Fmt::kQ ? -Fmt::kQ : r;
    }
  }
  std::memcpy(out, &s, sizeof s);
  Fmt::pack(out + sizeof s, q);
}

// y = the block's values.
template <class Fmt>
void dequantizeBlock(float* y, const unsigned char* in) {
  float s;
  std::memcpy(&s, in, sizeof s);
  Fmt::unpack(y, in + sizeof s);
  for (size_t i = 0; i < kQB; ++i) y[i] = y[i] * s;
}

// dst = Q(D(a) op D(b)) block by block; dst may alias a or b exactly.
template <class Fmt, int kOp>
void blockReduceLoop(void* dst, const void* a, const void* b, size_t count) {
  constexpr size_t kB = blockBytes<Fmt>();
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
  auto* pd = static_cast<unsigned char*>(dst);
  alignas(64) float x[kQB];
  alignas(64) float y[kQB];
  for (size_t k = 0; k < count; ++k) {
    dequantizeBlock<Fmt>(x, pa + k * kB);
    dequantizeBlock<Fmt>(y, pb + k * kB);
    for (size_t i = 0; i < kQB; ++i) {
      if constexpr (kOp == kOpSum) {
        x[i] = x[i] + y[i];
      } else {
        static_assert(kOp == kOpMin || kOp == kOpMax);
        const float r = (kOp == kOpMin ? y[i] < x[i] : y[i] > x[i]) ? y[i] : x[i];
        // (v - v) is 0, or NaN for an inf or NaN operand: the result is then
        // NaN (and so the NaN block) whichever operand came first.
        x[i] = r + (x[i] - x[i]) + (y[i] - y[i]);
      }
    }
    quantizeBlock<Fmt>(pd + k * kB, x);
  }
}

inline void addResidual(float* y, const float* r, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = y[i] + r[i];
}

// blocks = Q(src * scale + residual) for `count` values (the last block
// padded with zeros); with a residual, residual = what that lost (y - D(Q(y))),
// or zero for a block that held inf or NaN.
template <class Fmt>
void quantizeLoop(void* blocks, const float* src, size_t count, float scale, float* residual) {
  constexpr size_t kB = blockBytes<Fmt>();
  auto* out = static_cast<unsigned char*>(blocks);
  alignas(64) float y[kQB];
  alignas(64) float d[kQB];
  for (size_t at = 0; at < count; at += kQB, out += kB) {
    const size_t n = count - at < kQB ? count - at : kQB;
    float* r = residual != nullptr ? residual + at : nullptr;
    if (n == kQB) {  // constant trip counts: the vectorised case
      for (size_t i = 0; i < kQB; ++i) y[i] = src[at + i] * scale;
      if (r != nullptr) addResidual(y, r, kQB);
    } else {
      for (size_t i = 0; i < kQB; ++i) y[i] = 0.0f;
      for (size_t i = 0; i < n; ++i) y[i] = src[at + i] * scale;
      if (r != nullptr) addResidual(y, r, n);
    }
    quantizeBlock<Fmt>(out, y);
    if (r == nullptr) continue;
    dequantizeBlock<Fmt>(d, out);
    float s;
    std::memcpy(&s, out, sizeof s);
    if (bitsOf(s) == kNanF32) {
      for (size_t i = 0; i < n; ++i) r[i] = 0.0f;
    } else if (n == kQB) {
      for (size_t i = 0; i < kQB; ++i) r[i] = y[i] - d[i];
    } else {
      for (size_t i = 0; i < n; ++i) r[i] = y[i] - d[i];
    }
  }
}

// dst = D(blocks) * scale for `count` values.
template <class Fmt>
void dequantizeLoop(float* dst, const void* blocks, size_t count, float scale) {
  constexpr size_t kB = blockBytes<Fmt>();
  const auto* in = static_cast<const unsigned char*>(blocks);
  alignas(64) float y[kQB];
  for (size_t at = 0; at < count; at += kQB, in += kB) {
    const size_t n = count - at < kQB ? count - at : kQB;
    dequantizeBlock<Fmt>(y, in);
    if (n == kQB) {
      for (size_t i = 0; i < kQB; ++i) dst[at + i] = y[i] * scale;
    } else {
      for (size_t i = 0; i < n; ++i) dst[at + i] = y[i] * scale;
    }
  }
}

}  // namespace
}  // namespace gflow::kernels::cpu
