// The gloo backend's part of a Session: this process's Gloo device, on the interface
// GLOO_SOCKET_IFNAME names or else on the address that routes to the master, and Gloo's process
// groups on it. Everything here needs Gloo's headers (SB_HAVE_GLOO).

#include "harness/comm/c10d_internal.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "harness/error.h"
#include "harness/measure/memory.h"

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

// Whether `group`'s all-gather holds a flat copy of every block on this thread while it runs
// (CollectiveGroup::allGatherFlattensOnCaller): one all-gather of a 1 KiB block per rank into
// outputs made beforehand, measured by the memory tracker in this rank's bucket. Every member
// of the group calls this right after making it, as it made the group, so the all-gather pairs.
bool flattensOnCaller(CollectiveGroup& group, int size, int rank) {
  auto& tracker = MemoryTracker::instance();
  tracker.install();
  ScopedMemoryRank scope(rank);
  constexpr int64_t kElems = 256;
  at::Tensor block = at::zeros({kElems}, at::kFloat);
  std::vector<at::Tensor> outs;
  for (int r = 0; r < size; ++r) outs.push_back(at::empty({kElems}, at::kFloat));
  const int64_t held = tracker.heldDuring(rank, [&] { group.allGather(outs, block); });
  const int64_t flat = size * kElems * static_cast<int64_t>(sizeof(float));
  TORCH_CHECK(held == 0 || held == flat, "the gloo all-gather probe held ", held,
              " bytes on the calling thread; expected 0 or one flat copy of ", flat,
              " (harness/comm/c10d_gloo.cpp): this LibTorch's ProcessGroupGloo allocates what "
              "the scratch model does not know");
  return held == flat;
}

}  // namespace

void makeGlooDevice(SessionState& s, const DistEnv& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    // Gloo aborts the process on an interface that is not there: asked first, bad input.
    if (::if_nametoindex(ifname) == 0) {
      std::string have;
      if (struct if_nameindex* all = ::if_nameindex()) {
        for (const struct if_nameindex* i = all; i->if_index != 0 && i->if_name; ++i) {
          have += (have.empty() ? "" : ", ") + std::string(i->if_name);
        }
        ::if_freenameindex(all);
      }
      throw InputError(std::string("GLOO_SOCKET_IFNAME='") + ifname +
                       "': no such network interface on this host (it has: " + have + ")");
    }
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
    auto group = std::make_shared<GroupOf<::c10d::ProcessGroupGloo>>(
        c10::make_intrusive<::c10d::ProcessGroupGloo>(store, groupRank, size, opts),
        /*reducesBf16=*/false);
    if (size > 1) group->allGatherFlattensOnCaller = flattensOnCaller(*group, size, s.env.rank);
    return group;
  };
}
#endif

}  // namespace sb::harness
