// The RDMA verbs transport: pipes to ranks on other hosts over reliable-connected queue pairs, as
// NCCL's IB transport moves data.
//
// Each pair of ranks has one RC queue pair. Each direction is a ring of the same size on both
// sides, registered with the HCA: the sender RDMA-writes what the engine committed from its send
// ring into the same offset of the receiver's ring, with the length as immediate data, so the
// receiver learns of it from a completion, with no copy and no CPU on the sending side's peer.
// The receiver returns space by RDMA-writing how many bytes it consumed into a credit word of the
// sender (inline writes). A failure notice is written into a notice area of the peer with a
// flagged immediate. Connection set-up (queue pair numbers, LIDs/GIDs, ring addresses and keys) goes
// through the store.
//
// Failures: a completion with an error (the peer's queue pair is gone: retries exceeded) makes the
// next read from that peer, once everything that arrived before it has been read, throw PeerError
// naming the rank; while waiting, every peer is probed with a zero-byte write once a second, so a
// peer that died while this rank only receives is found too.
//
// libibverbs is loaded at run time (verbs_api.hpp); tests give the transport an in-process fake.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "chorus/store.hpp"
#include "transports/transport.hpp"

namespace chorus::transport {

struct VerbsApi;

struct IbOptions {
  std::string commId;                    // checked when connecting
  size_t ringBytes = size_t{512} << 10;  // receive ring per peer (the sender's ring matches it)
  std::chrono::milliseconds timeout{300'000};
  std::string hca;                  // CHORUS_IB_HCA: device name prefix ("" = the first with an active port)
  int port = 1;                     // HCA port
  int gidIndex = 0;                 // CHORUS_IB_GID_INDEX: the GID used on RoCE (Ethernet link layer)
  const VerbsApi* verbs = nullptr;  // null: libibverbs
};

/// Whether an RDMA device with an active port can be used; if not, why ("ibv_get_device_list:
/// Function not implemented (errno 38)", "no RDMA devices", "mlx5_0 port 1 is not active").
bool ibAvailable(const IbOptions& options, std::string* why);

class IbTransport final : public Transport {
 public:
  /// Collective over every rank r with peers[r] true (and this rank). Throws chorus::Error naming
  /// the device, the verbs call and the peer on failure.
  IbTransport(Store& store, int rank, int nranks, const std::vector<bool>& peers, const IbOptions& options);
  /// Waits (bounded) for the writes it posted to complete, then releases every verbs resource.
  ~IbTransport() override;
  IbTransport(const IbTransport&) = delete;
  IbTransport& operator=(const IbTransport&) = delete;

  const char* name() const override { return "ib"; }
  SendPipe& sendPipe(int peer) override;
  RecvPipe& recvPipe(int peer) override;
  void publishFailure(chorusResult_t code, const std::string& text) override;
  int findPeerFailure(chorusResult_t* code, std::string* text) override;
  bool waitReadable(std::chrono::microseconds timeout) override;
  const std::string& describeLocal() const override { return local_; }
  size_t memoryBytes() const override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::string local_;
};

}  // namespace chorus::transport
