// Job secrets and the mutual challenge-response that proves them on a connection.
//
// Both sides send a fresh random nonce; each then proves it holds the secret with
// HMAC-SHA256(secret, label || serverNonce || clientNonce), with a different label per direction so
// neither proof can be reflected back as the other. The secret itself never crosses the wire, and a
// recorded exchange cannot be replayed (the other side's nonce is new every time).
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace chorus::auth {

constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = 32;  // HMAC-SHA256
constexpr size_t kMinSecretBytes = 16;
constexpr size_t kMaxSecretBytes = 1024;

using Nonce = std::array<std::byte, kNonceBytes>;
using Proof = std::array<std::byte, kProofBytes>;

/// True when this build can authenticate (it was built with OpenSSL's libcrypto).
bool available();

/// Throws chorusInvalidArgument, naming `what`, unless the secret is empty (no authentication) or
/// kMinSecretBytes..kMaxSecretBytes long; throws chorusInvalidUsage for a non-empty secret in a build
/// without authentication.
void validateSecret(const std::string& secret, std::string_view what);

/// kNonceBytes from the kernel's random source.
Nonce randomNonce();

/// `bytes` random bytes as lowercase hex (2 * bytes characters).
std::string randomHex(size_t bytes);

/// HMAC-SHA256(secret, label || serverNonce || clientNonce).
Proof prove(const std::string& secret, std::string_view label, const Nonce& serverNonce,
            const Nonce& clientNonce);

/// Compares in time independent of where the proofs differ.
bool equalProofs(const Proof& a, const Proof& b);

}  // namespace chorus::auth
