// Zero Bubble's split backward (strategies/pipeline/split_backward.h): I then W must give the
// input's and every parameter's gradient of the plain backward, to the bit; I must compute no
// parameter's gradient, and W nothing of the activations' side again.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include "strategies/pipeline/split_backward.h"

namespace sb::strategies::pipeline {
namespace {

namespace ag = torch::autograd;

// Counts the times a node runs.
class Count final : public ag::FunctionPreHook {
 public:
  explicit Count(int* n) : n_(n) {}
  ag::variable_list operator()(const ag::variable_list& g) override {
    ++*n_;
    return g;
  }

 private:
  int* n_;
};

struct Stage {
  std::vector<at::Tensor> params;
  // Two linear layers with a GELU between and a layer norm, as a transformer's MLP half; with
  // `tied`, the second layer reuses the first's weight (transposed), as a tied embedding does.
  at::Tensor forward(const at::Tensor& x, bool tied, int* geluRuns = nullptr) const {
    at::Tensor h = at::layer_norm(x, {x.size(-1)}, params[4], params[5]);
    h = at::gelu(at::linear(h, params[0], params[1]));
    if (geluRuns) h.grad_fn()->add_pre_hook(std::make_unique<Count>(geluRuns));
    return at::linear(h, tied ? params[0].t() : params[2], params[3]);
  }
};

Stage makeStage(int64_t d, int64_t hidden) {
  at::manual_seed(3);
  Stage s;
  for (auto shape :
       std::vector<std::vector<int64_t>>{{hidden, d}, {hidden}, {d, hidden}, {d}, {d}, {d}}) {
    s.params.push_back(at::randn(shape, at::kDouble).requires_grad_(true));
  }
  for (auto& p : s.params) p.mutable_grad() = at::zeros_like(p);
  return s;
}

TEST(SplitBackward, InputThenWeightIsThePlainBackwardBitwise) {
  for (bool tied : {false, true}) {
    Stage s = makeStage(8, tied ? 8 : 16);
    const at::Tensor x0 = at::randn({4, 8}, at::kDouble);
    const at::Tensor gy = at::randn({4, 8}, at::kDouble);
    // The plain backward.
    at::Tensor x = x0.clone().requires_grad_(true);
    ag::backward({s.forward(x, tied)}, {gy});
    std::vector<at::Tensor> want;
    for (auto& p : s.params) {
      want.push_back(p.grad().clone());
      p.mutable_grad().zero_();
    }
    const at::Tensor wantGx = x.grad().clone();
    // I, then W.
    at::Tensor x2 = x0.clone().requires_grad_(true);
    int geluRuns = 0;
    const at::Tensor y = s.forward(x2, tied, &geluRuns);
    WeightPass w;
    const at::Tensor gx = backwardInput(x2, y, gy, s.params, w);
    EXPECT_TRUE(at::equal(gx, wantGx)) << "tied " << tied;
    for (const auto& p : s.params) {
      EXPECT_EQ(p.grad().abs().sum().item<double>(), 0) << "I computed a parameter's gradient";
    }
    EXPECT_EQ(geluRuns, 1);
    ASSERT_TRUE(w.ready());
    backwardWeight(w, s.params);
    EXPECT_EQ(geluRuns, 1) << "W ran the activations' side again";
    EXPECT_FALSE(x2.grad().defined()) << "W reached the input";
    for (size_t k = 0; k < want.size(); ++k) {
      if (tied && k == 0) {
        // Its two uses' parts added in the engine's order.
        EXPECT_TRUE(at::allclose(s.params[k].grad(), want[k], 1e-12, 1e-12)) << k;
      } else {
        EXPECT_TRUE(at::equal(s.params[k].grad(), want[k])) << "tied " << tied << ", param " << k;
      }
    }
    EXPECT_FALSE(w.ready());
    EXPECT_THROW(backwardWeight(w, s.params), c10::Error) << "W twice, or before I";
  }
}

// An input that takes no gradient (ids): I computes nothing, W is the whole backward.
TEST(SplitBackward, WithoutAnInputGradientWIsTheWholeBackward) {
  at::manual_seed(5);
  const at::Tensor table = at::randn({16, 8}, at::kDouble).requires_grad_(true);
  table.mutable_grad() = at::zeros_like(table);
  const at::Tensor ids = at::randint(0, 16, {4, 3}, at::kLong);
  const at::Tensor gy = at::randn({4, 3, 8}, at::kDouble);
  ag::backward({at::embedding(table, ids).tanh()}, {gy});
  const at::Tensor want = table.grad().clone();
  table.mutable_grad().zero_();
  const at::Tensor y = at::embedding(table, ids).tanh();
  WeightPass w;
  EXPECT_FALSE(backwardInput(ids, y, gy, {table}, w).defined());
  EXPECT_EQ(table.grad().abs().sum().item<double>(), 0);
  backwardWeight(w, {table});
  EXPECT_TRUE(at::equal(table.grad(), want));
}

// A stage of no parameters (an activation, a view): I is the input's gradient, W nothing; a
// stage whose output takes no gradient at all: nothing in either.
TEST(SplitBackward, StagesWithoutParametersOrGradients) {
  const at::Tensor x = at::randn({3, 5}, at::kDouble).requires_grad_(true);
  const at::Tensor gy = at::randn({3, 5}, at::kDouble);
  WeightPass w;
  const at::Tensor gx = backwardInput(x, x.tanh(), gy, {}, w);
  EXPECT_TRUE(at::equal(gx, ag::grad({x.tanh()}, {x}, {gy}).at(0))) << "the input's gradient";
  ASSERT_TRUE(w.ready());
  backwardWeight(w, {});
  EXPECT_FALSE(w.ready());
  const at::Tensor ids = at::randint(0, 4, {3}, at::kLong);
  EXPECT_FALSE(backwardInput(ids, ids.to(at::kDouble), gy.select(1, 0), {}, w).defined());
  backwardWeight(w, {});
}

}  // namespace
}  // namespace sb::strategies::pipeline
