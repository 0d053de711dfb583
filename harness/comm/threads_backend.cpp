#include "harness/comm/threads_backend.h"

#include <deque>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "harness/measure/device.h"
#include "harness/measure/memory.h"

namespace sb::harness {

Communicator& RankContext::world() {
  std::vector<int> axes(mesh_.ndim());
  for (int i = 0; i < mesh_.ndim(); ++i) axes[i] = i;
  return group(axes);
}

// A posted send: the sender's tensor, until the receiver has copied it.
struct ThreadsMessage {
  at::Tensor tensor;
  bool taken = false;
};

class ThreadsWorld::Group {
 public:
  explicit Group(std::vector<int> members)
      : members(std::move(members)), slots(this->members.size()), rows(this->members.size()) {}
  using Message = ThreadsMessage;
  std::map<std::tuple<int, int, int>, std::deque<std::shared_ptr<Message>>> mail;  // from, to, tag
  std::vector<int> members;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<at::Tensor> slots;           // each member's published buffer
  std::vector<std::vector<int64_t>> rows;  // each member's row counts, where relevant
};

class ThreadsCommunicator final : public Communicator {
 public:
  ThreadsCommunicator(ThreadsWorld& world, ThreadsWorld::Group& group, int globalRank,
                      int groupRank, CommStats* stats)
      : Communicator(groupRank, static_cast<int>(group.members.size()), stats),
        world_(world),
        group_(group),
        globalRank_(globalRank) {}

  std::string backendName() const override { return "threads"; }

  // The all-reduce sums into a fresh tensor before it copies back; the other collectives
  // allocate only what they return.
  int64_t doScratchBytes(Collective c, int64_t myBlockBytes, int64_t, at::ScalarType,
                         int64_t) const override {
    return c == Collective::kAllReduce ? myBlockBytes : 0;
  }

 protected:
  void doAllReduce(at::Tensor& tensor) override {
    publish(tensor, {}, "all_reduce");
    for (int r = 0; r < size(); ++r) checkSameShape(r, tensor, "all_reduce");
    at::Tensor sum = group_.slots[0].clone();
    for (int r = 1; r < size(); ++r) sum.add_(group_.slots[r]);
    finish("all_reduce");
    tensor.copy_(sum);
  }

  at::Tensor doAllGather(const at::Tensor& input, const std::vector<int64_t>& rows) override {
    publish(input, rows, "all_gather");
    std::vector<at::Tensor> parts;
    for (int r = 0; r < size(); ++r) {
      TORCH_CHECK(group_.slots[r].size(0) == rows[r], "all_gather: rank ", group_.members[r],
                  " sent ", group_.slots[r].size(0), " rows, rank ", globalRank_, " expected ",
                  rows[r]);
      parts.push_back(group_.slots[r]);
    }
    at::Tensor out = at::cat(parts, 0);
    // Let go of the other ranks' buffers before they may leave: each rank's memory then peaks
    // where its own code says, not when another thread happens to return.
    parts.clear();
    finish("all_gather");
    return out;
  }

  at::Tensor doReduceScatter(const at::Tensor& input, const std::vector<int64_t>& rows) override {
    publish(input, rows, "reduce_scatter");
    int64_t offset = 0;
    for (int r = 0; r < rank(); ++r) offset += rows[r];
    at::Tensor sum;
    for (int r = 0; r < size(); ++r) {
      checkSameShape(r, input, "reduce_scatter");
      at::Tensor block = group_.slots[r].narrow(0, offset, rows[rank()]);
      if (r == 0) {
        sum = block.clone();
      } else {
        sum.add_(block);
      }
    }
    finish("reduce_scatter");
    return sum;
  }

  at::Tensor doAllToAll(const at::Tensor& input, const std::vector<int64_t>& sendRows,
                        const std::vector<int64_t>& recvRows) override {
    publish(input, sendRows, "all_to_all");
    std::vector<at::Tensor> parts;
    for (int r = 0; r < size(); ++r) {
      const auto& theirSend = group_.rows[r];
      TORCH_CHECK(theirSend[rank()] == recvRows[r], "all_to_all: rank ", group_.members[r],
                  " sends ", theirSend[rank()], " rows to rank ", globalRank_, ", which expects ",
                  recvRows[r]);
      int64_t offset = 0;
      for (int k = 0; k < rank(); ++k) offset += theirSend[k];
      parts.push_back(group_.slots[r].narrow(0, offset, recvRows[r]));
    }
    at::Tensor out = at::cat(parts, 0);
    parts.clear();
    finish("all_to_all");
    return out;
  }

