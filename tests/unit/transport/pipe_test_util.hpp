// Helpers shared by the tests of the transports between hosts (TCP, UCX, verbs): two transports of
// one kind as ranks 0 and 1 on two threads, a byte pattern per sender, and loops that push it
// through the pipes the way the engine does (reserve, commit, flush; peek, consume).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "chorus/store.hpp"
#include "transports/transport.hpp"

namespace chorus::transport::pipetest {

/// Ranks 0 and 1, each a T(store, rank, 2, {true, true}, options) made on its own thread (set-up
/// is collective); an error on either side is rethrown.
template <class T, class Options>
struct TransportPair {
  std::unique_ptr<T> t[2];
  explicit TransportPair(const Options& o) : TransportPair(o, o) {}
  TransportPair(const Options& o0, const Options& o1) {
    auto store = makeInProcessStore();
    const std::vector<bool> peers = {true, true};
    std::exception_ptr otherError;
    std::thread other([&] {
      try {
        t[1] = std::make_unique<T>(*store, 1, 2, peers, o1);
      } catch (...) {
        otherError = std::current_exception();
      }
    });
    try {
      t[0] = std::make_unique<T>(*store, 0, 2, peers, o0);
    } catch (...) {
      other.join();
      throw;
    }
    other.join();
    if (otherError) std::rethrow_exception(otherError);
  }
};

/// Byte i of what rank `from` sends.
inline uint8_t pattern(uint64_t i, int from) {
  return static_cast<uint8_t>((i * 131 + (i >> 13) + from * 7) & 0xFF);
}

/// Writes `bytes` of this rank's pattern to the other rank while reading as many from it. Commits
/// are of odd sizes: chunk + (sent % 7) * stride bytes (stride 8 keeps whole 8-byte elements, as the
/// engine does; every span read must then be whole elements too). Counts wrong bytes in *wrong.
inline void exchange(Transport& t, int self, size_t bytes, size_t chunk, size_t stride, size_t* wrong) {
  const int peer = 1 - self;
  SendPipe& out = t.sendPipe(peer);
  RecvPipe& in = t.recvPipe(peer);
  uint64_t sent = 0, got = 0;
  while (sent < bytes || got < bytes) {
    if (sent < bytes) {
      auto s = out.reserve();
      const size_t n = std::min<size_t>({s.size(), bytes - sent, chunk + sent % 7 * stride});
      for (size_t i = 0; i < n; ++i) s[i] = std::byte{pattern(sent + i, self)};
      if (n) {
        out.commit(n);
        out.flush();
      }
      sent += n;
    }
    if (got < bytes) {
      auto s = in.peek();
      EXPECT_EQ(s.size() % stride, 0u);
      for (size_t i = 0; i < s.size(); ++i) *wrong += s[i] != std::byte{pattern(got + i, peer)};
      in.consume(s.size());
      got += s.size();
    }
  }
}

/// Rank 0's pattern through the ring, as fast as the pipe takes it (flushed after every commit, as
/// the engine does after every step); waits while the ring is full.
inline void commitPattern(SendPipe& out, size_t bytes) {
  for (size_t sent = 0; sent < bytes;) {
    auto s = out.reserve();
    const size_t n = std::min(s.size(), bytes - sent);
    for (size_t i = 0; i < n; ++i) s[i] = std::byte{pattern(sent + i, 0)};
    out.commit(n);
    out.flush();
    sent += n;
  }
}

}  // namespace chorus::transport::pipetest
