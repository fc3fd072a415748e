// Wire protocol between makeTcpStore clients and TcpStoreServer.
//
// Strict request/reply over one TCP connection: a client sends one request and reads its reply before
// sending the next. All integers are little-endian, whatever the hosts' byte order.
//
// Handshake (fixed sizes, before any request):
//   server -> client  hello    48 bytes: "chorusS1", u8 auth, 7 zero bytes, server nonce (32 bytes)
//   client -> server  hello    80 bytes: "chorusC1", u8 auth, 7 zero bytes, client nonce (32 bytes),
//                                        client proof (32 bytes)
//   server -> client  verdict  48 bytes: "chorusV1", u8 verdict, 7 zero bytes, server proof (32 bytes)
// auth is 0 (the store has no secret: proofs are zero) or 1 (HMAC-SHA256 with the job secret, see
// auth.hpp: the client proves with label kClientLabel, the server with kServerLabel). The server
// accepts only a client whose auth equals its own and whose proof is right; any other verdict is
// followed by closing the connection. The client in turn accepts only a server that proves the secret
// when it has one. A connection that has not completed the handshake within kHandshakeTimeout is closed.
//
// Request (13-byte header, then the body):
//   u8  op          1 SET, 2 TRYGET, 3 ADD, 4 CHECK, 5 ERASE
//   u32 key length  1..Store::kMaxKeyBytes (0 for CHECK)
//   u64 value length
//   key bytes, then value bytes
//
//   SET     key, value (<= Store::kMaxValueBytes)  -> OK
//   TRYGET  key, no value                          -> OK + value, or NOT_FOUND (never waits)
//   ADD     key, value = i64 delta (8 bytes)       -> OK + i64 new value (8 bytes), or INVALID + text
//   CHECK   no key, value = keys, each as u32 length + bytes (>= 1 key, whole value consumed)
//                                                  -> OK if every key exists, else NOT_FOUND
//   ERASE   key, no value                          -> OK if the key existed, else NOT_FOUND
//
// Reply (9-byte header, then the payload):
//   u8  status      0 OK, 1 NOT_FOUND, 2 INVALID (payload: a message for the caller)
//   u64 payload length (<= Store::kMaxValueBytes)
//   payload bytes
//
// The server validates the header as soon as its 13 bytes arrive; an unknown op or any length out of
// bounds for the op closes that connection at once (before the body is read), as does a malformed CHECK
// list. There is no blocking GET on the wire: clients poll TRYGET, so the server never parks a reply
// and a client giving up on a wait leaves the stream in step.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "chorus/store.hpp"

namespace chorus::tcpstore {

enum class Op : uint8_t { Set = 1, TryGet = 2, Add = 3, Check = 4, Erase = 5 };
enum class Auth : uint8_t { None = 0, HmacSha256 = 1 };
enum class Verdict : uint8_t {
  Accepted = 0,
  WrongSecret = 1,       // the client's proof is wrong (a different secret)
  SecretRequired = 2,    // the store has a secret and the client none
  UnexpectedSecret = 3,  // the client has a secret and the store none
  Malformed = 4,         // not a Chorus client hello (bad magic or reserved bytes)
};

constexpr char kServerHelloMagic[8] = {'c', 'h', 'o', 'r', 'u', 's', 'S', '1'};
constexpr char kClientHelloMagic[8] = {'c', 'h', 'o', 'r', 'u', 's', 'C', '1'};
constexpr char kVerdictMagic[8] = {'c', 'h', 'o', 'r', 'u', 's', 'V', '1'};
constexpr size_t kServerHelloBytes = 48;
constexpr size_t kClientHelloBytes = 80;
constexpr size_t kVerdictBytes = 48;
constexpr const char* kClientLabel = "chorus tcp store v1 client";
constexpr const char* kServerLabel = "chorus tcp store v1 server";
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
enum class Status : uint8_t { Ok = 0, NotFound = 1, Invalid = 2 };

constexpr size_t kRequestHeaderBytes = 13;
constexpr size_t kReplyHeaderBytes = 9;
constexpr size_t kMaxPayloadBytes = Store::kMaxValueBytes;

inline void putU32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline void putU64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline uint32_t getU32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
inline uint64_t getU64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace chorus::tcpstore
