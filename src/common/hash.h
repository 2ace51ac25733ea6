// The hashes gflow computes over small values: FNV-1a steps for digests of op
// descriptions and settings, and SHA-256 truncated to 64 bits for ids derived
// from names. Values that ranks compare (op fingerprints, digests, host ids)
// come from these functions on every rank, so they agree. Not for security:
// authentication uses common/auth.h's HMAC. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/auth.h"

namespace gflow::hash {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

// One FNV-1a step per byte of `word`, least significant byte first (the bytes
// of its little-endian image, on any host).
constexpr uint64_t fnv1aWord(uint64_t h, uint64_t word) {
  for (int i = 0; i < 8; ++i) {
    h ^= (word >> (8 * i)) & 0xff;
    h *= kFnvPrime;
  }
  return h;
}

// One FNV-style step over a whole 64-bit value: (h ^ v) * prime. Cheaper and
// weaker than fnv1aWord; enough where equal inputs must give equal digests.
constexpr uint64_t mix(uint64_t h, uint64_t v) {
  return (h ^ v) * kFnvPrime;
}

// The first 8 bytes of SHA-256(data), in host byte order: an id for a name.
inline uint64_t sha256Id(const void* data, size_t len) {
  const auth::Digest d = auth::sha256(data, len);
  uint64_t id;
  std::memcpy(&id, d.data(), sizeof(id));
  return id;
}
inline uint64_t sha256Id(const std::string& s) {
  return sha256Id(s.data(), s.size());
}

}  // namespace gflow::hash
