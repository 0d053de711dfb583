// The Communicator of one c10d process group (c10d_internal.h: CollectiveGroup), whichever
// backend made the group; its own file, as the collectives every backend lacks are built here.
//
// Gloo in LibTorch 1.13 lacks reduce-scatter, all-gather into one tensor and all-gather with
// uneven sizes. They are built here from the collectives it has: reduce-scatter is an
// all-to-all of the blocks followed by a local sum in group rank order (the order the threads
// backend adds in, so exact inputs give bitwise the same numbers); uneven all-gather pads
// every block to the largest and trims. Nor can it add bfloat16: such an all-reduce is an
// all-gather (the bits carried as float16) and a local sum in group rank order. The
// Communicator counts what the executor asked for (compared with the strategy's prediction);
// `wire` counts what was actually sent.

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "harness/comm/c10d_internal.h"

namespace sb::harness {
namespace {

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
  // every block at the largest size before concatenating (and the backend may flatten them on
  // this thread: CollectiveGroup::allGatherFlattensOnCaller); reduce-scatter receives every
  // rank's block before summing.
  int64_t doScratchBytes(Collective c, int64_t myBlockBytes, int64_t maxBlockBytes,
                         at::ScalarType dtype, int64_t resultBytes) const override {
    const int64_t n = size();
    switch (c) {
      case Collective::kAllReduce:
        if (myBlockBytes == 0 || group_->reduces(dtype)) return 0;
        return (n + 1) * myBlockBytes;
      case Collective::kAllGather:
        if (maxBlockBytes == 0) return 0;
      {
        // The padded block and every rank's block received; where the backend flattens them on
        // this thread while it runs, that flat copy too, which is let go before the result is
        // made: it counts above the result only for what it exceeds it by.
        const int64_t flat = group_->allGatherFlattensOnCaller ? n * maxBlockBytes : 0;
        return n * maxBlockBytes + std::max<int64_t>(0, flat - resultBytes) +
               (myBlockBytes != maxBlockBytes ? maxBlockBytes : 0);
      }
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

  void doExchange(const std::vector<P2POp>& ops) override {
    group_->exchange(ops);
    int64_t sent = 0;
    for (const auto& op : ops) sent += op.kind == P2POp::Kind::kSend ? op.tensor.nbytes() : 0;
    wire_->add(Collective::kSendRecv, sent);
  }

  std::unique_ptr<PendingSend> doIsend(const at::Tensor& tensor, int dst, int tag) override {
    struct Posted final : PendingSend {
      std::function<void()> waiter;
      void wait() override {
        if (waiter) waiter();
        waiter = nullptr;
      }
    };
    auto p = std::make_unique<Posted>();
    p->waiter = group_->isend(tensor, dst, tag);
    wire_->add(Collective::kSendRecv, static_cast<int64_t>(tensor.nbytes()));
    return p;
  }

 private:
  std::shared_ptr<CollectiveGroup> group_;
  std::string backend_;
  CommStats* wire_;
};

}  // namespace

std::unique_ptr<Communicator> makeC10dCommunicator(std::shared_ptr<CollectiveGroup> group,
                                                   std::string backend, int groupRank, int size,
                                                   CommStats* stats, CommStats* wire) {
  return std::make_unique<C10dCommunicator>(std::move(group), std::move(backend), groupRank, size,
                                            stats, wire);
}

}  // namespace sb::harness