  void doBroadcast(at::Tensor& tensor, int root) override {
    publish(tensor, {}, "broadcast");
    checkSameShape(root, tensor, "broadcast");
    at::Tensor copy = rank() == root ? at::Tensor() : group_.slots[root].clone();
    finish("broadcast");
    if (rank() != root) tensor.copy_(copy);
  }

  void doBarrier() override { world_.arriveAndWait(group_, globalRank_, "barrier"); }

  void doExchange(const std::vector<P2POp>& ops) override {
    for (const auto& op : ops) {
      if (op.kind == P2POp::Kind::kSend) waitForStream(op.tensor);
    }
    world_.exchange(group_, rank(), globalRank_, ops);
  }

  std::unique_ptr<PendingSend> doIsend(const at::Tensor& tensor, int dst, int tag) override {
    waitForStream(tensor);
    struct Posted final : PendingSend {
      ThreadsWorld* world;
      std::shared_ptr<ThreadsMessage> message;
      int rank, peer, tag;
      void wait() override {
        if (message) world->waitTaken(message, rank, peer, tag);
        message.reset();
      }
    };
    auto p = std::make_unique<Posted>();
    p->world = &world_;
    p->message = world_.post(group_, rank(), dst, tag, tensor);
    p->rank = globalRank_;
    p->peer = group_.members[dst];
    p->tag = tag;
    return p;
  }

 private:
  // On a GPU each rank queues its work on its own stream: what it publishes must be finished
  // before another rank reads it, and what it read before another may reuse or free it.
  void publish(const at::Tensor& t, std::vector<int64_t> rows, const char* what) {
    waitForStream(t);
    group_.slots[rank()] = t;
    group_.rows[rank()] = std::move(rows);
    world_.arriveAndWait(group_, globalRank_, what);
  }
  void finish(const char* what) {
    waitForStream(group_.slots[rank()]);
    world_.arriveAndWait(group_, globalRank_, what);
    group_.slots[rank()] = at::Tensor();
  }
  void checkSameShape(int r, const at::Tensor& mine, const char* what) const {
    const at::Tensor& theirs = group_.slots[r];
    TORCH_CHECK(theirs.sizes() == mine.sizes() && theirs.scalar_type() == mine.scalar_type(), what,
                ": rank ", group_.members[r], " has ", theirs.sizes(), " ", theirs.scalar_type(),
                ", rank ", globalRank_, " has ", mine.sizes(), " ", mine.scalar_type());
  }

  ThreadsWorld& world_;
  ThreadsWorld::Group& group_;
  int globalRank_;
};

class ThreadsWorld::Context final : public RankContext {
 public:
  Context(ThreadsWorld& world, int rank) : RankContext(rank, world.mesh()), world_(world) {}
  Communicator& group(const std::vector<int>& axes) override {
    auto it = cache_.find(axes);
    if (it != cache_.end()) return *it->second;
    return world_.communicator(rank(), axes);
  }
  std::map<std::vector<int>, Communicator*> cache_;
  std::vector<std::unique_ptr<Communicator>> owned_;

 private:
  ThreadsWorld& world_;
};

ThreadsWorld::ThreadsWorld(DeviceMesh mesh, ThreadsOptions options)
    : mesh_(std::move(mesh)), options_(options), stats_(mesh_.size()) {
  for (int r = 0; r < mesh_.size(); ++r) {
    TORCH_CHECK(mesh_.ranks()[r] == r, "the threads backend numbers ranks 0..n-1 in mesh order");
  }
  // The ranks share the process's intra-op threads (OMP_NUM_THREADS or LibTorch's default).
  // Switching the count is costly (OpenMP and BLAS rebuild their pools), so the calling thread
  // switches once here and back in the destructor, and each worker once when it starts.
  callerThreads_ = at::get_num_threads();
  intraOpThreads_ = options_.intraOpThreads > 0 ? options_.intraOpThreads
                                                : std::max(1, callerThreads_ / mesh_.size());
  if (intraOpThreads_ != callerThreads_) at::set_num_threads(intraOpThreads_);
  for (int r = 0; r < mesh_.size(); ++r) contexts_.push_back(std::make_unique<Context>(*this, r));
  for (int r = 1; r < mesh_.size(); ++r) workers_.emplace_back([this, r] { workerLoop(r); });
}

ThreadsWorld::~ThreadsWorld() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  jobCv_.notify_all();
  for (auto& t : workers_) t.join();
  if (intraOpThreads_ != callerThreads_) at::set_num_threads(callerThreads_);
}

