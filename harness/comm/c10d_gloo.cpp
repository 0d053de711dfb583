// The gloo backend's part of a Session: this process's Gloo device, on the interface
// GLOO_SOCKET_IFNAME names or else on the address that routes to the master, and Gloo's process
// groups on it. Everything here needs Gloo's headers (SB_HAVE_GLOO).

#include "harness/comm/c10d_internal.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#if SB_HAVE_GLOO
#define USE_C10D_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

namespace sb::harness {

#if SB_HAVE_GLOO
namespace {

// The address of this host's interface that routes to `host` (no packet is sent).
std::string localAddressTowards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) {
    throw std::runtime_error("cannot resolve the master address '" + host + "'");
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string out;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      if (inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf))) out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  if (out.empty()) throw std::runtime_error("no local interface routes to '" + host + "'");
  return out;
}

}  // namespace

void makeGlooDevice(SessionState& s, const DistEnv& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    s.glooDevice = ::c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    s.localAddress = std::string("interface ") + ifname;
  } else {
    s.localAddress = localAddressTowards(env.masterAddr, env.masterPort);
    if (s.localAddress.rfind("127.", 0) == 0 && env.localWorldSize < env.worldSize) {
      throw std::runtime_error(
          "the master address '" + env.masterAddr + "' routes to loopback (" + s.localAddress +
          ") but the ranks span hosts (" + std::to_string(env.localWorldSize) + " of " +
          std::to_string(env.worldSize) +
          " here): give MASTER_ADDR (--master-addr) as an address the other hosts reach, or "
          "name the interface in GLOO_SOCKET_IFNAME");
    }
    s.glooDevice = ::c10d::ProcessGroupGloo::createDeviceForHostname(s.localAddress);
  }
}

GroupFactory glooGroupFactory(SessionState& s) {
  return [&s](const std::string& name, int groupRank, int size) {
    auto opts = ::c10d::ProcessGroupGloo::Options::create(s.timeout);
    opts->devices.push_back(s.glooDevice);
    opts->threads = 1;
    auto store =
        c10::make_intrusive<::c10d::PrefixStore>(s.store->prefix() + name, s.store->impl().store);
    return std::make_shared<GroupOf<::c10d::ProcessGroupGloo>>(
        c10::make_intrusive<::c10d::ProcessGroupGloo>(store, groupRank, size, opts),
        /*reducesBf16=*/false);
  };
}
#endif

}  // namespace sb::harness
