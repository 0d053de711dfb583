#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "harness/comm/comm.h"
#include "harness/comm/mesh.h"
#include "harness/comm/rank_context.h"
#include "harness/comm/world.h"

namespace sb::harness {

struct ThreadsMessage;  // a posted send (threads_backend.cpp)

struct ThreadsOptions {
  // A rank blocked in a collective longer than this aborts the run with an error naming it.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Intra-op threads per rank; 0 picks max(1, the process's intra-op threads / world size).
  int intraOpThreads = 0;
};

// The embedded `threads` backend: every rank of a mesh is a thread of this process. Rank 0
// runs on the calling thread, ranks 1..n-1 on threads this object owns, so a one-rank mesh
// adds no thread hand-off to a timed step.
//
// Collectives meet at a shared slot per group: each rank publishes its buffer, waits at the
// group's barrier, reads what it needs from the others' buffers, and waits at a second barrier
// before anyone may reuse a buffer. Reductions add the ranks' buffers in group rank order, so
// results are deterministic and identical on every rank. A rank that throws, or waits past the
// timeout, aborts the run: every rank blocked in a collective wakes and fails, and `run`
// rethrows the first error with its rank.
class ThreadsWorld final : public World {
 public:
  explicit ThreadsWorld(DeviceMesh mesh, ThreadsOptions options = {});
  ~ThreadsWorld();
  ThreadsWorld(const ThreadsWorld&) = delete;
  ThreadsWorld& operator=(const ThreadsWorld&) = delete;

  const DeviceMesh& mesh() const override { return mesh_; }
  std::string backendName() const override { return "threads"; }
  std::vector<int> localRanks() const override { return mesh_.ranks(); }
  int size() const { return mesh_.size(); }

  // Runs fn(ctx) on every rank at once and waits for all of them. Rethrows the first error.
  void run(const std::function<void(RankContext&)>& fn) override;

  // Calls and bytes of every collective `rank` issued since the last resetStats().
  const CommStats& stats(int rank) const override { return stats_.at(rank); }
  void resetStats() override;

  class Group;

 private:
  class Context;
  friend class ThreadsCommunicator;

  Communicator& communicator(int rank, const std::vector<int>& axes);
  // Blocks until every member of `group` arrived; throws if the run was aborted or timed out.
  void arriveAndWait(Group& group, int rank, const char* what);
  // Communicator::exchange within `group`: sends are posted to the peer's mailbox, each
  // receive takes the oldest message from its peer and copies it, and the call returns once
  // every send it posted has been taken. Throws if the run was aborted or timed out.
  void exchange(Group& group, int groupRank, int rank, const std::vector<Communicator::P2POp>& ops);
  // Communicator::isend within `group`: the message posted under `tag` (returned), and waiting
  // until the peer has taken it (`rank`, `peer`: global ranks, for the timeout's message).
  std::shared_ptr<ThreadsMessage> post(Group& group, int groupRank, int peer, int tag,
                                       const at::Tensor& tensor);
  void waitTaken(const std::shared_ptr<ThreadsMessage>& m, int rank, int peer, int tag);
  void abort(const std::string& reason);
  // abort() with mu_ held: the first reason stays; every waiting rank wakes.
  void abortLocked(const std::string& reason);
  void workerLoop(int rank);
  void runRank(int rank, const std::function<void(RankContext&)>& fn);

  DeviceMesh mesh_;
  ThreadsOptions options_;
  int intraOpThreads_;
  int callerThreads_;
  std::vector<CommStats> stats_;
  std::vector<std::unique_ptr<Context>> contexts_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool aborted_ = false;
  std::string abortReason_;
  std::map<std::vector<int>, std::unique_ptr<Group>> groups_;  // by member ranks

  // Job hand-off to the worker threads.
  std::condition_variable jobCv_;
  std::condition_variable doneCv_;
  uint64_t jobGeneration_ = 0;
  int pending_ = 0;
  bool shutdown_ = false;
  const std::function<void(RankContext&)>* job_ = nullptr;
  std::vector<std::pair<int, std::string>> errors_;
  std::vector<std::thread> workers_;
};

}  // namespace sb::harness
