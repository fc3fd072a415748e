// Test helper for chorusrun: every rank connects to CHORUS_STORE_ADDR, publishes a key, reads every
// other rank's key and counts itself in with add(). Prints "rendezvous ok" and exits 0 on success.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "chorus/store.hpp"

namespace {

std::string requireEnv(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') throw std::runtime_error(std::string(name) + " is not set");
  return value;
}

int run() {
  const int rank = std::stoi(requireEnv("CHORUS_RANK"));
  const int size = std::stoi(requireEnv("CHORUS_WORLD_SIZE"));
  const std::string address = requireEnv("CHORUS_STORE_ADDR");
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("CHORUS_STORE_ADDR has no port: " + address);
  const std::string host = address.substr(0, colon);
  const auto port = static_cast<uint16_t>(std::stoi(address.substr(colon + 1)));
  const auto timeout = std::chrono::seconds(30);

  auto store = chorus::makeTcpStore(host, port, timeout);
  store->setString("rank/" + std::to_string(rank), "hello from " + std::to_string(rank));
  store->add("arrived", 1);
  for (int peer = 0; peer < size; ++peer) {
    const std::string expected = "hello from " + std::to_string(peer);
    const std::string got = store->getString("rank/" + std::to_string(peer), timeout);
    if (got != expected) {
      std::fprintf(stderr, "rank %d: key rank/%d holds '%s', expected '%s'\n", rank, peer, got.c_str(),
                   expected.c_str());
      return 1;
    }
  }
  // Every rank has added before setting its "done" key, so once all are there the count is complete.
  store->setString("done/" + std::to_string(rank), "1");
  std::vector<std::string> done;
  for (int peer = 0; peer < size; ++peer) done.push_back("done/" + std::to_string(peer));
  store->wait(done, timeout);
  const int64_t arrived = store->add("arrived", 0);
  if (arrived != size) {
    std::fprintf(stderr, "rank %d: counter is %lld, expected %d\n", rank, static_cast<long long>(arrived),
                 size);
    return 1;
  }
  std::printf("rendezvous ok\n");
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_rendezvous: %s\n", e.what());
    return 1;
  }
}
