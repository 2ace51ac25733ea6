// Job-token authentication: SHA-256, HMAC-SHA256 and the mutual challenge
// that every store and data connection runs first. The token never travels;
// each side proves it knows the token by an HMAC over both sides' random
// nonces and a label naming the connection's purpose.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/deadline.h"

namespace gflow::auth {

using Digest = std::array<uint8_t, 32>;
using Nonce = std::array<uint8_t, 16>;

Digest sha256(const void* data, size_t len);
Digest hmacSha256(const std::string& key, const void* data, size_t len);
bool equalConstantTime(const Digest& a, const Digest& b);
Nonce randomNonce();        // getrandom(2)
std::string randomToken();  // 32 random bytes as 64 hex characters

// Mutual challenge-response over a connected socket. Both sides must use the
// same token and label; the side that connected passes initiator=true.
// Wire: magic+version+nonce each way, then HMAC(token, label|role|nonces)
// each way. Throws Error(kUnauthorized) when the peer's proof is wrong or its
// magic/version is not gflow's, kTimeout/kPeerLost from the socket. An empty
// token still runs the exchange (so a side with a token never accepts one
// without).
void authenticate(int fd, const std::string& token, const std::string& label, bool initiator,
                  Deadline deadline);

}  // namespace gflow::auth
