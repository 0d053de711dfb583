#include "harness/comm/comm.h"

#include <numeric>
#include <sstream>

#include <ATen/ATen.h>

#include "harness/comm/comm_site.h"
#include "harness/measure/step_trace.h"

namespace sb::harness {

const char* collectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllToAll:
      return "all_to_all";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kSendRecv:
      return "send_recv";
  }
  TORCH_INTERNAL_ASSERT(false, "unknown collective");
}

int64_t CommStats::totalBytes() const {
  int64_t n = 0;
  for (const auto& e : entries) n += e.bytes;
  return n;
}

int64_t CommStats::totalCalls() const {
  int64_t n = 0;
  for (const auto& e : entries) n += e.calls;
  return n;
}

bool CommStats::operator==(const CommStats& o) const {
  for (int i = 0; i < kNumCollectives; ++i) {
    if (entries[i].calls != o.entries[i].calls || entries[i].bytes != o.entries[i].bytes) {
      return false;
    }
  }
  return true;
}

std::string CommStats::toString() const {
  std::ostringstream os;
  bool first = true;
  for (int i = 0; i < kNumCollectives; ++i) {
    if (entries[i].calls == 0) continue;
    if (!first) os << ", ";
    first = false;
    os << collectiveName(static_cast<Collective>(i)) << " " << entries[i].calls << "x "
       << entries[i].bytes << " B";
  }
  return first ? "none" : os.str();
}

void Communicator::unsupported(Collective c) const {
  TORCH_CHECK(false, "Backend ", backendName(), " does not support ", collectiveName(c));
}

CommStats& commAt(std::vector<NodeComm>& nodes, const std::string& node, const char* phase) {
  for (auto& n : nodes) {
    if (n.node == node && n.phase == phase) return n.comm;
  }
  nodes.push_back({node, phase, {}});
  return nodes.back().comm;
}

CommStats totalOf(const std::vector<NodeComm>& nodes) {
  CommStats total;
  for (const auto& n : nodes) total += n.comm;
  return total;
}

void CommStats::reset() {
  entries = {};
  byNode.clear();
  lastAt_ = 0;
}

void CommStats::addAt(const std::string& node, const char* phase, Collective c, int64_t bytes) {
  // A step's sites recur in the same order (node by node, step after step): the search starts
  // where the last call landed, so a call costs a comparison or two however many nodes there are.
  const size_t n = byNode.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (lastAt_ + k) % n;
    if (byNode[i].phase == phase && byNode[i].node == node) {
      byNode[i].comm.add(c, bytes);
      lastAt_ = i;
      return;
    }
  }
  byNode.push_back({node, phase, {}});
  byNode.back().comm.add(c, bytes);
  lastAt_ = n;
}

void Communicator::count(Collective c, int64_t bytes) {
  if (stats_ == nullptr) return;
  const int64_t counted = size_ > 1 ? bytes : 0;
  stats_->add(c, counted);
  stats_->addAt(currentCommNode(), stepPhaseName(currentCommPhase()), c, counted);
}

void Communicator::checkRows(const std::vector<int64_t>& rows, const char* what) const {
  TORCH_CHECK(static_cast<int>(rows.size()) == size_, what, ": expected ", size_,
              " row counts (one per rank), got ", rows.size());
  for (int64_t r : rows) TORCH_CHECK(r >= 0, what, ": negative row count ", r);
}

void Communicator::allReduce(at::Tensor& tensor) {
  TORCH_CHECK(tensor.is_contiguous(), "all_reduce needs a contiguous tensor");
  count(Collective::kAllReduce, tensor.nbytes());
  const TraceScope span("collective", collectiveName(Collective::kAllReduce), tensor.nbytes());
  if (size_ == 1) return;
  doAllReduce(tensor);
}

at::Tensor Communicator::allGather(const at::Tensor& input, const std::vector<int64_t>& rows) {
  checkRows(rows, "all_gather");
  TORCH_CHECK(input.dim() >= 1 && input.size(0) == rows[rank_], "all_gather: rank ", rank_,
              " holds ", input.dim() ? input.size(0) : 0, " rows but the row counts say ",
              rows[rank_]);
  int64_t rowElems = 1;  // from the shape, so that a rank holding no rows counts alike
  for (int64_t d = 1; d < input.dim(); ++d) rowElems *= input.size(d);
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  const int64_t bytes = rowBytes(total, rowElems, input.element_size());
  count(Collective::kAllGather, bytes);
  const TraceScope span("collective", collectiveName(Collective::kAllGather), bytes);
  if (size_ == 1) return input.clone();
  return doAllGather(input.contiguous(), rows);
}

at::Tensor Communicator::reduceScatter(const at::Tensor& input, const std::vector<int64_t>& rows) {
  checkRows(rows, "reduce_scatter");
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  TORCH_CHECK(input.dim() >= 1 && input.size(0) == total, "reduce_scatter: input has ",
              input.dim() ? input.size(0) : 0, " rows, the row counts add up to ", total);
  count(Collective::kReduceScatter, input.nbytes());
  const TraceScope span("collective", collectiveName(Collective::kReduceScatter), input.nbytes());
  if (size_ == 1) return input.clone();
  return doReduceScatter(input.contiguous(), rows);
}

