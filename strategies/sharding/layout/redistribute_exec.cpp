#include "strategies/sharding/layout/redistribute_exec.h"
#include "harness/comm/comm_site.h"

#include "kernels/pack.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace sb::harness {
namespace {

Box intersect(const Box& a, const Box& b) {
  Box out;
  for (size_t d = 0; d < a.offset.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.length[d], b.offset[d] + b.length[d]);
    out.offset.push_back(lo);
    out.length.push_back(std::max<int64_t>(0, hi - lo));
  }
  return out;
}

// The part `sub` of a tensor `t` that holds `tBox` of the full tensor (a view).
at::Tensor relSlice(at::Tensor t, const Box& tBox, const Box& sub) {
  for (size_t d = 0; d < sub.offset.size(); ++d) {
    t = t.narrow(static_cast<int64_t>(d), sub.offset[d] - tBox.offset[d], sub.length[d]);
  }
  return t;
}

// `in` with dimension d moved to the front, in a fresh contiguous tensor: the row order the
// dim-0 collectives need.
at::Tensor movedCopy(const at::Tensor& in, int64_t d) {
  std::vector<int64_t> shape = in.sizes().vec();
  std::rotate(shape.begin(), shape.begin() + d, shape.begin() + d + 1);
  at::Tensor out = at::empty(shape, in.options());
  out.copy_(in.movedim(d, 0));
  return out;
}

int64_t groupIndexOf(const std::vector<int64_t>& mesh, const std::vector<int64_t>& coords,
                     const std::vector<int>& axes) {
  int64_t idx = 0;
  for (int a : axes) idx = idx * mesh[a] + coords[a];
  return idx;
}

// The mesh axes not in `axes`, in order.
std::vector<int> complementOf(const std::vector<int>& axes, int meshNdim) {
  std::vector<int> out;
  for (int a = 0; a < meshNdim; ++a) {
    if (std::find(axes.begin(), axes.end(), a) == axes.end()) out.push_back(a);
  }
  return out;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RedistributeFn : torch::autograd::Function<RedistributeFn> {
  static at::Tensor forward(AutogradContext* actx, const at::Tensor& x, int64_t runner) {
    actx->saved_data["runner"] = runner;
    saveCommNode(actx);
    return reinterpret_cast<const RedistRunner*>(static_cast<intptr_t>(runner))->run(x, false);
  }
  static variable_list backward(AutogradContext* actx, variable_list grads) {
    const auto* runner = reinterpret_cast<const RedistRunner*>(
        static_cast<intptr_t>(actx->saved_data["runner"].toInt()));
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const auto site = backwardCommSite(actx);
    const at::Tensor g = grads[0].contiguous();
    at::Tensor gx = runner->run(g, true);
    // A plan of relabellings hands the gradient straight back; autograd then needs its own.
    if (gx.is_alias_of(g)) gx = gx.clone();
    return {gx, at::Tensor()};
  }
};

}  // namespace

int64_t meshPosition(const std::vector<int64_t>& mesh, const std::vector<int64_t>& coords) {
  int64_t p = 0;
  for (size_t a = 0; a < mesh.size(); ++a) p = p * mesh[a] + coords[a];
  return p;
}

