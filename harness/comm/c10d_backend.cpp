// c10d backends: LibTorch's own process groups (Gloo; NCCL where LibTorch has CUDA) behind the
// harness's Communicator, one process per rank (with NCCL, one GPU per rank: the local rank's).
//
// Each mesh gets one process group per ordered set of mesh axes, named in the store by the
// generation, the mesh and the member ranks, so that a failed row can be followed by fresh
// groups (a new generation) without any rank reusing a broken connection. Groups of the
// ascending axis sets are built eagerly, in the same order on every rank, which cannot
// deadlock; other orders (rare) are built on first use, which relies on SPMD code asking for
// them in the same order on every rank, as it must for its collectives anyway.
//
// This file: the backends this build carries, and a Session with its worlds, one per mesh. The
// Communicator of a process group is in c10d_communicator.cpp, the control store in
// c10d_store.cpp, what is Gloo's or NCCL's in c10d_gloo.cpp and c10d_nccl.cpp, what they share in
// c10d_internal.h.

#include "harness/comm/c10d_backend.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include <ATen/ATen.h>

#include "harness/comm/c10d_internal.h"
#include "harness/measure/device.h"
#include "harness/measure/memory.h"

namespace sb::harness {

bool c10dBackendBuilt(const std::string& name) {
#if SB_HAVE_GLOO
  if (name == "gloo") return true;
#endif
#if SB_HAVE_NCCL
  if (name == "nccl") return true;
#endif
  return false;
}

std::vector<std::string> availableBackends() {
  std::vector<std::string> out{"threads"};
  for (const char* b : {"gloo", "nccl"}) {
    if (c10dBackendBuilt(b)) out.push_back(b);
  }
  return out;
}

std::string deadRankKey(int rank) { return "sb/dead/" + std::to_string(rank); }

// ---------------------------------------------------------------------------------------------
// The world of one mesh on c10d process groups.

namespace {

class C10dWorld final : public World {
 public:
  using Factory = GroupFactory;

  C10dWorld(DeviceMesh mesh, int rank, std::string backend, std::string prefix, Factory factory)
      : mesh_(std::move(mesh)),
        rank_(rank),
        backend_(std::move(backend)),
        prefix_(std::move(prefix)),
        factory_(std::move(factory)),
        ctx_(*this) {
    // Every ascending set of axes, in the same order on every rank.
    const int d = static_cast<int>(mesh_.ndim());
    for (int bits = 1; bits < (1 << d); ++bits) {
      std::vector<int> axes;
      for (int a = 0; a < d; ++a) {
        if (bits & (1 << a)) axes.push_back(a);
      }
      groupFor(axes);
    }
    control_ = makeGroup(mesh_.ranks(), rank_, "control");
  }

  const DeviceMesh& mesh() const override { return mesh_; }
  std::string backendName() const override { return backend_; }
  std::vector<int> localRanks() const override { return {rank_}; }

  void run(const std::function<void(RankContext&)>& fn) override {
    ScopedMemoryRank memory(rank_);
    RankDeviceScope device(rank_);
    fn(ctx_);
  }

  const CommStats& stats(int rank) const override {
    TORCH_CHECK(rank == rank_, "rank ", rank, " is not run by this process (rank ", rank_, ")");
    return stats_;
  }
  const CommStats& wireStats(int rank) const override {
    TORCH_CHECK(rank == rank_, "rank ", rank, " is not run by this process (rank ", rank_, ")");
    return wire_;
  }
  void resetStats() override {
    stats_.reset();
    wire_.reset();
  }

  double maxOverProcesses(double value) override {
    if (!control_) return value;
    at::Tensor t = at::full({1}, value, controlOptions(at::kDouble));
    control_->allReduce(t, c10d::ReduceOp::MAX);
    return t.item<double>();
  }
  bool anyOverProcesses(bool value) override {
    if (!control_) return value;
    at::Tensor t = at::full({1}, value ? 1 : 0, controlOptions(at::kInt));
    control_->allReduce(t, c10d::ReduceOp::MAX);
    return t.item<int>() != 0;
  }

  // NCCL moves device memory only: the runner's own reductions go through this rank's GPU.
  at::TensorOptions controlOptions(at::ScalarType dtype) const {
    auto o = at::TensorOptions().dtype(dtype);
    return backend_ == "nccl" ? o.device(at::kCUDA, currentCudaDevice()) : o;
  }

