// What the files of the c10d backends share: the type-erased c10d process group a Communicator
// runs on (CollectiveGroup, GroupOf), the state of a Session that the backends build their groups
// from, and each file's entry points. Internal to the harness: c10d_backend.cpp (the session and
// its worlds), c10d_communicator.cpp, c10d_store.cpp, c10d_gloo.cpp and c10d_nccl.cpp.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#if SB_HAVE_GLOO
#include <gloo/transport/device.h>
#endif

#include "harness/comm/c10d_backend.h"
#include "harness/comm/comm.h"

namespace sb::harness {

// The bits of `t` as a type every backend moves: collectives that only copy (all-gather,
// all-to-all, broadcast) carry bfloat16 as float16 of the same width, which Gloo 1.13 accepts.
inline at::Tensor carrier(const at::Tensor& t) {
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
  // Posts every send and receive (group ranks as peers), then waits for all of them.
  virtual void exchange(const std::vector<Communicator::P2POp>& ops) = 0;
  // Posts a send under `tag` and returns what waits for it (Communicator::isend); the tensor
  // stays referenced until then.
  virtual std::function<void()> isend(const at::Tensor& t, int peer, int tag) = 0;

  // Whether the backend's all-gather allocates one flat buffer of every rank's block on the
  // calling thread while it runs, beside the outputs it is given. ProcessGroupGloo does in
  // PyTorch 2.x and does not in 1.13 (there its worker thread makes it, which no rank's memory
  // counts); the gloo factory measures it when it makes a group (c10d_gloo.cpp), so the
  // Communicator's scratch model is this LibTorch's, not one version's.
  bool allGatherFlattensOnCaller = false;
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
  void exchange(const std::vector<Communicator::P2POp>& ops) override {
    // Posted in order, each with its tag: c10d matches a pair's sends and receives per tag in
    // the order both sides post them, as the Communicator's contract says.
    std::vector<std::vector<at::Tensor>> buffers;
    buffers.reserve(ops.size());
    std::vector<decltype(pg_->barrier())> works;
    for (const auto& op : ops) {
      buffers.push_back({carrier(op.tensor)});
      works.push_back(op.kind == Communicator::P2POp::Kind::kSend
                          ? pg_->send(buffers.back(), op.peer, op.tag)
                          : pg_->recv(buffers.back(), op.peer, op.tag));
    }
    for (auto& w : works) finish(std::move(w));
  }
  std::function<void()> isend(const at::Tensor& t, int peer, int tag) override {
    struct Posted {
      std::vector<at::Tensor> buffer;
      decltype(std::declval<PG&>().barrier()) work;
    };
    auto p = std::make_shared<Posted>();
    p->buffer = {carrier(t)};
    p->work = pg_->send(p->buffer, peer, tag);
    return [this, p] {
      if (!p->work) return;
      auto w = std::move(p->work);
      finish(std::move(w));
      p->buffer.clear();
    };
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

// Builds the process group of `size` ranks whose store keys start with `prefix`; this rank is
// `groupRank` in it.
using GroupFactory = std::function<std::shared_ptr<CollectiveGroup>(const std::string& prefix,
                                                                    int groupRank, int size)>;

// The Communicator of one process group (c10d_communicator.cpp); `group` is null for a group of
// one, which never communicates. `wire` counts what is actually sent.
std::unique_ptr<Communicator> makeC10dCommunicator(std::shared_ptr<CollectiveGroup> group,
                                                   std::string backend, int groupRank, int size,
                                                   CommStats* stats, CommStats* wire);

struct ControlStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::string prefix;
};

// The part of a Session (its Impl, c10d_backend.cpp) that the backends' files read: the Gloo
// device and the process-group factories below keep reading it for the session's lifetime.
struct SessionState {
  DistEnv env;
  std::string backend;
  std::chrono::milliseconds timeout;
  std::unique_ptr<ControlStore> store;
  std::string localAddress;
#if SB_HAVE_GLOO
  std::shared_ptr<::gloo::transport::Device> glooDevice;
#endif
  int cudaDevice = -1;  // nccl: this process's GPU
};

#if SB_HAVE_GLOO
// c10d_gloo.cpp: this process's Gloo device (s.glooDevice) and the address it listens on
// (s.localAddress); Gloo's process groups on it.
void makeGlooDevice(SessionState& s, const DistEnv& env);
GroupFactory glooGroupFactory(SessionState& s);
#endif

// c10d_nccl.cpp: this process's GPU (s.cudaDevice), made current; throws when the ranks of this
// host outnumber its GPUs.
void selectNcclDevice(SessionState& s, const DistEnv& env);
#if SB_HAVE_NCCL
// c10d_nccl.cpp: NCCL's process groups on s.cudaDevice.
GroupFactory ncclGroupFactory(SessionState& s);
#endif

}  // namespace sb::harness