at::Tensor Communicator::allToAll(const at::Tensor& input, const std::vector<int64_t>& sendRows,
                                  const std::vector<int64_t>& recvRows) {
  checkRows(sendRows, "all_to_all send");
  checkRows(recvRows, "all_to_all recv");
  const int64_t total = std::accumulate(sendRows.begin(), sendRows.end(), int64_t{0});
  TORCH_CHECK(input.dim() >= 1 && input.size(0) == total, "all_to_all: input has ",
              input.dim() ? input.size(0) : 0, " rows, the send counts add up to ", total);
  count(Collective::kAllToAll, input.nbytes());
  const TraceScope span("collective", collectiveName(Collective::kAllToAll), input.nbytes());
  if (size_ == 1) return input.clone();
  return doAllToAll(input.contiguous(), sendRows, recvRows);
}

void Communicator::broadcast(at::Tensor& tensor, int root) {
  TORCH_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " outside group of ", size_);
  TORCH_CHECK(tensor.is_contiguous(), "broadcast needs a contiguous tensor");
  count(Collective::kBroadcast, tensor.nbytes());
  const TraceScope span("collective", collectiveName(Collective::kBroadcast), tensor.nbytes());
  if (size_ == 1) return;
  doBroadcast(tensor, root);
}

void Communicator::barrier() {
  count(Collective::kBarrier, 0);
  const TraceScope span("collective", collectiveName(Collective::kBarrier), 0);
  if (size_ == 1) return;
  doBarrier();
}

void Communicator::checkP2P(const char* what, const at::Tensor& tensor, int peer, int tag) const {
  TORCH_CHECK(peer >= 0 && peer < size_ && peer != rank_, what, ": rank ", rank_, " names peer ",
              peer, " in a group of ", size_, " (a peer is another group rank)");
  TORCH_CHECK(tensor.defined() && tensor.is_contiguous(), what,
              ": every tensor must be defined and contiguous");
  TORCH_CHECK(tag >= 0, what, ": tags are nonnegative (c10d's are), got ", tag);
}

void Communicator::exchange(const std::vector<P2POp>& ops) {
  int64_t sent = 0;
  for (const auto& op : ops) {
    checkP2P("send_recv", op.tensor, op.peer, op.tag);
    if (op.kind == P2POp::Kind::kSend) sent += op.tensor.nbytes();
  }
  count(Collective::kSendRecv, sent);
  const TraceScope span("collective", collectiveName(Collective::kSendRecv), sent);
  if (ops.empty() || size_ == 1) return;
  doExchange(ops);
}

namespace {
struct DoneSend final : Communicator::PendingSend {
  void wait() override {}
};
}  // namespace

std::unique_ptr<Communicator::PendingSend> Communicator::isend(const at::Tensor& tensor, int dst,
                                                               int tag) {
  checkP2P("send", tensor, dst, tag);
  count(Collective::kSendRecv, static_cast<int64_t>(tensor.nbytes()));
  const TraceScope span("collective", collectiveName(Collective::kSendRecv), tensor.nbytes());
  return doIsend(tensor, dst, tag);
}

void Communicator::recv(at::Tensor& tensor, int src, int tag) {
  checkP2P("recv", tensor, src, tag);
  count(Collective::kSendRecv, 0);
  const TraceScope span("collective", "recv", static_cast<int64_t>(tensor.nbytes()));
  doExchange({{P2POp::Kind::kRecv, tensor, src, tag}});
}

std::unique_ptr<Communicator::PendingSend> Communicator::doIsend(const at::Tensor& tensor, int dst,
                                                                 int tag) {
  doExchange({{P2POp::Kind::kSend, tensor, dst, tag}});
  return std::make_unique<DoneSend>();
}

at::Tensor Communicator::ringShift(const at::Tensor& tensor) {
  at::Tensor in = tensor.contiguous();
  if (size_ == 1) {
    count(Collective::kSendRecv, 0);
    return in.clone();
  }
  at::Tensor out = at::empty_like(in);
  exchange({{P2POp::Kind::kSend, in, (rank_ + 1) % size_},
            {P2POp::Kind::kRecv, out, (rank_ + size_ - 1) % size_}});
  return out;
}

void Communicator::doExchange(const std::vector<P2POp>&) { unsupported(Collective::kSendRecv); }

void Communicator::doAllReduce(at::Tensor&) { unsupported(Collective::kAllReduce); }
at::Tensor Communicator::doAllGather(const at::Tensor&, const std::vector<int64_t>&) {
  unsupported(Collective::kAllGather);
}
at::Tensor Communicator::doReduceScatter(const at::Tensor&, const std::vector<int64_t>&) {
  unsupported(Collective::kReduceScatter);
}
at::Tensor Communicator::doAllToAll(const at::Tensor&, const std::vector<int64_t>&,
                                    const std::vector<int64_t>&) {
  unsupported(Collective::kAllToAll);
}
void Communicator::doBroadcast(at::Tensor&, int) { unsupported(Collective::kBroadcast); }
void Communicator::doBarrier() { unsupported(Collective::kBarrier); }

}  // namespace sb::harness
