// chorus-tcp-probe: the line rate and round trip of one TCP connection between two hosts, the
// yardsticks of bench/net/run. Run as two ranks (RANK 0 and 1, MASTER_ADDR = rank 0's address,
// MASTER_PORT; rank 0 listens on MASTER_PORT + 1). Plain sockets, nothing of Chorus.
//
// Rank 1 sends --bytes (default 1 GiB) in 4 MiB writes on one stream; rank 0 reads them and
// answers one byte; the rate is bytes over rank 1's time from the first write to the answer
// (best of --rounds). Then --pings 8-byte ping-pongs (after 100 unmeasured): the median round
// trip, first with blocking receives, then with both sides spinning on non-blocking ones. Rank 0
// prints "line_rate_gbit_s <x>", "rtt_us <median> (<min> min)" and "rtt_spin_us <median> (<min> min)".
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

void sendAll(int fd, const char* p, size_t n) {
  while (n) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) die("send");
    p += w;
    n -= static_cast<size_t>(w);
  }
}
void recvAll(int fd, char* p, size_t n) {
  while (n) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) die("recv");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

int connectOrListen(int rank, const char* addr, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (rank == 0) hints.ai_flags = AI_PASSIVE;
  const std::string p = std::to_string(port);
  if (getaddrinfo(rank == 0 ? nullptr : addr, p.c_str(), &hints, &res) != 0) die("getaddrinfo");
  int fd = -1;
  if (rank == 0) {
    int l = ::socket(res->ai_family, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(l, res->ai_addr, res->ai_addrlen) < 0 || ::listen(l, 1) < 0) die("listen");
    fd = ::accept(l, nullptr, nullptr);
    ::close(l);
  } else {
    for (int attempt = 0; attempt < 200; ++attempt) {
      fd = ::socket(res->ai_family, SOCK_STREAM, 0);
      if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
      ::close(fd);
      fd = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  freeaddrinfo(res);
  if (fd < 0) die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = size_t{1} << 30;
  int rounds = 3, pings = 2000;
  CLI::App app{"chorus-tcp-probe: line rate and round trip of one TCP connection (RANK 0 and 1)"};
  app.add_option("--bytes", bytes, "bytes streamed per round")
      ->check(CLI::Range(size_t{1} << 20, size_t{1} << 36));
  app.add_option("--rounds", rounds, "streaming rounds (the best counts)")->check(CLI::Range(1, 100));
  app.add_option("--pings", pings, "measured 8-byte ping-pongs")->check(CLI::Range(1, 1000000));
  CLI11_PARSE(app, argc, argv);
  const char* rankEnv = std::getenv("RANK");
  const char* addr = std::getenv("MASTER_ADDR");
  const char* portEnv = std::getenv("MASTER_PORT");
  if (!rankEnv || !addr || !portEnv) {
    std::fprintf(stderr, "chorus-tcp-probe: needs RANK, MASTER_ADDR and MASTER_PORT\n");
    return 2;
  }
  const int rank = std::atoi(rankEnv);
  if (rank > 1) return 0;
  const int fd = connectOrListen(rank, addr, std::atoi(portEnv) + 1);
  const size_t chunk = size_t{4} << 20;
  std::vector<char> buf(chunk);
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    char ack = 0;
    if (rank == 1) {
      const auto t0 = Clock::now();
      for (size_t done = 0; done < bytes; done += chunk)
        sendAll(fd, buf.data(), std::min(chunk, bytes - done));
      recvAll(fd, &ack, 1);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      const double gbit = static_cast<double>(bytes) * 8 / s / 1e9;
      best = std::max(best, gbit);
      sendAll(fd, reinterpret_cast<const char*>(&gbit), sizeof gbit);
    } else {
      for (size_t done = 0; done < bytes; done += chunk)
        recvAll(fd, buf.data(), std::min(chunk, bytes - done));
      sendAll(fd, &ack, 1);
      double gbit = 0;
      recvAll(fd, reinterpret_cast<char*>(&gbit), sizeof gbit);
      best = std::max(best, gbit);
    }
  }
  std::vector<double> rtts;
  char msg[8] = {0};
  for (int i = 0; i < pings + 100; ++i) {
    const auto t0 = Clock::now();
    if (rank == 0) {
      sendAll(fd, msg, sizeof msg);
      recvAll(fd, msg, sizeof msg);
      if (i >= 100) rtts.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    } else {
      recvAll(fd, msg, sizeof msg);
      sendAll(fd, msg, sizeof msg);
    }
  }
  // The same with both sides spinning on non-blocking receives (no sleep and wake-up per message,
  // as a polling communication library waits).
  std::vector<double> spins;
  auto spinRecv = [&](char* p, size_t n) {
    while (n) {
      const ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) die("recv");
      if (r > 0) {
        p += r;
        n -= static_cast<size_t>(r);
      }
    }
  };
  for (int i = 0; i < pings + 100; ++i) {
    const auto t0 = Clock::now();
    if (rank == 0) {
      sendAll(fd, msg, sizeof msg);
      spinRecv(msg, sizeof msg);
      if (i >= 100) spins.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    } else {
      spinRecv(msg, sizeof msg);
      sendAll(fd, msg, sizeof msg);
    }
  }
  if (rank == 0) {
    std::sort(rtts.begin(), rtts.end());
    std::sort(spins.begin(), spins.end());
    std::printf("line_rate_gbit_s %.2f\n", best);
    std::printf("rtt_us %.2f (%.2f min)\n", rtts[rtts.size() / 2], rtts.front());
    std::printf("rtt_spin_us %.2f (%.2f min)\n", spins[spins.size() / 2], spins.front());
  }
  ::close(fd);
  return 0;
}