void ThreadsWorld::resetStats() {
  for (auto& s : stats_) s.reset();
}

Communicator& ThreadsWorld::communicator(int rank, const std::vector<int>& axes) {
  auto members = mesh_.groupRanks(rank, axes);
  const int groupRank = static_cast<int>(mesh_.groupIndex(rank, axes));
  Group* group;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = groups_[members];
    if (!slot) slot = std::make_unique<Group>(members);
    group = slot.get();
  }
  auto& ctx = *contexts_[rank];
  ctx.owned_.push_back(
      std::make_unique<ThreadsCommunicator>(*this, *group, rank, groupRank, &stats_[rank]));
  ctx.cache_[axes] = ctx.owned_.back().get();
  return *ctx.owned_.back();
}

void ThreadsWorld::arriveAndWait(Group& group, int rank, const char* what) {
  std::unique_lock<std::mutex> lock(mu_);
  TORCH_CHECK(!aborted_, "rank ", rank, " stopped in ", what, ": ", abortReason_);
  const uint64_t generation = group.generation;
  if (++group.arrived == static_cast<int>(group.members.size())) {
    group.arrived = 0;
    ++group.generation;
    cv_.notify_all();
    return;
  }
  const bool done = cv_.wait_for(lock, options_.timeout,
                                 [&] { return group.generation != generation || aborted_; });
  if (group.generation != generation) return;
  if (!done) {
    std::string members;
    for (int m : group.members) members += (members.empty() ? "" : ",") + std::to_string(m);
    const std::string reason = "rank " + std::to_string(rank) + " waited more than " +
                               std::to_string(options_.timeout.count()) + " ms in " + what +
                               " for group {" + members + "}";
    abortLocked(reason);
    TORCH_CHECK(false, reason);
  }
  TORCH_CHECK(false, "rank ", rank, " stopped in ", what, ": ", abortReason_);
}

void ThreadsWorld::exchange(Group& group, int me, int rank,
                            const std::vector<Communicator::P2POp>& ops) {
  using Kind = Communicator::P2POp::Kind;
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  std::unique_lock<std::mutex> lock(mu_);
  // Waits for `ready`; a timeout aborts the run, naming what this rank waited for (`what`,
  // worded only then).
  const auto waitFor = [&](const std::function<bool()>& ready,
                           const std::function<std::string()>& what) {
    TORCH_CHECK(!aborted_, "rank ", rank, " stopped in send_recv: ", abortReason_);
    if (cv_.wait_until(lock, deadline, [&] { return ready() || aborted_; }) && !aborted_) return;
    abortLocked("rank " + std::to_string(rank) + " waited more than " +
                std::to_string(options_.timeout.count()) + " ms in send_recv " + what());
    TORCH_CHECK(false, "rank ", rank, " stopped in send_recv: ", abortReason_);
  };
  std::vector<std::shared_ptr<Group::Message>> posted;
  for (const auto& op : ops) {
    if (op.kind != Kind::kSend) continue;
    posted.push_back(std::make_shared<Group::Message>(Group::Message{op.tensor}));
    group.mail[{me, op.peer, op.tag}].push_back(posted.back());
  }
  cv_.notify_all();
  for (const auto& op : ops) {
    if (op.kind != Kind::kRecv) continue;
    auto& queue = group.mail[{op.peer, me, op.tag}];
    waitFor([&] { return !queue.empty(); },
            [&] {
              return "for a send from rank " + std::to_string(group.members[op.peer]) +
                     (op.tag != 0 ? " (tag " + std::to_string(op.tag) + ")" : std::string());
            });
    const std::shared_ptr<Group::Message> m = queue.front();
    queue.pop_front();
    if (m->tensor.sizes() != op.tensor.sizes() ||
        m->tensor.scalar_type() != op.tensor.scalar_type()) {
      std::ostringstream why;
      why << "rank " << group.members[op.peer] << " sent " << m->tensor.sizes() << " "
          << m->tensor.scalar_type() << " to rank " << rank << ", which receives "
          << op.tensor.sizes() << " " << op.tensor.scalar_type();
      abortLocked(why.str());
      TORCH_CHECK(false, "send_recv: ", why.str());
    }
    lock.unlock();
    op.tensor.copy_(m->tensor);
    waitForStream(op.tensor);
    lock.lock();
    m->taken = true;
    cv_.notify_all();
  }
  for (const auto& m : posted) {
    waitFor([&] { return m->taken; }, [] { return std::string("for its send to be received"); });
  }
}