at::Tensor exchangeBoxes(const at::Tensor& local, const Box& mine, const std::vector<Box>& dest,
                         const std::vector<Box>& src, const Box& outBox, Communicator& comm,
                         RedistFault fault) {
  const int n = comm.size();
  const int me = comm.rank();
  std::vector<Box> sendBoxes(n), recvBoxes(n);
  std::vector<int64_t> sendCounts(n), recvCounts(n);
  for (int j = 0; j < n; ++j) {
    sendBoxes[j] = intersect(mine, dest[j]);
    sendCounts[j] = sendBoxes[j].numel();
    recvBoxes[j] = intersect(src[j], outBox);
    recvCounts[j] = recvBoxes[j].numel();
  }
  // The planted fault moves one element of every sender's first block into its second, and
  // every receiver expects exactly that.
  std::vector<int64_t> sent = sendCounts, received = recvCounts;
  const bool offByOne = fault == RedistFault::kAllToAllSplitOffByOne && n >= 2;
  if (offByOne) {
    if (sent[0] > 0) {
      sent[0] -= 1;
      sent[1] += 1;
    }
    for (int i = 0; i < n; ++i) {
      if (intersect(src[i], dest[0]).numel() == 0) continue;
      if (me == 0) received[i] -= 1;
      if (me == 1) received[i] += 1;
    }
  }
  // Blocks relative to the tensors they are cut from or written into.
  const auto relative = [](const Box& b, const Box& base) {
    kernels::Region r{b.offset, b.length};
    for (size_t d = 0; d < r.offset.size(); ++d) r.offset[d] -= base.offset[d];
    return r;
  };
  std::vector<kernels::Region> sendRegions, recvRegions;
  for (int j = 0; j < n; ++j) {
    sendRegions.push_back(relative(sendBoxes[j], mine));
    recvRegions.push_back(relative(recvBoxes[j], outBox));
  }
  at::Tensor recv;
  {
    const at::Tensor send = kernels::packRegions(local, sendRegions);
    recv = comm.allToAll(send, sent, received);
  }
  if (!offByOne) {
    at::Tensor out = at::empty(outBox.length, local.options());
    kernels::unpackRegions(recv, out, recvRegions);
    return out;
  }
  // The planted fault's blocks are a size off: each goes where its own block belongs, cut to
  // what arrived, the rest zeros.
  at::Tensor out = at::zeros(outBox.length, local.options());
  int64_t off = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t take = std::min(recvCounts[i], received[i]);
    if (take > 0) {
      at::Tensor staged = at::zeros({recvCounts[i]}, local.options());
      staged.narrow(0, 0, take).copy_(recv.narrow(0, off, take));
      relSlice(out, outBox, recvBoxes[i]).copy_(staged.view(recvBoxes[i].length));
    }
    off += received[i];
  }
  return out;
}

RedistRunner::RedistRunner(const RedistGeometry& g, const RedistPlan& plan, RankContext& ctx,
                           at::ScalarType dtype, RedistFault fault)
    : g_(g), plan_(plan), ctx_(ctx), fault_(fault), dtype_(dtype) {
  coords_ = ctx.mesh().coords(ctx.rank());
  position_ = static_cast<int>(meshPosition(g.mesh, coords_));
}

at::Tensor RedistRunner::operator()(const at::Tensor& local) const {
  return RedistributeFn::apply(local, static_cast<int64_t>(reinterpret_cast<intptr_t>(this)));
}

at::Tensor RedistRunner::run(const at::Tensor& local, bool backward) const {
  at::Tensor cur = local;
  const int meshNdim = static_cast<int>(g_.mesh.size());
  const size_t k = plan_.steps.size();
  for (size_t s = 0; s < k; ++s) {
    if (!backward) {
      cur = step(cur, plan_.layouts[s], plan_.steps[s]);
    } else {
      const size_t i = k - 1 - s;
      cur = step(cur, plan_.layouts[i + 1].dual(meshNdim), transposeStep(plan_.steps[i]));
    }
  }
  return cur;
}

