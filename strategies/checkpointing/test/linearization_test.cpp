// The chain workloads cut ResNet-18 and DenseNet-121 into stages that pass one tensor. These
// tests check that the cut computes the same function as the networks written the usual way,
// in one piece: ResNet's skip connections as separate branches, DenseNet's dense blocks as a
// list of every earlier layer's features concatenated anew for each layer. Same parameters
// (by name), same input: the outputs and the updated running statistics must be bitwise equal.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "reference/chain_nets.h"

namespace sb::reference {
namespace {

class Named {
 public:
  explicit Named(const ChainNet& net) : net_(net) {}
  at::Tensor p(const std::string& name) const { return find(net_.parameters(), name); }
  at::Tensor b(const std::string& name) const { return find(net_.buffers(), name); }
  at::Tensor bn(const at::Tensor& x, const std::string& n) const {
    return at::batch_norm(x, p(n + ".weight"), p(n + ".bias"), b(n + ".running_mean"),
                          b(n + ".running_var"), true, 0.1, 1e-5, false);
  }

 private:
  static at::Tensor find(const std::vector<std::pair<std::string, at::Tensor>>& v,
                         const std::string& name) {
    for (const auto& [k, t] : v) {
      if (k == name) return t;
    }
    throw std::runtime_error("no tensor named " + name);
  }
  const ChainNet& net_;
};

at::Tensor resnet18Whole(const Named& m, const at::Tensor& input) {
  at::Tensor x = at::max_pool2d(
      at::relu(m.bn(at::conv2d(input, m.p("conv1.weight"), {}, 2, 3), "bn1")), 3, 2, 1);
  for (int layer = 1; layer <= 4; ++layer) {
    for (int blk = 0; blk < 2; ++blk) {
      const std::string n = "layer" + std::to_string(layer) + "." + std::to_string(blk);
      const int64_t stride = (layer > 1 && blk == 0) ? 2 : 1;
      at::Tensor identity = x;
      at::Tensor out =
          at::relu(m.bn(at::conv2d(x, m.p(n + ".conv1.weight"), {}, stride, 1), n + ".bn1"));
      out = m.bn(at::conv2d(out, m.p(n + ".conv2.weight"), {}, 1, 1), n + ".bn2");
      if (layer > 1 && blk == 0) {
        identity =
            m.bn(at::conv2d(x, m.p(n + ".downsample.0.weight"), {}, stride), n + ".downsample.1");
      }
      x = at::relu(out + identity);
    }
  }
  return at::linear(at::adaptive_avg_pool2d(x, {1, 1}).flatten(1), m.p("fc.weight"),
                    m.p("fc.bias"));
}

at::Tensor densenetWhole(const Named& m, const at::Tensor& input, const std::vector<int>& blocks) {
  at::Tensor x = at::max_pool2d(
      at::relu(m.bn(at::conv2d(input, m.p("features.conv0.weight"), {}, 2, 3), "features.norm0")),
      3, 2, 1);
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    std::vector<at::Tensor> features = {x};
    for (int li = 0; li < blocks[bi]; ++li) {
      const std::string n =
          "features.denseblock" + std::to_string(bi + 1) + ".denselayer" + std::to_string(li + 1);
      const at::Tensor in = at::cat(features, 1);  // every earlier layer's output
      at::Tensor h = at::conv2d(at::relu(m.bn(in, n + ".norm1")), m.p(n + ".conv1.weight"));
      h = at::conv2d(at::relu(m.bn(h, n + ".norm2")), m.p(n + ".conv2.weight"), {}, 1, 1);
      features.push_back(h);
    }
    x = at::cat(features, 1);
    if (bi + 1 < blocks.size()) {
      const std::string n = "features.transition" + std::to_string(bi + 1);
      x = at::avg_pool2d(at::conv2d(at::relu(m.bn(x, n + ".norm")), m.p(n + ".conv.weight")), 2, 2);
    }
  }
  x = at::adaptive_avg_pool2d(at::relu(m.bn(x, "features.norm5")), {1, 1}).flatten(1);
  return at::linear(x, m.p("classifier.weight"), m.p("classifier.bias"));
}

void expectSameFunction(const std::string& workload, const nlohmann::json& shape,
                        const std::function<at::Tensor(const Named&, const at::Tensor&)>& whole) {
  const auto* w = findChainWorkload(workload);
  ASSERT_NE(w, nullptr);
  const auto chain = w->makeNet(shape, at::kFloat, 11);
  const auto plain = w->makeNet(shape, at::kFloat, 11);
  c10::NoGradGuard noGrad;
  const at::Tensor a = chain->forward(chain->input());
  const at::Tensor b = whole(Named(*plain), plain->input());
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_TRUE(at::equal(a, b)) << workload << ": max diff " << (a - b).abs().max().item<double>();
  ASSERT_EQ(chain->buffers().size(), plain->buffers().size());
  for (size_t i = 0; i < chain->buffers().size(); ++i) {
    EXPECT_TRUE(at::equal(chain->buffers()[i].second, plain->buffers()[i].second))
        << chain->buffers()[i].first;
  }
}

TEST(Linearization, ResNet18CutBetweenBlocksComputesTheWholeNetwork) {
  expectSameFunction("resnet18", {{"batch", 2}, {"image", 64}, {"width", 8}},
                     [](const Named& m, const at::Tensor& x) { return resnet18Whole(m, x); });
}

TEST(Linearization, DenseNet121CutAfterEachLayerComputesTheWholeNetwork) {
  expectSameFunction("densenet121", {{"batch", 2}, {"image", 64}, {"growth", 8}, {"init", 16}},
                     [](const Named& m, const at::Tensor& x) {
                       return densenetWhole(m, x, {6, 12, 24, 16});
                     });
}

TEST(Linearization, TheChainsHaveTheExpectedStages) {
  // ResNet-18: stem, 8 basic blocks, head; DenseNet-121: stem, 58 dense layers, 3
  // transitions, head.
  EXPECT_EQ(findChainWorkload("resnet18")->makeNet({}, at::kFloat, 1)->numStages(), 10);
  EXPECT_EQ(findChainWorkload("densenet121")->makeNet({}, at::kFloat, 1)->numStages(), 63);
}

}  // namespace
}  // namespace sb::reference
