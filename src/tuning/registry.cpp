// The algorithm registry: every algorithm built in, one line each.
#include "algorithms/algorithm.hpp"
#include "tuning/tuning.hpp"

namespace chorus::tuning {

using namespace chorus::algo;

namespace {

// One line per algorithm: collective, name (CHORUS_ALGO), description, whether it needs the ranks'
// shared memory, the function, and for pipe algorithms the cost formula (beside the function in its
// file) and an optional note for the tuning log. Order within a collective does not matter.
constexpr Algorithm kRegistry[] = {
    {OpKind::AllReduce, "direct",
     "each rank reduces its slice straight from every peer's shared staging area", true, allReduceDirect},
    {OpKind::AllReduce, "oneshot",
     "every rank reduces the whole message from all staging areas: one synchronisation per chunk", true,
     allReduceOneShot},
    {OpKind::AllReduce, "ll",
     "low latency: data and flag share each cache line; every rank reduces the whole message", true,
     allReduceLowLatency},
    {OpKind::AllReduce, "ring", "pipelined ring: reduce-scatter then all-gather over point-to-point pipes",
     false, allReduceRing, allReduceRingUs},
    {OpKind::AllReduce, "rd", "recursive doubling (log2 n exchanges of the whole message)", false,
     allReduceRecursiveDoubling, allReduceRecursiveDoublingUs},
    {OpKind::AllReduce, "rhd",
     "recursive halving-doubling (Rabenseifner): reduce-scatter by halving, all-gather by doubling", false,
     allReduceHalvingDoubling, allReduceHalvingDoublingUs},
    {OpKind::AllReduce, "tree",
     "double binary tree: each half reduced up and broadcast down its own tree, in pipelined chunks", false,
     allReduceTree, allReduceTreeUs, allReduceTreeNote},
    {OpKind::AllReduce, "hier",
     "hierarchical: ring reduce-scatter within each host, ring allreduce across hosts per local rank, ring "
     "all-gather within each host (the flat ring on one host)",
     false, allReduceHierarchical, allReduceHierarchicalUs},
    {OpKind::ReduceScatter, "direct", "each rank reduces its block from every peer's staging area", true,
     reduceScatterDirect},
    {OpKind::ReduceScatter, "ring", "pipelined ring over point-to-point pipes", false, reduceScatterRing,
     reduceScatterRingUs},
    {OpKind::AllGather, "direct", "every rank copies each peer's block out of its staging area", true,
     allGatherDirect},
    {OpKind::AllGather, "ring", "pipelined ring over point-to-point pipes", false, allGatherRing,
     allGatherRingUs},
    {OpKind::Broadcast, "direct", "root stages chunks, every rank copies them out", true, broadcastDirect},
    {OpKind::Broadcast, "ll",
     "low latency: the root publishes data and flag in each cache line and goes on; every rank copies them",
     true, broadcastLowLatency},
    {OpKind::Broadcast, "pipeline", "chain from the root, forwarding bytes as they arrive", false,
     broadcastPipeline, broadcastPipelineUs},
    {OpKind::Broadcast, "knomial", "4-nomial tree from the root, forwarding bytes as they arrive", false,
     broadcastKnomial, broadcastKnomialUs},
    {OpKind::Reduce, "direct", "root reduces every rank's staged chunk", true, reduceDirect},
    {OpKind::Reduce, "ll",
     "low latency: every rank publishes data and flag in each cache line and goes on; the root reduces them",
     true, reduceLowLatency},
    {OpKind::Reduce, "pipeline", "chain towards the root, reducing and forwarding as bytes arrive", false,
     reducePipeline, reducePipelineUs},
    {OpKind::Reduce, "knomial", "4-nomial tree towards the root, reducing chunk by chunk", false,
     reduceKnomial, reduceKnomialUs},
    {OpKind::AllToAll, "direct", "every rank copies its block out of each peer's staging area", true,
     allToAllDirect},
    {OpKind::AllToAll, "pairwise", "all pairwise exchanges progressed together", false, allToAllPairwise,
     allToAllPairwiseUs},
    {OpKind::AllToAllv, "pairwise", "all pairwise exchanges progressed together", false, allToAllvPairwise,
     allToAllvPairwiseUs},
    {OpKind::Barrier, "direct", "shared-memory arrival counters", true, barrierDirect},
    {OpKind::Barrier, "pipes", "dissemination barrier over point-to-point pipes", false, barrierPipes,
     barrierPipesUs},
};

}  // namespace

std::span<const Algorithm> registry() { return kRegistry; }

const Algorithm* findAlgorithm(OpKind kind, const std::string& name) {
  for (const Algorithm& a : kRegistry) {
    if (a.kind == kind && name == a.name) return &a;
  }
  return nullptr;
}

}  // namespace chorus::tuning