std::shared_ptr<ThreadsMessage> ThreadsWorld::post(Group& group, int me, int peer, int tag,
                                                   const at::Tensor& tensor) {
  std::lock_guard<std::mutex> lock(mu_);
  auto m = std::make_shared<Group::Message>(Group::Message{tensor});
  group.mail[{me, peer, tag}].push_back(m);
  cv_.notify_all();
  return m;
}

void ThreadsWorld::waitTaken(const std::shared_ptr<ThreadsMessage>& m, int rank, int peer,
                             int tag) {
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  std::unique_lock<std::mutex> lock(mu_);
  TORCH_CHECK(!aborted_, "rank ", rank, " stopped in send_recv: ", abortReason_);
  if (cv_.wait_until(lock, deadline, [&] { return m->taken || aborted_; }) && !aborted_) return;
  abortLocked("rank " + std::to_string(rank) + " waited more than " +
              std::to_string(options_.timeout.count()) + " ms in send_recv for its send to rank " +
              std::to_string(peer) + " (tag " + std::to_string(tag) + ") to be received");
  TORCH_CHECK(false, "rank ", rank, " stopped in send_recv: ", abortReason_);
}

void ThreadsWorld::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  abortLocked(reason);
}

void ThreadsWorld::abortLocked(const std::string& reason) {
  if (!aborted_) {
    aborted_ = true;
    abortReason_ = reason;
  }
  cv_.notify_all();
}

void ThreadsWorld::runRank(int rank, const std::function<void(RankContext&)>& fn) {
  ScopedMemoryRank attribution(rank);
  try {
    RankDeviceScope device(rank);
    fn(*contexts_[rank]);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    // c10::Error appends a C++ backtrace after the first line; keep the message.
    if (auto* ce = dynamic_cast<const c10::Error*>(&e)) msg = ce->what_without_backtrace();
    {
      std::lock_guard<std::mutex> lock(mu_);
      errors_.emplace_back(rank, msg);
    }
    abort("rank " + std::to_string(rank) + " failed: " + msg);
  }
}

void ThreadsWorld::workerLoop(int rank) {
  at::set_num_threads(intraOpThreads_);
  uint64_t seen = 0;
  while (true) {
    const std::function<void(RankContext&)>* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      jobCv_.wait(lock, [&] { return shutdown_ || jobGeneration_ != seen; });
      if (shutdown_) return;
      seen = jobGeneration_;
      job = job_;
    }
    runRank(rank, *job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) doneCv_.notify_all();
    }
  }
}

void ThreadsWorld::run(const std::function<void(RankContext&)>& fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = false;
    abortReason_.clear();
    errors_.clear();
    for (auto& [members, group] : groups_) {
      group->arrived = 0;
      for (auto& s : group->slots) s = at::Tensor();
    }
    job_ = &fn;
    pending_ = size() - 1;
    ++jobGeneration_;
  }
  jobCv_.notify_all();
  runRank(0, fn);
  {
    std::unique_lock<std::mutex> lock(mu_);
    doneCv_.wait(lock, [&] { return pending_ == 0; });
  }
  if (!errors_.empty()) {
    // The root cause is the first error that is not another rank's reaction to the abort.
    auto first = errors_.front();
    for (const auto& e : errors_) {
      if (e.second.find(" stopped in ") == std::string::npos) {
        first = e;
        break;
      }
    }
    TORCH_CHECK(false, "rank ", first.first, ": ", first.second);
  }
}

}  // namespace sb::harness