at::Tensor RedistRunner::step(const at::Tensor& in, const Layout& before,
                              const RedistStep& st) const {
  const auto afterOpt = applyStep(before, st);
  TORCH_INTERNAL_ASSERT(afterOpt, st.toString(), " cannot act on ", before.sequence());
  const Layout& after = *afterOpt;
  const int64_t n = g_.groupSize(st.axes);
  if (n == 1) return in;  // a group of one: the same tensor under another name
  const Box inBox = before.box(g_.shape, g_.mesh, coords_);
  const Box outBox = after.box(g_.shape, g_.mesh, coords_);
  TORCH_INTERNAL_ASSERT(in.sizes().vec() == inBox.length, "rank ", ctx_.rank(), " holds ",
                        in.sizes(), " but ", before.sequence(), " gives it ", inBox.toString());
  const auto member = [&](int64_t i) { return g_.memberCoords(coords_, st.axes, i); };
  const auto opts = in.options();
  const int64_t d = st.dim;
  switch (st.kind) {
    case StepKind::kSlice: {
      at::Tensor out = at::empty(outBox.length, opts);
      out.copy_(relSlice(in, inBox, outBox));
      return out;
    }
    case StepKind::kPad: {
      at::Tensor out = at::zeros(outBox.length, opts);
      relSlice(out, outBox, inBox).copy_(in);
      return out;
    }
    case StepKind::kPartition:
      return groupIndexOf(g_.mesh, coords_, st.axes) == 0 ? in.clone() : at::zeros_like(in);
    case StepKind::kAllReduce: {
      at::Tensor out = in.clone();
      ctx_.group(st.axes).allReduce(out);
      return out;
    }
    case StepKind::kAllGather: {
      std::vector<int64_t> rows(n);
      for (int64_t i = 0; i < n; ++i) rows[i] = before.box(g_.shape, g_.mesh, member(i)).length[d];
      at::Tensor gathered;
      {
        const at::Tensor send = d == 0 ? in : movedCopy(in, d);
        gathered = ctx_.group(st.axes).allGather(send, rows);
      }
      if (d == 0) return gathered;
      at::Tensor out = at::empty(outBox.length, opts);
      int64_t off = 0;
      for (int64_t i = 0; i < n; ++i) {
        out.narrow(d, off, rows[i]).copy_(gathered.narrow(0, off, rows[i]).movedim(0, d));
        off += rows[i];
      }
      return out;
    }
    case StepKind::kReduceScatter: {
      std::vector<int64_t> rows(n);
      for (int64_t i = 0; i < n; ++i) rows[i] = after.box(g_.shape, g_.mesh, member(i)).length[d];
      std::vector<int> axes = st.axes;
      if (fault_ == RedistFault::kReduceScatterWrongGroup) {
        const auto other = complementOf(st.axes, static_cast<int>(g_.mesh.size()));
        if (!other.empty() && g_.groupSize(other) == n) axes = other;
      }
      at::Tensor recv;
      {
        const at::Tensor send = d == 0 ? in : movedCopy(in, d);
        recv = ctx_.group(axes).reduceScatter(send, rows);
      }
      if (d == 0) return recv;
      at::Tensor out = at::empty(outBox.length, opts);
      out.copy_(recv.movedim(0, d));
      return out;
    }
    case StepKind::kAllToAll: {
      std::vector<Box> dest(n), src(n);
      for (int64_t i = 0; i < n; ++i) {
        dest[i] = after.box(g_.shape, g_.mesh, member(i));
        src[i] = before.box(g_.shape, g_.mesh, member(i));
      }
      return exchangeBoxes(in, inBox, dest, src, outBox, ctx_.group(st.axes), fault_);
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown step kind");
}

RedistRunner::Memory RedistRunner::memory(int64_t live, bool backward) const {
  Memory m;
  m.peak = live;
  const int meshNdim = static_cast<int>(g_.mesh.size());
  const size_t k = plan_.steps.size();
  bool curIsInput = true;
  int64_t firstBytes = -1, lastBytes = 0;
  for (size_t s = 0; s < k; ++s) {
    const size_t i = backward ? k - 1 - s : s;
    const Layout before = backward ? plan_.layouts[i + 1].dual(meshNdim) : plan_.layouts[i];
    const RedistStep st = backward ? transposeStep(plan_.steps[i]) : plan_.steps[i];
    const Layout after = *applyStep(before, st);
    const int64_t in = g_.localBytes(before, position_);
    if (firstBytes < 0) firstBytes = in;
    const int64_t n = g_.groupSize(st.axes);
    if (n == 1) continue;
    const int64_t out = g_.localBytes(after, position_);
    // The largest block of the group and the backend's scratch for the collective.
    int64_t scratch = 0;
    if (const auto coll = st.collective()) {
      const bool byOutput = st.kind == StepKind::kReduceScatter;
      int64_t maxBlock = 0;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t pos = meshPosition(g_.mesh, g_.memberCoords(coords_, st.axes, j));
        maxBlock =
            std::max(maxBlock, g_.localBytes(byOutput ? after : before, static_cast<int>(pos)));
      }
      scratch = ctx_.group(st.axes).scratchBytes(*coll, byOutput ? out : in, maxBlock, dtype_,
                                                 st.kind == StepKind::kAllGather ? out : -1);
    }
    int64_t extra = 0;
    switch (st.kind) {
      case StepKind::kSlice:
      case StepKind::kPad:
      case StepKind::kPartition:
        extra = out;
        break;
      case StepKind::kAllReduce:
        extra = out + scratch;
        break;
      case StepKind::kAllGather:
      case StepKind::kReduceScatter:
        extra = st.dim == 0 ? out + scratch : std::max(in + out + scratch, 2 * out);
        break;
      case StepKind::kAllToAll:
        extra = std::max(in + out + scratch, 2 * out);
        break;
    }
    m.peak = std::max(m.peak, live + extra);
    live += out;
    if (!curIsInput) live -= in;
    curIsInput = false;
    lastBytes = out;
  }
  if (curIsInput && backward) {  // the gradient is handed back as a copy
    const int64_t bytes = firstBytes >= 0
                              ? firstBytes
                              : g_.localBytes(plan_.layouts.back().dual(meshNdim), position_);
    m.peak = std::max(m.peak, live + bytes);
    live += bytes;
    lastBytes = bytes;
    curIsInput = false;
  }
  m.outBytes = curIsInput ? 0 : lastBytes;
  m.live = live;
  return m;
}

}  // namespace sb::harness
