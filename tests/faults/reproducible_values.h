// The inputs of the reproducible-mode process test
// (reproducible_process_test.cc and fault_worker's `reproduce` mode): float32
// values spread over 2^-12 .. 2^12, so that the order of a sum changes its
// rounding; and the digest of a result.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace gflow::faulttest {

inline float reproducibleValue(int rank, size_t i) {
  uint64_t z = (static_cast<uint64_t>(rank) << 40) + i + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  const double mant = static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  const int expo = static_cast<int>((z & 31) % 25) - 12;
  return static_cast<float>(std::ldexp(mant, expo));
}

inline std::vector<float> reproducibleInput(int rank, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = reproducibleValue(rank, i);
  return v;
}

// FNV-1a over the bytes of `v`.
inline uint64_t digestOf(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ULL;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

}  // namespace gflow::faulttest
