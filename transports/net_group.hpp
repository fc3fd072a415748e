// Transports between hosts, chosen per pair of ranks: each rank offers the kinds it can use, and a
// pair uses the first kind of the preference order (ib, ucx, tcp) that both offer. NetGroup routes
// each remote peer to the transport of its pair.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transports/net_transport.hpp"

namespace chorus::transport {

enum class NetKind { Ib, Ucx, Tcp };
constexpr NetKind kNetPreference[] = {NetKind::Ib, NetKind::Ucx, NetKind::Tcp};
const char* netKindName(NetKind k);
/// Parses "ib", "ucx" or "tcp"; false otherwise.
bool parseNetKind(const std::string& s, NetKind* k);

/// "ucx,tcp" <-> a list of kinds (in preference order). Unknown names are an error.
std::string formatNetKinds(const std::vector<NetKind>& kinds);
std::vector<NetKind> parseNetKinds(const std::string& s);

/// The kind a pair uses: the first of kNetPreference both lists contain; false if none.
bool chooseNetKind(const std::vector<NetKind>& mine, const std::vector<NetKind>& theirs, NetKind* kind);

class NetGroup final : public NetTransport {
 public:
  /// `byPeer[r]` indexes `transports` for each remote rank r, -1 elsewhere.
  NetGroup(std::vector<std::unique_ptr<NetTransport>> transports, std::vector<int> byPeer);

  const char* name() const override;
  SendPipe& sendPipe(int peer) override;
  RecvPipe& recvPipe(int peer) override;
  void publishFailure(const std::string& text) override;
  int findPeerFailure(std::string* text) override;
  void waitReadable(std::chrono::microseconds timeout) override;
  const std::string& describeLocal() const override { return local_; }
  size_t memoryBytes() const override;
  /// The transport of a remote peer's pair ("tcp", "ucx").
  const char* kindOf(int peer) const;

 private:
  std::vector<std::unique_ptr<NetTransport>> transports_;
  std::vector<int> byPeer_;
  std::string local_;
};

}  // namespace chorus::transport
