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
// Gloo in LibTorch 1.13 lacks reduce-scatter, all-gather into one tensor and all-gather with
// uneven sizes. They are built here from the collectives it has: reduce-scatter is an
// all-to-all of the blocks followed by a local sum in group rank order (the order the threads
// backend adds in, so exact inputs give bitwise the same numbers); uneven all-gather pads
// every block to the largest and trims. Nor can it add bfloat16: such an all-reduce is an
// all-gather (the bits carried as float16) and a local sum in group rank order. The
// Communicator counts what the executor asked for (compared with the strategy's prediction);
// `wire` counts what was actually sent.

#include "harness/c10d_backend.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <thread>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#if SB_HAVE_GLOO
#define USE_C10D_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if SB_HAVE_NCCL
#define USE_C10D_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "harness/device.h"
#include "harness/memory.h"

namespace sb::harness {
namespace {

std::string bytesToString(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> stringToBytes(const std::string& s) { return {s.begin(), s.end()}; }

// The bits of `t` as a type every backend moves: collectives that only copy (all-gather,
// all-to-all, broadcast) carry bfloat16 as float16 of the same width, which Gloo 1.13 accepts.
at::Tensor carrier(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
}

// One c10d process group, type-erased: each call waits for its work to finish.
class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;
  // Whether the group can reduce this type itself (Gloo 1.13 cannot add bfloat16).
  virtual bool reduces(at::ScalarType t) const = 0;
  virtual void allReduce(at::Tensor& t, c10d::ReduceOp op) = 0;
  virtual void allGather(std::vector<at::Tensor>& outs, at::Tensor& in) = 0;
  virtual void allToAll(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& outRows,
                        std::vector<int64_t>& inRows) = 0;
  virtual void broadcast(at::Tensor& t, int root) = 0;
  virtual void barrier() = 0;
};

// Waits for a collective and then until this thread holds the only reference to its work:
// ProcessGroupGloo's worker keeps the work, and with it the collective's tensors, for a moment
// after it marks the work complete. Freed there, a tensor would leave this rank's memory at a
// time of the worker's choosing; freed here, a step's peak memory is the same every run.
template <class WorkPtr>
void waitAlone(WorkPtr work) {
  work->wait();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (work.use_count() > 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
}

// `keepsWork`: the backend's worker holds a finished work for a while (Gloo), so a collective
// also waits until it lets go (waitAlone). NCCL's watchdog holds every work until its kernel
// ends, and its wait() only orders the caller's stream after it: there, wait() alone.
template <class PG>
class GroupOf final : public CollectiveGroup {
 public:
  // `barrierDevice`: the GPU of this rank, for a backend whose barrier runs on one (NCCL would
  // otherwise guess it from the group rank, another process's GPU in a subgroup); -1: none.
  GroupOf(c10::intrusive_ptr<PG> pg, bool reducesBf16, bool keepsWork = true,
          int barrierDevice = -1)
      : pg_(std::move(pg)),
        reducesBf16_(reducesBf16),
        keepsWork_(keepsWork),
        barrierDevice_(barrierDevice) {}
  bool reduces(at::ScalarType t) const override { return t != at::kBFloat16 || reducesBf16_; }
  void allReduce(at::Tensor& t, c10d::ReduceOp op) override {
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions o;
    o.reduceOp = op;
    finish(pg_->allreduce(ts, o));
  }
  void allGather(std::vector<at::Tensor>& outs, at::Tensor& in) override {
    std::vector<std::vector<at::Tensor>> o(1);
    for (const auto& t : outs) o[0].push_back(carrier(t));
    std::vector<at::Tensor> i{carrier(in)};
    finish(pg_->allgather(o, i));
  }
  void allToAll(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& outRows,
                std::vector<int64_t>& inRows) override {
    at::Tensor o = carrier(out), i = carrier(in);
    finish(pg_->alltoall_base(o, i, outRows, inRows));
  }
  void broadcast(at::Tensor& t, int root) override {
    std::vector<at::Tensor> ts{carrier(t)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    finish(pg_->broadcast(ts, o));
  }
  void barrier() override {
    c10d::BarrierOptions o;
    if (barrierDevice_ >= 0) o.device_ids = {barrierDevice_};
    pg_->barrier(o)->wait();
  }

 private:
  template <class WorkPtr>
  void finish(WorkPtr work) {
    if (keepsWork_) {
      waitAlone(std::move(work));
    } else {
      work->wait();
    }
  }
  c10::intrusive_ptr<PG> pg_;
  bool reducesBf16_;
  bool keepsWork_;
  int barrierDevice_;
};

int64_t rowElemsOf(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(std::shared_ptr<CollectiveGroup> group, std::string backend, int groupRank,
                   int size, CommStats* stats, CommStats* wire)
      : Communicator(groupRank, size, stats),
        group_(std::move(group)),
        backend_(std::move(backend)),
        wire_(wire) {}
  std::string backendName() const override { return backend_; }

  // What the collectives below allocate besides their result: a 16-bit all-reduce Gloo cannot
  // reduce gathers every block and sums into a copy; all-gather pads a short block and receives
  // every block at the largest size before concatenating; reduce-scatter receives every rank's
  // block before summing.
  int64_t scratchBytes(Collective c, int64_t myBlockBytes, int64_t maxBlockBytes,
                       at::ScalarType dtype) const override {
    const int64_t n = size();
    switch (c) {
      case Collective::kAllReduce:
        if (myBlockBytes == 0 || group_->reduces(dtype)) return 0;
        return (n + 1) * myBlockBytes;
      case Collective::kAllGather:
        if (maxBlockBytes == 0) return 0;
        return n * maxBlockBytes + (myBlockBytes != maxBlockBytes ? maxBlockBytes : 0);
      case Collective::kReduceScatter:
        return n * myBlockBytes;
      default:
        return 0;
    }
  }

 protected:
  // Empty buffers never reach Gloo: Debian's Gloo divides by the byte count in all-gather
  // (pytorch/pytorch#85234). Every rank decides alike, from sizes all ranks agree on.
  void doAllReduce(at::Tensor& tensor) override {
    if (tensor.numel() == 0) return;
    if (!group_->reduces(tensor.scalar_type())) {
      // Every rank's buffer, then the sum in group rank order, as the threads backend adds.
      std::vector<at::Tensor> outs;
      for (int r = 0; r < size(); ++r) outs.push_back(at::empty_like(tensor));
      at::Tensor in = tensor;
      group_->allGather(outs, in);
      wire_->add(Collective::kAllGather, tensor.nbytes() * size());
      at::Tensor sum = outs[0].clone();
      for (int r = 1; r < size(); ++r) sum.add_(outs[r]);
      tensor.copy_(sum);
      return;
    }
    group_->allReduce(tensor, c10d::ReduceOp::SUM);
    wire_->add(Collective::kAllReduce, tensor.nbytes());
  }

  at::Tensor doAllGather(const at::Tensor& input, const std::vector<int64_t>& rows) override {
    const int64_t maxRows = *std::max_element(rows.begin(), rows.end());
    std::vector<int64_t> shape = input.sizes().vec();
    if (maxRows * rowElemsOf(input) == 0) {
      shape[0] = std::accumulate(rows.begin(), rows.end(), int64_t{0});
      return at::empty(shape, input.options());
    }
    shape[0] = maxRows;
    at::Tensor block = input;
    if (input.size(0) != maxRows) {  // uneven: pad every block to the largest
      block = at::zeros(shape, input.options());
      block.narrow(0, 0, input.size(0)).copy_(input);
    }
    std::vector<at::Tensor> outs;
    for (int r = 0; r < size(); ++r) outs.push_back(at::empty(shape, input.options()));
    group_->allGather(outs, block);
    wire_->add(Collective::kAllGather,
               rowBytes(maxRows * size(), rowElemsOf(input), input.element_size()));
    for (int r = 0; r < size(); ++r) outs[r] = outs[r].narrow(0, 0, rows[r]);
    return at::cat(outs, 0);
  }

  at::Tensor doReduceScatter(const at::Tensor& input, const std::vector<int64_t>& rows) override {
    // All-to-all of the blocks, then the sum in group rank order.
    const int64_t mine = rows[rank()];
    std::vector<int64_t> shape = input.sizes().vec();
    if (input.numel() == 0) {  // nothing anywhere: the same on every rank
      shape[0] = mine;
      return at::zeros(shape, input.options());
    }
    shape[0] = mine * size();
    at::Tensor received = at::empty(shape, input.options());
    std::vector<int64_t> outRows(size(), mine);
    std::vector<int64_t> inRows = rows;
    at::Tensor in = input;
    group_->allToAll(received, in, outRows, inRows);
    wire_->add(Collective::kAllToAll, input.nbytes());
    at::Tensor sum = received.narrow(0, 0, mine).clone();
    for (int r = 1; r < size(); ++r) sum.add_(received.narrow(0, r * mine, mine));
    return sum;
  }

  at::Tensor doAllToAll(const at::Tensor& input, const std::vector<int64_t>& sendRows,
                        const std::vector<int64_t>& recvRows) override {
    std::vector<int64_t> shape = input.sizes().vec();
    shape[0] = std::accumulate(recvRows.begin(), recvRows.end(), int64_t{0});
    at::Tensor out = at::empty(shape, input.options());
    std::vector<int64_t> outRows = recvRows, inRows = sendRows;
    at::Tensor in = input;
    group_->allToAll(out, in, outRows, inRows);
    wire_->add(Collective::kAllToAll, input.nbytes());
    return out;
  }

  void doBroadcast(at::Tensor& tensor, int root) override {
    if (tensor.numel() == 0) return;
    group_->broadcast(tensor, root);
    wire_->add(Collective::kBroadcast, tensor.nbytes());
  }

  void doBarrier() override {
    group_->barrier();
    wire_->add(Collective::kBarrier, 0);
  }

 private:
  std::shared_ptr<CollectiveGroup> group_;
  std::string backend_;
  CommStats* wire_;
};

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
// ControlStore

struct ControlStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::string prefix;
};

ControlStore::ControlStore(const std::string& host, int port, bool serve,
                           std::chrono::milliseconds timeout, std::string prefix)
    : impl_(std::make_unique<Impl>()) {
  impl_->prefix = std::move(prefix);
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = serve;
  o.waitWorkers = false;
  o.timeout = timeout;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const std::exception& e) {
    const std::string what = serve ? "serve the store on port " + std::to_string(port)
                                   : "reach the store at " + host + ":" + std::to_string(port);
    throw std::runtime_error("cannot " + what + ": " +
                             (dynamic_cast<const c10::Error*>(&e)
                                  ? static_cast<const c10::Error&>(e).what_without_backtrace()
                                  : e.what()));
  }
}

ControlStore::~ControlStore() = default;

int ControlStore::port() const { return impl_->store->getPort(); }
const std::string& ControlStore::prefix() const { return impl_->prefix; }

void ControlStore::set(const std::string& key, const std::string& value) {
  impl_->store->set(impl_->prefix + key, stringToBytes(value));
}

std::optional<std::string> ControlStore::get(const std::string& key) {
  if (!impl_->store->check({impl_->prefix + key})) return std::nullopt;
  return bytesToString(impl_->store->get(impl_->prefix + key));
}

int64_t ControlStore::add(const std::string& key, int64_t value) {
  return impl_->store->add(impl_->prefix + key, value);
}

std::optional<std::string> ControlStore::waitFor(const std::string& key, Clock::time_point deadline,
                                                 const std::function<bool()>& giveUp) {
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (auto v = get(key)) return v;
    if (Clock::now() >= deadline || (giveUp && giveUp())) return std::nullopt;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

// ---------------------------------------------------------------------------------------------
// The world of one mesh on c10d process groups.

namespace {

class C10dWorld final : public World {
 public:
  using Factory = std::function<std::shared_ptr<CollectiveGroup>(const std::string& prefix,
                                                                 int groupRank, int size)>;

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
    auto comm =
        std::make_unique<C10dCommunicator>(makeGroup(members, groupRank, name), backend_, groupRank,
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

struct Session::Impl {
  DistEnv env;
  std::string backend;
  std::chrono::milliseconds timeout;
  std::unique_ptr<ControlStore> store;
  std::string localAddress;
  int generation = 0;
  std::map<std::string, std::unique_ptr<C10dWorld>> worlds;
#if SB_HAVE_GLOO
  std::shared_ptr<::gloo::transport::Device> glooDevice;
#endif
  int cudaDevice = -1;  // nccl: this process's GPU
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
  if (s.backend == "nccl") {
    // One GPU per rank: the local rank's, as torchrun's LOCAL_RANK and the launcher assign.
    std::string why;
    if (!cudaUsable(&why)) throw std::runtime_error("backend 'nccl' needs a CUDA device: " + why);
    const int count = cudaDeviceCount();
    if (env.localWorldSize > count) {
      throw std::runtime_error(
          "backend 'nccl' runs one rank per GPU, but " + std::to_string(env.localWorldSize) +
          " ranks share this host's " + std::to_string(count) +
          " GPU(s) (NCCL refuses two ranks of one communicator on one GPU); use the threads "
          "backend for several ranks on one GPU");
    }
    s.cudaDevice = env.localRank % count;
    setCudaDevice(s.cudaDevice);
  }
#if SB_HAVE_GLOO
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
  if (s.backend == "gloo") {
    factory = [&s](const std::string& name, int groupRank, int size) {
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
#if SB_HAVE_NCCL
  if (s.backend == "nccl") {
    factory = [&s](const std::string& name, int groupRank, int size) {
      auto opts = ::c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = s.timeout;
      auto store =
          c10::make_intrusive<::c10d::PrefixStore>(s.store->prefix() + name, s.store->impl().store);
      return std::make_shared<GroupOf<::c10d::ProcessGroupNCCL>>(
          c10::make_intrusive<::c10d::ProcessGroupNCCL>(store, groupRank, size, opts),
          /*reducesBf16=*/true, /*keepsWork=*/false, s.cudaDevice);
    };
  }
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
