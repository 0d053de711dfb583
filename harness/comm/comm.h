#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace sb::harness {

enum class Collective : int {
  kAllReduce = 0,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast,
  kBarrier,
  kSendRecv,  // point-to-point: a batch of sends and receives (Communicator::exchange)
};
inline constexpr int kNumCollectives = 7;

// "all_reduce", "all_gather", ...: the spelling used in records and reports.
const char* collectiveName(Collective c);

// Calls and bytes of one rank's collectives, per collective kind.
//
// Bytes follow nccl-tests' "size" convention, so that they can be turned into algbw/busbw
// the same way: all-reduce and broadcast count the buffer, all-gather the gathered output,
// reduce-scatter the full input, all-to-all the send buffer, send_recv (one batch of point-to-
// point operations) the bytes this rank sends. A collective over a group of one rank moves
// nothing and counts its call with zero bytes.
struct NodeComm;

struct CommStats {
  struct Entry {
    int64_t calls = 0;
    int64_t bytes = 0;
  };
  std::array<Entry, kNumCollectives> entries{};

  Entry& operator[](Collective c) { return entries[static_cast<int>(c)]; }
  const Entry& operator[](Collective c) const { return entries[static_cast<int>(c)]; }
  int64_t totalBytes() const;
  int64_t totalCalls() const;
  void add(Collective c, int64_t bytes) {
    auto& e = (*this)[c];
    e.calls += 1;
    e.bytes += bytes;
  }
  // Adds another's totals (its byNode is not added).
  CommStats& operator+=(const CommStats& o) {
    for (size_t k = 0; k < entries.size(); ++k) {
      entries[k].calls += o.entries[k].calls;
      entries[k].bytes += o.entries[k].bytes;
    }
    return *this;
  }
  // Every call and byte k times (a step's, over k steps).
  void scale(int64_t k) {
    for (auto& e : entries) {
      e.calls *= k;
      e.bytes *= k;
    }
  }
  void reset();  // totals and byNode
  // The totals' equality (byNode is not compared).
  bool operator==(const CommStats& o) const;
  // "all_reduce 3x 1536 B, all_gather 1x 512 B" (kinds with no calls omitted).
  std::string toString() const;

  // Where the Communicator counted each call (harness/comm/comm_site.h): per node and phase of
  // the step, in the order each was first seen. Predictions leave it empty.
  std::vector<NodeComm> byNode;
  void addAt(const std::string& node, const char* phase, Collective c, int64_t bytes);

 private:
  size_t lastAt_ = 0;  // byNode's entry the last addAt() found: the next is usually at or after it
};

// One node's (or module's, or operator's) collectives in one phase of a step ("forward",
// "backward", "update", "step"): counted by the Communicator, or predicted by a
// strategy (Strategy::predictCommByNode). Node "" is the step outside every named node.
struct NodeComm {
  std::string node;
  std::string phase;
  CommStats comm;  // its byNode empty
};

// The entry of `nodes` for (node, phase), appended where there is none: for building a
// prediction node by node.
CommStats& commAt(std::vector<NodeComm>& nodes, const std::string& node, const char* phase);
// The sum over nodes.
CommStats totalOf(const std::vector<NodeComm>& nodes);

// One rank's handle on one process group: the ranks of a mesh axis, of several axes, or of the
// whole mesh. Executors are written once, SPMD, against this interface; `threads` implements
// it in-process, and c10d process groups (Gloo, NCCL) implement it across processes.
//
// Every collective is a group-wide call: all members must call the same collectives in the
// same order with matching sizes. The public methods validate arguments and count calls and
// bytes; backends override the protected `do*` methods. As in c10d's Backend, a backend that
// lacks a collective keeps the base implementation, which fails with
// "Backend X does not support Y".
class Communicator {
 public:
  Communicator(int rank, int size, CommStats* stats) : rank_(rank), size_(size), stats_(stats) {}
  virtual ~Communicator() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backendName() const = 0;

  // Sums `tensor` over the group, in place. Every rank ends with bitwise identical values.
  void allReduce(at::Tensor& tensor);

  // Concatenates every rank's `input` along dim 0, in group rank order. Ranks may hold
  // different row counts; `rows[r]` is rank r's count and must match its input.
  at::Tensor allGather(const at::Tensor& input, const std::vector<int64_t>& rows);

  // `input` is `sum(rows)` rows along dim 0, block r destined to rank r; returns the sum over
  // ranks of this rank's block (`rows[rank()]` rows).
  at::Tensor reduceScatter(const at::Tensor& input, const std::vector<int64_t>& rows);

  // Sends block r of `input` (`sendRows[r]` rows along dim 0) to rank r and returns the
  // concatenation of the blocks received from ranks 0..n-1 (`recvRows[r]` rows from rank r).
  at::Tensor allToAll(const at::Tensor& input, const std::vector<int64_t>& sendRows,
                      const std::vector<int64_t>& recvRows);

  // Copies `root`'s tensor into every rank's `tensor`.
  void broadcast(at::Tensor& tensor, int root);

  void barrier();

