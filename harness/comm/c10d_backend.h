#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/comm/world.h"
#include "harness/dist/dist_env.h"

namespace sb::harness {

// Whether this build carries the c10d backend `name` ("gloo": LibTorch's ProcessGroupGloo was
// found with Gloo's headers; "nccl": a CUDA LibTorch with ProcessGroupNCCL).
bool c10dBackendBuilt(const std::string& name);
// "threads" and every c10d backend this build carries.
std::vector<std::string> availableBackends();

// Small strings shared by every rank and the launcher through c10d's TCPStore: the control
// plane of a multi-process run. It lives outside the process groups, so it keeps working when
// a group is broken by a failed rank.
class ControlStore {
 public:
  using Clock = std::chrono::steady_clock;
  // Serves the store on `port` (0: any free port) when `serve`, else connects to host:port,
  // retrying until `timeout`. Throws naming the address.
  // Every key is put under `prefix` (a run's namespace in a shared store).
  ControlStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout,
               std::string prefix = "");
  ~ControlStore();
  int port() const;
  const std::string& prefix() const;

  void set(const std::string& key, const std::string& value);
  std::optional<std::string> get(const std::string& key);  // nullopt when absent
  int64_t add(const std::string& key, int64_t value);
  // Polls until `key` exists, the deadline passes or `giveUp()` says so; returns its value.
  std::optional<std::string> waitFor(const std::string& key, Clock::time_point deadline,
                                     const std::function<bool()>& giveUp = {});

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Key the launcher sets when it sees a rank die; its value says how.
std::string deadRankKey(int rank);

// This process's part of a multi-process run on a c10d backend: its rank, the control store,
// and the process groups of the meshes it runs, one per ordered set of mesh axes plus an
// uncounted control group for the runner's own reductions (step times, agreement).
class Session {
 public:
  using Clock = ControlStore::Clock;
  // Connects to the store (served by the launcher, or by rank 0 when nothing serves it) and
  // waits until every rank of the world has arrived. Throws with the master address on failure.
  Session(const DistEnv& env, std::string backend, std::chrono::milliseconds timeout);
  ~Session();

  int rank() const;
  int worldSize() const;
  const std::string& backend() const;
  std::chrono::milliseconds timeout() const;
  ControlStore& store();
  // The address this process's Gloo device listens on.
  const std::string& localAddress() const;

  // The world of `mesh` (this world's ranks 0..k-1), built on first use and kept until
  // rebuild(); nullptr when this process has no rank in it. Collective over the mesh's ranks.
  World* world(const DeviceMesh& mesh);
  // Drops every process group now, so that peers blocked on this rank fail at once instead
  // of at their timeout.
  void dropGroups();
  // Starts a new generation of process groups; every rank calls it at the same point.
  void rebuild();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sb::harness
