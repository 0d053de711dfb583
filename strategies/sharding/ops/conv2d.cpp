// conv2d: ColossalAI's ConvStrategyGenerator, 16 strategies on a 2x2 mesh: the [M, K] x [K, N]
// strategies of a contraction over (batch, input channels) x (input channels, output
// channels), the batch split alone first. ATen's im2col convolution, whose columns the memory
// model counts.

#include "strategies/sharding/ops/contraction.h"
#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {
namespace {

std::vector<OpStrategySpec> convSpecs(const reference::OpShape& s) {
  std::vector<OpStrategySpec> out;
  for (const auto& m : linearSplits(true)) {
    out.push_back(spec(s, m.name, {L({m.m, m.k, {}, {}}), L({m.n, m.k, {}, {}}), L({m.n})},
                       {L({m.m, m.n, {}, {}}, m.k)}, m.meshDims));
  }
  return out;
}

std::vector<at::Tensor> convForward(const LocalForward& f) {
  const reference::OpShape& s = f.r.shape;
  // The importer hands a contiguous input (a `contiguous` node where the module's was not); a
  // layout the plan made otherwise is copied here, as the im2col kernel's backward needs.
  const at::Tensor x = f.in[0].is_contiguous() ? f.in[0] : f.in[0].contiguous();
  const auto& in = f.in;
  // ATen's native im2col convolution (thnn_conv2d), not oneDNN's: its buffers are a function
  // of the shapes alone, where oneDNN's blocked reorders pad channels to the CPU's vector
  // width. The reference runs at::conv2d; the results agree to the dtype's tolerance.
  const int64_t st = s.stride(), p = s.padding(), k = s.kernel();
  if (f.r.outputs[0].partialAxes().empty()) {
    return {at::thnn_conv2d(x, in[1], {k, k}, in[2], {st, st}, {p, p})};
  }
  return {f.reduce(at::thnn_conv2d(x, in[1], {k, k}, {}, {st, st}, {p, p})) +
          in[2].view({1, -1, 1, 1})};
}

void convMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  // conv2d's im2col columns, [N, C_in * k * k, out_h * out_w]: in the forward and again in the
  // backward, which recomputes them.
  const int64_t k = m.r.shape.kernel();
  const int64_t columns = m.leaves[0].size(0) * m.leaves[0].size(1) * k * k *
                          m.outputBoxes[0].length[2] * m.outputBoxes[0].length[3] * m.es;
  contractionReplay(m, columns);
}

double convFlops(const ResolvedOp& r, const std::vector<int64_t>& mesh, int rank) {
  const auto coords = harness::DeviceMesh(mesh).coords(rank);
  const harness::Box out = r.outputs[0].box(r.shape.outputs()[0], mesh, coords);
  const harness::Box w = r.operands[1].box(r.shape.operandShape(r.spec.operands[1]), mesh, coords);
  return 6.0 * static_cast<double>(out.numel()) * static_cast<double>(w.numel() / w.length[0]);
}

OpRule convRule() {
  OpRule r;
  r.canonicalShapes = [] {
    return std::vector<nlohmann::json>{
        {{"op", "conv2d"}, {"input", {4, 4, 8, 8}}, {"out_channels", 8}, {"kernel", 3}}};
  };
  r.specs = convSpecs;
  r.layouts = keepLayouts;
  r.faults = [](const OpStrategySpec& sp) { return commonFaults(sp, {}); };
  r.forward = convForward;
  r.memory = convMemory;
  r.flops = convFlops;
  r.statistics = noStatistics;
  // The output sums C_in k k terms, the input's gradient C_out k k, the weight's and the
  // bias's every output position of every image (N H_out W_out).
  r.reductionLength = [](const reference::OpShape& s, const std::string& tensor) -> int64_t {
    const auto out = s.outputs()[0];
    const int64_t k = s.kernel();
    if (tensor == "grad_input") return out[1] * k * k;
    if (tensor == "grad_weight" || tensor == "grad_bias") return out[0] * out[2] * out[3];
    return s.input[1] * k * k;
  };
  return r;
}

}  // namespace
}  // namespace sb::strategies

SB_REGISTER_OP_RULE("conv2d", sb::strategies::convRule());