  Communicator& groupFor(const std::vector<int>& axes) {
    auto it = comms_.find(axes);
    if (it != comms_.end()) return *it->second;
    std::string name = "axes";
    for (int a : axes) name += "_" + std::to_string(a);
    const std::vector<int> members = mesh_.groupRanks(rank_, axes);
    const int groupRank = static_cast<int>(mesh_.groupIndex(rank_, axes));
    auto comm = makeC10dCommunicator(makeGroup(members, groupRank, name), backend_, groupRank,
                                     static_cast<int>(members.size()), &stats_, &wire_);
    return *comms_.emplace(axes, std::move(comm)).first->second;
  }

 private:
  class Context final : public RankContext {
   public:
    explicit Context(C10dWorld& w) : RankContext(w.rank_, w.mesh_), world_(w) {}
    Communicator& group(const std::vector<int>& axes) override { return world_.groupFor(axes); }

   private:
    C10dWorld& world_;
  };

  std::shared_ptr<CollectiveGroup> makeGroup(const std::vector<int>& members, int groupRank,
                                             const std::string& name) {
    if (members.size() == 1) return nullptr;  // a group of one never communicates
    std::string key = prefix_ + "/" + name + "/ranks";
    for (int m : members) key += "_" + std::to_string(m);
    return factory_(key, groupRank, static_cast<int>(members.size()));
  }

  DeviceMesh mesh_;
  int rank_;
  std::string backend_;
  std::string prefix_;
  Factory factory_;
  Context ctx_;
  CommStats stats_, wire_;
  std::shared_ptr<CollectiveGroup> control_;
  std::map<std::vector<int>, std::unique_ptr<Communicator>> comms_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Session

struct Session::Impl : SessionState {
  int generation = 0;
  std::map<std::string, std::unique_ptr<C10dWorld>> worlds;
};

Session::Session(const DistEnv& env, std::string backend, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.env = env;
  s.backend = std::move(backend);
  s.timeout = timeout;
  if (!c10dBackendBuilt(s.backend)) {
    std::string have;
    for (const auto& b : availableBackends()) have += (have.empty() ? "" : ", ") + b;
    throw std::runtime_error("backend '" + s.backend + "' is not available in this build (" + have +
                             ")");
  }
  const bool serve = env.rank == 0 && !env.agentServesStore;
  s.store = std::make_unique<ControlStore>(env.masterAddr, env.masterPort, serve, timeout,
                                           env.runKey.empty() ? "" : env.runKey + "/");
  if (s.backend == "nccl") selectNcclDevice(s, env);
#if SB_HAVE_GLOO
  makeGlooDevice(s, env);
#endif
  // Every rank arrives before anything runs, so that a missing rank is a clear error here.
  s.store->add("sb/arrived", 1);
  const auto deadline = Clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    const int64_t arrived = s.store->add("sb/arrived", 0);
    if (arrived >= env.worldSize) break;
    if (Clock::now() >= deadline) {
      throw std::runtime_error("only " + std::to_string(arrived) + " of " +
                               std::to_string(env.worldSize) + " ranks reached the store at " +
                               env.masterAddr + ":" + std::to_string(env.masterPort) + " within " +
                               std::to_string(timeout.count() / 1000) + " s");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

Session::~Session() {
  impl_->worlds.clear();  // process groups first: they hold the store
}

int Session::rank() const { return impl_->env.rank; }
int Session::worldSize() const { return impl_->env.worldSize; }
const std::string& Session::backend() const { return impl_->backend; }
std::chrono::milliseconds Session::timeout() const { return impl_->timeout; }
ControlStore& Session::store() { return *impl_->store; }
const std::string& Session::localAddress() const { return impl_->localAddress; }

World* Session::world(const DeviceMesh& mesh) {
  Impl& s = *impl_;
  TORCH_CHECK(mesh.size() <= s.env.worldSize, "mesh ", mesh.toString(), " needs ", mesh.size(),
              " ranks; this run has ", s.env.worldSize);
  if (s.env.rank >= mesh.size()) return nullptr;
  const std::string key = mesh.toString();
  auto it = s.worlds.find(key);
  if (it != s.worlds.end()) return it->second.get();
  const std::string prefix = "sb/pg/gen" + std::to_string(s.generation) + "/mesh" + key;
  C10dWorld::Factory factory;
#if SB_HAVE_GLOO
  if (s.backend == "gloo") factory = glooGroupFactory(s);
#endif
#if SB_HAVE_NCCL
  if (s.backend == "nccl") factory = ncclGroupFactory(s);
#endif
  TORCH_CHECK(factory, "backend '", s.backend, "' has no process group factory in this build");
  auto world = std::make_unique<C10dWorld>(mesh, s.env.rank, s.backend, prefix, factory);
  return s.worlds.emplace(key, std::move(world)).first->second.get();
}

void Session::dropGroups() { impl_->worlds.clear(); }

void Session::rebuild() {
  impl_->worlds.clear();
  ++impl_->generation;
}

}  // namespace sb::harness
