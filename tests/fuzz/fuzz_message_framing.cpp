// Fuzz target: the engine's message framing (8-byte header: salted tag, a by-address flag and a 47-bit
// length, payload, padding to 8 bytes), as parsed by receivers in runTransfers. This pipe cannot read
// a sender's memory, so a header flagged by address must fail cleanly, whatever its length.
//
// Input layout: byte 0 picks how many receives (1..4) and how the stream is chunked; then 4 bytes per
// receive (kind + element size, length, tag); the rest is the byte stream arriving on the pipe, handed
// over in pieces of varying size. The receiver must either complete every receive (then each payload is
// exactly the stream's bytes after its header) or throw chorus::Error (wrong tag or length, or a stream
// that ends early, reported as a timeout). Never a crash, overread or sanitizer report.
//
// A second, cheap property: MessageHeader::decode(encode(tag, n)) gives back tag and n, and a sender's
// stream for those receives is always accepted.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "chorus/chorus.hpp"
#include "engine/transfer.hpp"
#include "engine/waiter.hpp"

namespace {

using namespace chorus;
using namespace chorus::engine;

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_message_framing: %s\n", what);
  std::abort();
}

class StreamRecvPipe : public transport::RecvPipe {
 public:
  // The stream is copied to 8-aligned memory, as a pipe's buffer is (fuzzer inputs are not aligned).
  StreamRecvPipe(std::span<const uint8_t> stream, uint8_t chunkSeed)
      : storage_((stream.size() + 7) / 8), size_(stream.size()), seed_(chunkSeed) {
    if (!stream.empty()) std::memcpy(storage_.data(), stream.data(), stream.size());
  }
  std::span<const std::byte> peek() override {
    // Like a ring buffer of capacity C (a multiple of 64) whose writer has committed k 8-byte units
    // ahead: spans end at varying 8-aligned offsets and never split an aligned 8-byte unit (the
    // alignment contract of transports/pipe.hpp), so headers arrive whole but payloads in pieces.
    const size_t capacity = 64 * (1 + seed_ % 4);
    const size_t units = 1 + ((seed_ >> 2) + at_ / 8) % 8;
    const size_t end = std::min({(at_ / 8 + units) * 8, (at_ / capacity + 1) * capacity, size_});
    return {reinterpret_cast<const std::byte*>(storage_.data()) + at_, end - at_};
  }
  void consume(size_t n) override { at_ += n; }
  size_t consumed() const { return at_; }

 private:
  std::vector<uint64_t> storage_;
  size_t size_;
  size_t at_ = 0;
  uint8_t seed_;
};

class VectorSendPipe : public transport::SendPipe {
 public:
  std::span<std::byte> reserve() override {
    buf_.resize(used_ + 24);
    return {buf_.data() + used_, 24};
  }
  void commit(size_t n) override { used_ += n; }
  std::vector<uint8_t> bytes() const {
    return {reinterpret_cast<const uint8_t*>(buf_.data()),
            reinterpret_cast<const uint8_t*>(buf_.data()) + used_};
  }

 private:
  std::vector<std::byte> buf_;
  size_t used_ = 0;
};

class OnePeer : public PipeSet {
 public:
  OnePeer(transport::SendPipe* s, transport::RecvPipe* r) : send_(s), recv_(r) {}
  transport::SendPipe& sendPipe(int) override { return *send_; }
  transport::RecvPipe& recvPipe(int) override { return *recv_; }

 private:
  transport::SendPipe* send_;
  transport::RecvPipe* recv_;
};

class AlwaysHealthy : public Health {
 public:
  bool abortRequested() const override { return false; }
  void checkHealth(FunctionRef<bool(int)>) override {}
};

struct Spec {
  bool reduce;
  size_t elemSize;
  size_t bytes;
  uint16_t tag;
};