  // Point-to-point, as torch.distributed.batch_isend_irecv: the sends and receives of one
  // batch are posted together and all complete before it returns, so a ring step (send to the
  // next rank, receive from the previous) cannot deadlock. Only the ranks a batch names take
  // part; a send must meet a receive of the same shape and dtype on its peer, in the order the
  // two ranks post them. A receive writes its (contiguous) tensor in place. Peers are group
  // ranks, never this rank. Counted as one send_recv call with the bytes this rank sends.
  struct P2POp {
    enum class Kind { kSend, kRecv } kind;
    at::Tensor tensor;
    int peer;
    // Sends and receives match per (peer, tag), in the order each side posts them.
    int tag = 0;
  };
  void exchange(const std::vector<P2POp>& ops);
  void send(const at::Tensor& tensor, int dst) { exchange({{P2POp::Kind::kSend, tensor, dst}}); }
  void recv(at::Tensor& tensor, int src) { exchange({{P2POp::Kind::kRecv, tensor, src}}); }

  // Asynchronous point-to-point, as torch.distributed.isend and a blocking recv with tags (the
  // pipeline family's activations and gradients): `isend` posts `tensor` to group rank `dst`
  // under `tag` and returns at once; the tensor must stay unchanged, and referenced by the
  // returned send, until its wait() returns (a pipeline waits for its sends at the end of its
  // step, as torch.distributed.pipelining does). `recv(tensor, src, tag)` waits for the oldest
  // send from `src` under `tag` and writes it into `tensor` in place (contiguous, of the sent
  // shape and dtype). Each is one send_recv call: a send counts its bytes, a receive none. A
  // receive that waits past the backend's timeout fails the run naming the rank and the peer.
  class PendingSend {
   public:
    virtual ~PendingSend() = default;
    virtual void wait() = 0;
  };
  std::unique_ptr<PendingSend> isend(const at::Tensor& tensor, int dst, int tag);
  void recv(at::Tensor& tensor, int src, int tag);
  // One ring step: sends `tensor` to group rank (rank + 1) mod n and returns what rank
  // (rank - 1) mod n sent, shaped and typed as `tensor`.
  at::Tensor ringShift(const at::Tensor& tensor);

  // Bytes of tensors the backend allocates inside one collective besides the tensor it returns
  // (or reduces into), at their peak: what a memory model adds for the collective, since the
  // memory tracker sees every one of them. `myBlockBytes` is this rank's block (all-reduce: its
  // buffer; all-gather: its input; reduce-scatter: its output; all-to-all: its input),
  // `maxBlockBytes` the largest block of any rank of the group, `resultBytes` what the
  // collective returns (all-gather: every rank's block; -1: as many blocks as ranks, each
  // `myBlockBytes`), for a backend whose temporary outlives none of the result. A group of one
  // rank never reaches its backend (its collectives copy or do nothing): 0.
  int64_t scratchBytes(Collective c, int64_t myBlockBytes, int64_t maxBlockBytes,
                       at::ScalarType dtype, int64_t resultBytes = -1) const {
    if (resultBytes < 0) resultBytes = size_ * myBlockBytes;
    return size_ > 1 ? doScratchBytes(c, myBlockBytes, maxBlockBytes, dtype, resultBytes) : 0;
  }

 protected:
  // scratchBytes for a group of two ranks or more: the backend's.
  virtual int64_t doScratchBytes(Collective c, int64_t myBlockBytes, int64_t maxBlockBytes,
                                 at::ScalarType dtype, int64_t resultBytes) const {
    return 0;
  }
  virtual void doAllReduce(at::Tensor& tensor);
  virtual at::Tensor doAllGather(const at::Tensor& input, const std::vector<int64_t>& rows);
  virtual at::Tensor doReduceScatter(const at::Tensor& input, const std::vector<int64_t>& rows);
  virtual at::Tensor doAllToAll(const at::Tensor& input, const std::vector<int64_t>& sendRows,
                                const std::vector<int64_t>& recvRows);
  virtual void doBroadcast(at::Tensor& tensor, int root);
  virtual void doBarrier();
  virtual void doExchange(const std::vector<P2POp>& ops);
  // isend's posting, for backends that can return before the peer receives; by default the
  // send is a blocking exchange (a pipeline on such a backend may deadlock: none is built so).
  virtual std::unique_ptr<PendingSend> doIsend(const at::Tensor& tensor, int dst, int tag);
  // What every point-to-point op must be: a peer of the group other than this rank, a defined
  // contiguous tensor, a nonnegative tag; `what` names the op in the message.
  void checkP2P(const char* what, const at::Tensor& tensor, int peer, int tag) const;

 private:
  [[noreturn]] void unsupported(Collective c) const;
  void count(Collective c, int64_t bytes);
  void checkRows(const std::vector<int64_t>& rows, const char* what) const;

  int rank_;
  int size_;
  CommStats* stats_;
};

// Bytes of `rows` rows of a tensor whose other dims hold `rowElems` elements of `elemSize`.
inline int64_t rowBytes(int64_t rows, int64_t rowElems, int64_t elemSize) {
  return rows * rowElems * elemSize;
}

}  // namespace sb::harness
