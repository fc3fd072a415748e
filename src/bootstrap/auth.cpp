#include "bootstrap/auth.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "base/socket_util.hpp"
#include "chorus/chorus.hpp"

#if CHORUS_HAVE_OPENSSL
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#endif

namespace chorus::auth {

bool available() { return CHORUS_HAVE_OPENSSL != 0; }

void validateSecret(const std::string& secret, std::string_view what) {
  if (secret.empty()) return;
  if (!available()) {
    throw Error(chorusInvalidUsage, std::string(what) +
                                        " is set, but this Chorus build has no authentication (built "
                                        "without OpenSSL: CHORUS_WITH_OPENSSL=OFF)");
  }
  if (secret.size() < kMinSecretBytes || secret.size() > kMaxSecretBytes) {
    throw Error(chorusInvalidArgument, std::string(what) + " must be " + std::to_string(kMinSecretBytes) +
                                           " to " + std::to_string(kMaxSecretBytes) + " bytes long (it is " +
                                           std::to_string(secret.size()) + ")");
  }
}

Nonce randomNonce() {
  Nonce nonce;
  size_t got = 0;
  while (got < nonce.size()) {
    const ssize_t n = ::getrandom(nonce.data() + got, nonce.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(chorusSystemError, net::errnoText("getrandom", errno));
    }
    got += static_cast<size_t>(n);
  }
  return nonce;
}

std::string randomHex(size_t bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * bytes);
  while (text.size() < 2 * bytes) {
    for (std::byte b : randomNonce()) {
      if (text.size() == 2 * bytes) break;
      text.push_back(kDigits[static_cast<unsigned>(b) >> 4]);
      text.push_back(kDigits[static_cast<unsigned>(b) & 15]);
    }
  }
  return text;
}

Proof prove(const std::string& secret, std::string_view label, const Nonce& serverNonce,
            const Nonce& clientNonce) {
  Proof proof{};
#if CHORUS_HAVE_OPENSSL
  std::string message(label);
  message.append(reinterpret_cast<const char*>(serverNonce.data()), serverNonce.size());
  message.append(reinterpret_cast<const char*>(clientNonce.data()), clientNonce.size());
  unsigned int length = 0;
  const unsigned char* out = ::HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
                                    reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                                    reinterpret_cast<unsigned char*>(proof.data()), &length);
  if (out == nullptr || length != proof.size()) {
    throw Error(chorusInternalError, "HMAC-SHA256 failed in OpenSSL");
  }
#else
  (void)secret;
  (void)label;
  (void)serverNonce;
  (void)clientNonce;
  throw Error(chorusInvalidUsage, "this Chorus build has no authentication (built without OpenSSL)");
#endif
  return proof;
}

bool equalProofs(const Proof& a, const Proof& b) {
#if CHORUS_HAVE_OPENSSL
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
#else
  unsigned diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ b[i]);
  return diff == 0;
#endif
}

}  // namespace chorus::auth
