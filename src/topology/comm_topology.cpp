#include "topology/comm_topology.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/util.hpp"

namespace chorus::topo {

const char* linkClassName(LinkClass c) {
  switch (c) {
    case LinkClass::Self:
      return "self";
    case LinkClass::SameNuma:
      return "shm-numa";
    case LinkClass::CrossNuma:
      return "shm-xnuma";
    case LinkClass::CrossHost:
      return "network";
  }
  return "?";
}

int CommTopology::localSize(int rank) const {
  const int host = ranks[static_cast<size_t>(rank)].host;
  return static_cast<int>(
      std::count_if(ranks.begin(), ranks.end(), [&](const RankPlacement& p) { return p.host == host; }));
}

LinkClass CommTopology::link(int a, int b) const {
  if (a == b) return LinkClass::Self;
  const RankPlacement& pa = ranks[static_cast<size_t>(a)];
  const RankPlacement& pb = ranks[static_cast<size_t>(b)];
  if (pa.host != pb.host) return LinkClass::CrossHost;
  // Unknown or spanning placement counts as crossing NUMA nodes unless the host has only one.
  if (hosts[static_cast<size_t>(pa.host)].numaNodes <= 1) return LinkClass::SameNuma;
  return pa.numa >= 0 && pa.numa == pb.numa ? LinkClass::SameNuma : LinkClass::CrossNuma;
}

std::string CommTopology::shape() const {
  std::vector<int> perHost(hosts.size(), 0);
  for (const auto& p : ranks) ++perHost[static_cast<size_t>(p.host)];
  const bool even = std::all_of(perHost.begin(), perHost.end(), [&](int n) { return n == perHost.front(); });
  if (even)
    return strCat(hosts.size(), hosts.size() == 1 ? " host" : " hosts", " x ", perHost.front(), " ranks");
  std::string out = strCat(hosts.size(), " hosts: ");
  for (size_t h = 0; h < perHost.size(); ++h) out += strCat(h ? " + " : "", perHost[h]);
  return out + " ranks";
}

std::string CommTopology::describe() const {
  std::string out = strCat("communicator of ", ranks.size(), " ranks, ", shape(), "\n");
  for (size_t h = 0; h < hosts.size(); ++h) out += strCat("  [host ", h, "]\n", hosts[h].describe("    "));
  out += "  ranks:\n";
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankPlacement& p = ranks[r];
    out += strCat("    rank ", r, ": host ", p.host, ", local rank ", p.localRank, ", CPUs ",
                  formatCpuList(p.pus), ", NUMA ",
                  p.numa < 0 ? std::string("spanning") : std::to_string(p.numa), "\n");
  }
  if (ranks.size() <= 16) {
    out += "  links (rank x rank):\n";
    for (int a = 0; a < size(); ++a) {
      out += strCat("    ", a < 10 ? " " : "", a, ":");
      for (int b = 0; b < size(); ++b) {
        std::string cell = linkClassName(link(a, b));
        cell.resize(10, ' ');
        out += " " + cell;
      }
      out += "\n";
    }
  }
  return out;
}

nlohmann::ordered_json CommTopology::toJson() const {
  nlohmann::ordered_json j;
  j["shape"] = shape();
  auto hs = nlohmann::ordered_json::array();
  for (const auto& h : hosts) hs.push_back(h.toJson());
  j["hosts"] = std::move(hs);
  auto rs = nlohmann::ordered_json::array();
  for (const auto& p : ranks) {
    rs.push_back(nlohmann::ordered_json{
        {"host", p.host}, {"local_rank", p.localRank}, {"pus", p.pus}, {"numa", p.numa}});
  }
  j["ranks"] = std::move(rs);
  auto links = nlohmann::ordered_json::array();
  for (int a = 0; a < size(); ++a) {
    auto row = nlohmann::ordered_json::array();
    for (int b = 0; b < size(); ++b) row.push_back(linkClassName(link(a, b)));
    links.push_back(std::move(row));
  }
  j["links"] = std::move(links);
  return j;
}

CommTopology CommTopology::exchange(Store& store, int rank, const std::vector<int>& hostOf,
                                    std::chrono::milliseconds timeout) {
  const int size = static_cast<int>(hostOf.size());
  const int hostCount = hostOf.empty() ? 0 : *std::max_element(hostOf.begin(), hostOf.end()) + 1;
  // The first rank of each host speaks for the host.
  std::vector<int> leader(static_cast<size_t>(hostCount), -1);
  for (int r = 0; r < size; ++r) {
    if (leader[static_cast<size_t>(hostOf[static_cast<size_t>(r)])] < 0)
      leader[static_cast<size_t>(hostOf[static_cast<size_t>(r)])] = r;
  }
  const HostTopology& mine = localHost();
  const std::vector<int> myPus = boundPus();
  if (leader[static_cast<size_t>(hostOf[static_cast<size_t>(rank)])] == rank) {
    store.setString(strCat("topo/host/", rank), mine.toJson().dump());
  }
  store.setString(strCat("topo/rank/", rank), nlohmann::json(myPus).dump());

  CommTopology t;
  t.hosts.resize(static_cast<size_t>(hostCount));
  for (int h = 0; h < hostCount; ++h) {
    const int r = leader[static_cast<size_t>(h)];
    if (r == rank) {
      t.hosts[static_cast<size_t>(h)] = mine;
      continue;
    }
    const std::string text = store.getString(strCat("topo/host/", r), timeout);
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded())
      fail(chorusRemoteError, strCat("rank ", rank, ": malformed host topology from rank ", r));
    try {
      t.hosts[static_cast<size_t>(h)] = HostTopology::fromJson(j);
    } catch (const Error& e) {
      fail(chorusRemoteError, strCat("rank ", rank, ": from rank ", r, ": ", e.what()));
    }
  }
  t.ranks.resize(static_cast<size_t>(size));
  std::vector<int> seen(static_cast<size_t>(hostCount), 0);
  for (int r = 0; r < size; ++r) {
    RankPlacement& p = t.ranks[static_cast<size_t>(r)];
    p.host = hostOf[static_cast<size_t>(r)];
    p.localRank = seen[static_cast<size_t>(p.host)]++;
    if (r == rank) {
      p.pus = myPus;
    } else {
      const auto j = nlohmann::json::parse(store.getString(strCat("topo/rank/", r), timeout), nullptr, false);
      if (!j.is_array())
        fail(chorusRemoteError, strCat("rank ", rank, ": malformed placement from rank ", r));
      for (const auto& v : j) {
        if (!v.is_number_integer())
          fail(chorusRemoteError, strCat("rank ", rank, ": malformed placement from rank ", r));
        p.pus.push_back(v.get<int>());
      }
    }
    p.numa = t.hosts[static_cast<size_t>(p.host)].numaOf(p.pus);
  }
  return t;
}

}  // namespace chorus::topo