// Runs receives over `stream`; true if they all completed, false if the engine threw chorus::Error.
bool receive(const std::vector<Spec>& specs, std::span<const uint8_t> stream, uint8_t chunkSeed,
             std::vector<std::vector<uint8_t>>& out, size_t& consumed) {
  StreamRecvPipe pipe(stream, chunkSeed);
  VectorSendPipe unused;
  OnePeer peers(&unused, &pipe);
  AlwaysHealthy health;
  // A deadline already passed: the first idle poll (the stream ran dry) throws a timeout at once.
  Waiter waiter(health, Clock::now(), std::chrono::milliseconds(0), WaitPolicy::Yield);
  std::vector<Transfer> ts;
  out.assign(specs.size(), {});
  for (size_t i = 0; i < specs.size(); ++i) {
    out[i].assign(specs[i].bytes, 0);
    if (specs[i].reduce) {
      // Sum into zeros: the result equals the received bytes.
      const DataType type = specs[i].elemSize == 4 ? DataType::Int32 : DataType::Uint8;
      ts.push_back(Transfer::recvReduce(1, out[i].data(), out[i].data(), specs[i].bytes, type, ReduceOp::Sum,
                                        0, specs[i].tag));
    } else {
      ts.push_back(Transfer::recv(1, out[i].data(), specs[i].bytes, specs[i].elemSize, specs[i].tag));
    }
  }
  try {
    runTransfers(ts, peers, 0, waiter, [] { return std::string("fuzz"); });
  } catch (const Error&) {
    return false;
  }
  consumed = pipe.consumed();
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t count = 1 + (data[0] & 3);
  const uint8_t chunkSeed = static_cast<uint8_t>(data[0] >> 2);
  if (size < 1 + 4 * count) return 0;
  std::vector<Spec> specs;
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* d = data + 1 + 4 * i;
    Spec s{};
    s.reduce = d[0] & 1;
    s.elemSize = s.reduce ? ((d[0] & 2) ? 4 : 1) : (size_t{1} << ((d[0] >> 1) & 3));
    s.bytes = (size_t{d[1]} / s.elemSize) * s.elemSize;
    s.tag = static_cast<uint16_t>(d[2] | (d[3] << 8));
    specs.push_back(s);
  }
  const std::span<const uint8_t> stream(data + 1 + 4 * count, size - 1 - 4 * count);

  // 1. Arbitrary stream: completes with the stream's payloads, or fails cleanly.
  std::vector<std::vector<uint8_t>> got;
  size_t consumed = 0;
  if (receive(specs, stream, chunkSeed, got, consumed)) {
    size_t at = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      uint64_t h = 0;
      std::memcpy(&h, stream.data() + at, 8);
      const MessageHeader header = MessageHeader::decode(h);
      if (header.tag != specs[i].tag || header.length != specs[i].bytes) bug("accepted a mismatched header");
      at += 8;
      if (!std::equal(got[i].begin(), got[i].end(), stream.begin() + static_cast<ptrdiff_t>(at))) {
        bug("payload differs from the stream");
      }
      at += (specs[i].bytes + 7) / 8 * 8;
    }
    if (at != consumed) bug("consumed a different number of bytes than the framing says");
  }

  // 2. Header round trip for every spec.
  for (const Spec& s : specs) {
    const MessageHeader h = MessageHeader::decode(MessageHeader::encode(s.tag, s.bytes));
    if (h.tag != s.tag || h.length != s.bytes) bug("header round trip failed");
  }

  // 3. What a sender writes for these messages is always received intact.
  VectorSendPipe sendPipe;
  StreamRecvPipe noRecv({}, 0);
  OnePeer sender(&sendPipe, &noRecv);
  AlwaysHealthy health;
  Waiter waiter(health, Clock::now() + std::chrono::seconds(10), std::chrono::seconds(10), WaitPolicy::Yield);
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<Transfer> sends;
  for (size_t i = 0; i < specs.size(); ++i) {
    payloads.emplace_back(specs[i].bytes);
    for (size_t k = 0; k < specs[i].bytes; ++k)
      payloads[i][k] = static_cast<uint8_t>(stream.empty() ? k : stream[k % stream.size()]);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    sends.push_back(Transfer::send(1, payloads[i].data(), specs[i].bytes, specs[i].elemSize, specs[i].tag));
  }
  runTransfers(sends, sender, 0, waiter, [] { return std::string("fuzz send"); });
  const std::vector<uint8_t> wire = sendPipe.bytes();
  if (!receive(specs, wire, chunkSeed, got, consumed)) bug("a sender's own stream was rejected");
  if (consumed != wire.size()) bug("stream not consumed exactly");
  for (size_t i = 0; i < specs.size(); ++i) {
    if (got[i] != payloads[i]) bug("round-tripped payload differs");
  }
  return 0;
}
