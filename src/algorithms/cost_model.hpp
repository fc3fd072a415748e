// An alpha-beta cost model of the algorithms that move data over point-to-point links (the pipes):
// each message costs alpha, each byte 1/bandwidth on the wire and 1/reduceBandwidth where it is
// reduced. Its constants come from the communicator's link class (topology), and the selection uses
// it where no shared-memory algorithm applies (ranks on several hosts): the cheapest prediction
// wins, so latency-bound sizes get log-depth algorithms and bandwidth-bound ones the ring,
// halving-doubling or the chain. The shared-memory algorithms are chosen by the built-in size rules
// (selection.cpp), measured on real machines; the model gives them no prediction.
#pragma once

#include <string>

#include "algorithms/algorithm.hpp"

namespace chorus::algo {

struct CostModel {
  double alphaUs = 1.5;     // per message (latency + software overhead)
  double wireGBps = 2.0;    // GB/s (1e9 bytes) a rank moves over one link
  double reduceGBps = 5.0;  // GB/s a rank reduces incoming data into its buffer
  std::string linkClass = "shm-numa";

  /// Defaults for a link class (topo::linkClassName): the pipes between ranks of one host measured on
  /// the development VM, halved bandwidth across NUMA nodes, a 10 GbE-class network between hosts.
  static CostModel forLinkClass(const std::string& linkClass);

  /// Predicted microseconds of `a` running `op` on `n` ranks; a negative value when the model has no
  /// formula for it (shared-memory algorithms).
  double predictUs(const Algorithm& a, const Op& op, int n) const;
};

/// The modelled algorithm of op.kind with the lowest prediction (never a shared-memory one), or
/// nullptr when the model covers none.
const Algorithm* cheapest(const CostModel& model, const Op& op, int n);

}  // namespace chorus::algo
