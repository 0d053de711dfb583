// The chain workloads of the checkpointing family, written with ATen functions over tensors
// this file owns, so that batch-norm buffers and dropout's generator are under our control.
//
//   mlp_chain    depth x (Linear, ReLU, dropout)
//   gpt2_stack   pre-LN transformer blocks (causal self-attention and a GELU MLP, dropout on
//                the attention probabilities and both residual branches), then a final LN;
//                the input is the [batch, seq, d_model] embedding
//   resnet18     stem (7x7 conv, BN, ReLU, max-pool), 8 basic blocks, average pool + FC
//   densenet121  stem, dense blocks of 6, 12, 24, 16 bottleneck layers (BN-ReLU-1x1 conv-
//                BN-ReLU-3x3 conv, output concatenated), transitions (BN-ReLU-1x1 conv-2x2
//                average pool), final BN-ReLU, average pool + FC
//
// Each is a chain of stages that pass one tensor (see chain_nets.h); torchvision's layer
// shapes at full size, narrower and on smaller images at CI size.

#include "reference/chain_nets.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <mutex>
#include <set>

namespace sb::reference {

at::Tensor ChainNet::forward(const at::Tensor& x) const {
  at::Tensor h = x;
  for (int i = 0; i < numStages(); ++i) h = stage(i, h, true);
  return h;
}

void ChainNet::zeroGrad() const { zeroGrads(params_); }

void ChainNet::resetBuffers() const {
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].second.copy_(initialBuffers_[i].second);
}

at::Tensor ChainNet::param(const std::string& name, at::Tensor value) {
  value = value.detach().requires_grad_(true);
  params_.emplace_back(name, value);
  return value;
}

at::Tensor ChainNet::buffer(const std::string& name, at::Tensor value) {
  buffers_.emplace_back(name, value);
  initialBuffers_.emplace_back(name, value.clone());
  return value;
}

WorkloadData ChainWorkload::build(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                                  InputMode) const {
  auto net = makeNet(shape, dtype, seed);
  at::manual_seed(dropoutSeed(seed));
  net->zeroGrad();
  // `microbatches` M (mlp_chain, gpt2_stack): gradient accumulation, the reference of the
  // pipeline family. The batch cut into M micro-batches of its rows, each forward and backward in
  // turn, every gradient accumulated in micro-batch order; the loss is the same sum.
  const int64_t M = shape.is_object() ? shape.value("microbatches", int64_t{1}) : 1;
  std::vector<at::Tensor> ys, gxs;
  const auto xs = net->input().chunk(M, 0), ts = net->target().chunk(M, 0);
  for (int64_t m = 0; m < M; ++m) {
    const at::Tensor x = xs[m].detach().requires_grad_(true);
    const at::Tensor y = net->forward(x);
    const at::Tensor loss = (y * ts[m]).sum();
    torch::autograd::backward({loss});
    ys.push_back(y.detach());
    gxs.push_back(x.grad());
  }
  WorkloadData d;
  d.inputs["input"] = net->input();
  d.inputs["target"] = net->target();
  d.expected["output"] = M == 1 ? ys[0] : at::cat(ys, 0);
  d.expected["grad_input"] = M == 1 ? gxs[0].clone() : at::cat(gxs, 0);
  d.checked = {"output", "grad_input"};
  for (const auto& [name, p] : net->parameters()) {
    d.expected["grad/" + name] = p.grad().clone();
    d.checked.push_back("grad/" + name);
  }
  for (const auto& [name, b] : net->buffers()) {
    d.expected["buffer/" + name] = b.clone();
    d.checked.push_back("buffer/" + name);
  }
  // The state the step leaves for the next one: the CPU generator dropout draws from. A
  // strategy that recomputes dropout must leave it where the plain step does
  // (torch.utils.checkpoint restores it too), or the next step's masks differ.
  d.expected["rng/cpu"] = at::detail::getDefaultCPUGenerator().get_state();
  d.checked.push_back("rng/cpu");
  // On a GPU the masks come from its generator: the state it is left in counts the same way.
  if (net->input().is_cuda()) {
    d.expected["rng/cuda"] = deviceGeneratorState(net->input().device());
    d.checked.push_back("rng/cuda");
  }
  return d;
}

PhiloxState devicePhiloxState(const at::Device& device) {
#if SB_TORCH_VERSION_NUM >= 201
  at::Generator g = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  return {g.current_seed(), g.get_offset()};
#else
  TORCH_CHECK(false, "the state of the ", device, " generator needs LibTorch 2.1 or later");
#endif
}

void setDevicePhiloxState(const at::Device& device, const PhiloxState& state) {
#if SB_TORCH_VERSION_NUM >= 201
  at::Generator g = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(state.seed);  // CUDA's resets the offset to 0: set it second
  g.set_offset(state.offset);
#else
  TORCH_CHECK(false, "the state of the ", device, " generator needs LibTorch 2.1 or later");
#endif
}

at::Tensor deviceGeneratorState(const at::Device& device) {
  const PhiloxState s = devicePhiloxState(device);
  const int64_t state[] = {static_cast<int64_t>(s.seed), static_cast<int64_t>(s.offset)};
  return at::tensor(at::ArrayRef<int64_t>(state), at::kLong);
}

namespace {

// Shape keys with defaults; unknown keys and bad values are errors naming the key.
class Keys {
 public:
  Keys(std::string workload, const nlohmann::json& shape, std::set<std::string> known)
      : w_(std::move(workload)), shape_(shape) {
    TORCH_CHECK(shape.is_object() || shape.is_null(), w_, ": shape must be a mapping");
    if (shape.is_object()) {
      for (auto it = shape.begin(); it != shape.end(); ++it) {
        if (!known.count(it.key())) {
          std::string k;
          for (const auto& s : known) k += (k.empty() ? "" : ", ") + s;
          TORCH_CHECK(false, w_, ": unknown shape key '", it.key(), "' (expected ", k, ")");
        }
      }
    }
  }
  int64_t pos(const std::string& key, int64_t def) const {
    if (!shape_.is_object() || !shape_.contains(key)) return def;
    const auto& v = shape_.at(key);
    TORCH_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, w_, ": shape key '", key,
                "' must be a positive integer, got ", v.dump());
    // A chain is built a layer at a time: its length bounded as the graph workloads' is
    // (depth 10^8 passed the element bound and grew gigabytes before a row ran).
    TORCH_CHECK(!(key == "depth" || key == "layers") || v.get<int64_t>() <= 1024, w_,
                ": shape key '", key, "' must be at most 1024, got ", v.dump());
    return v.get<int64_t>();
  }
  double prob(const std::string& key, double def) const {
    if (!shape_.is_object() || !shape_.contains(key)) return def;
    const auto& v = shape_.at(key);
    TORCH_CHECK(v.is_number() && v.get<double>() >= 0 && v.get<double>() < 1, w_, ": shape key '",
                key, "' must be a probability in [0, 1), got ", v.dump());
    return v.get<double>();
  }
  std::vector<int64_t> list(const std::string& key, std::vector<int64_t> def) const {
    if (!shape_.is_object() || !shape_.contains(key)) return def;
    const auto& v = shape_.at(key);
    TORCH_CHECK(v.is_array() && !v.empty(), w_, ": shape key '", key,
                "' must be a list of positive integers, got ", v.dump());
    std::vector<int64_t> out;
    for (const auto& e : v) {
      TORCH_CHECK(e.is_number_integer() && e.get<int64_t>() > 0, w_, ": shape key '", key,
                  "' must hold positive integers, got ", v.dump());
      out.push_back(e.get<int64_t>());
    }
    return out;
  }

 private:
  std::string w_;
  const nlohmann::json& shape_;
};

// `microbatches`: how many micro-batches the reference accumulates (ChainWorkload::build); the
// batch's rows must cut into them evenly.
int64_t microbatches(const Keys& k, int64_t batch) {
  const int64_t m = k.pos("microbatches", 1);
  TORCH_CHECK(batch % m == 0, "shape key 'microbatches' (", m, ") must divide 'batch' (", batch,
              ")");
  return m;
}
std::string microbatchString(const Keys& k) {
  const int64_t m = k.pos("microbatches", 1);
  return m == 1 ? "" : ";microbatches=" + std::to_string(m);
}

// Deterministic parameters: He-normal weights, one generator stream per tensor.
class Init {
 public:
  Init(ChainNet& net, at::ScalarType dtype, uint64_t seed)
      : net_(net), dtype_(dtype), seed_(seed) {}
  at::Tensor weight(const std::string& name, at::IntArrayRef shape, int64_t fanIn) {
    return net_.param(name,
                      scaledAsCase(makeNormal(shape, dtype_, seed_, stream_++, InputMode::kRandom),
                                   std::sqrt(2.0 / static_cast<double>(fanIn))));
  }
  at::Tensor bias(const std::string& name, int64_t n) {
    return net_.param(
        name, scaledAsCase(makeNormal({n}, dtype_, seed_, stream_++, InputMode::kRandom), 0.02));
  }
  at::Tensor ones(const std::string& name, int64_t n) {
    return net_.param(name, at::ones({n}, caseOptions(dtype_)));
  }
  at::Tensor zeros(const std::string& name, int64_t n) {
    return net_.param(name, at::zeros({n}, caseOptions(dtype_)));
  }
  void data(at::IntArrayRef in, at::IntArrayRef out) {
    net_.setData(makeNormal(in, dtype_, seed_, 1000, InputMode::kRandom),
                 makeNormal(out, dtype_, seed_, 1001, InputMode::kRandom));
  }

  // Batch norm: weight, bias, running mean and variance; training mode, updating the running
  // statistics only when asked.
  std::function<at::Tensor(const at::Tensor&, bool)> batchNorm(const std::string& name, int64_t c) {
    at::Tensor w = ones(name + ".weight", c), b = zeros(name + ".bias", c);
    at::Tensor rm = net_.buffer(name + ".running_mean", at::zeros({c}, caseOptions(dtype_)));
    at::Tensor rv = net_.buffer(name + ".running_var", at::ones({c}, caseOptions(dtype_)));
    return [w, b, rm, rv](const at::Tensor& x, bool update) {
      return at::batch_norm(x, w, b, update ? rm : at::Tensor(), update ? rv : at::Tensor(),
                            /*training=*/true, /*momentum=*/0.1, /*eps=*/1e-5,
                            /*cudnn_enabled=*/false);
    };
  }

 private:
  ChainNet& net_;
  at::ScalarType dtype_;
  uint64_t seed_;
  int stream_ = 0;
};

// ---- mlp_chain ------------------------------------------------------------------------------

class MlpChain final : public ChainWorkload {
 public:
  std::string name() const override { return "mlp_chain"; }
  std::string description() const override {
    return "depth x (Linear(width, width), ReLU, dropout) on [batch, width]";
  }
  Keys keys(const nlohmann::json& s) const {
    return Keys(name(), s, {"batch", "width", "depth", "dropout", "microbatches"});
  }
  // The keys and the sizes they make, without building the net (a suite is validated before
  // anything runs: a width of a million would allocate terabytes here).
  void validate(const nlohmann::json& s) const override {
    const auto k = keys(s);
    const int64_t batch = k.pos("batch", 16), width = k.pos("width", 64), depth = k.pos("depth", 8);
    k.prob("dropout", 0.1);
    microbatches(k, batch);
    // Each layer's weight, and the activations of the whole chain: at most 2^40 elements.
    constexpr int64_t kMax = int64_t{1} << 40;
    const auto fits = [&](int64_t a, int64_t b) { return a <= kMax / b; };
    TORCH_CHECK(fits(width, width) && fits(width * width, depth) && fits(batch, width) &&
                    fits(batch * width, depth),
                "mlp_chain: shape keys batch ", batch, ", width ", width, ", depth ", depth,
                " make more than 2^40 elements (each layer width x width, activations batch x "
                "width x depth)");
  }
  std::string shapeString(const nlohmann::json& s) const override {
    const auto k = keys(s);
    return "batch=" + std::to_string(k.pos("batch", 16)) +
           ";width=" + std::to_string(k.pos("width", 64)) +
           ";depth=" + std::to_string(k.pos("depth", 8)) +
           ";dropout=" + std::to_string(k.prob("dropout", 0.1)).substr(0, 4) + microbatchString(k);
  }
  std::unique_ptr<ChainNet> makeNet(const nlohmann::json& s, at::ScalarType dtype,
                                    uint64_t seed) const override {
    const auto k = keys(s);
    const int64_t batch = k.pos("batch", 16), width = k.pos("width", 64), depth = k.pos("depth", 8);
    const double p = k.prob("dropout", 0.1);
    auto net = std::make_unique<ChainNet>();
    Init init(*net, dtype, seed);
    for (int64_t i = 0; i < depth; ++i) {
      const std::string n = "layer" + std::to_string(i);
      at::Tensor w = init.weight(n + ".weight", {width, width}, width);
      at::Tensor b = init.bias(n + ".bias", width);
      net->addStage(n, [w, b, p](const at::Tensor& x, bool) {
        return at::dropout(at::relu(at::linear(x, w, b)), p, /*train=*/true);
      });
    }
    init.data({batch, width}, {batch, width});
    return net;
  }
};

// ---- gpt2_stack -----------------------------------------------------------------------------

class Gpt2Stack final : public ChainWorkload {
 public:
  std::string name() const override { return "gpt2_stack"; }
  std::string description() const override {
    return "pre-LN GPT-2 blocks (causal attention, GELU MLP, dropout) on [batch, seq, d_model]";
  }
  Keys keys(const nlohmann::json& s) const {
    return Keys(name(), s,
                {"batch", "seq", "d_model", "heads", "layers", "dropout", "microbatches"});
  }
  void validate(const nlohmann::json& s) const override {
    const auto k = keys(s);
    TORCH_CHECK(k.pos("d_model", 64) % k.pos("heads", 4) == 0,
                "gpt2_stack: shape key 'd_model' must be a multiple of 'heads'");
    microbatches(k, k.pos("batch", 2));
  }
  std::string shapeString(const nlohmann::json& s) const override {
    const auto k = keys(s);
    return "batch=" + std::to_string(k.pos("batch", 2)) +
           ";seq=" + std::to_string(k.pos("seq", 64)) +
           ";d_model=" + std::to_string(k.pos("d_model", 64)) +
           ";heads=" + std::to_string(k.pos("heads", 4)) +
           ";layers=" + std::to_string(k.pos("layers", 4)) + microbatchString(k);
  }
  std::unique_ptr<ChainNet> makeNet(const nlohmann::json& s, at::ScalarType dtype,
                                    uint64_t seed) const override {
    validate(s);
    const auto k = keys(s);
    const int64_t B = k.pos("batch", 2), T = k.pos("seq", 64), D = k.pos("d_model", 64),
                  H = k.pos("heads", 4), layers = k.pos("layers", 4);
    const double p = k.prob("dropout", 0.1);
    auto net = std::make_unique<ChainNet>();
    Init init(*net, dtype, seed);
    const at::Tensor causal = at::ones({T, T}, caseOptions(at::kBool)).triu(1);
    for (int64_t l = 0; l < layers; ++l) {
      const std::string n = "h" + std::to_string(l);
      at::Tensor ln1w = init.ones(n + ".ln_1.weight", D), ln1b = init.zeros(n + ".ln_1.bias", D);
      at::Tensor wqkv = init.weight(n + ".attn.c_attn.weight", {3 * D, D}, D);
      at::Tensor bqkv = init.bias(n + ".attn.c_attn.bias", 3 * D);
      at::Tensor wo = init.weight(n + ".attn.c_proj.weight", {D, D}, D);
      at::Tensor bo = init.bias(n + ".attn.c_proj.bias", D);
      at::Tensor ln2w = init.ones(n + ".ln_2.weight", D), ln2b = init.zeros(n + ".ln_2.bias", D);
      at::Tensor w1 = init.weight(n + ".mlp.c_fc.weight", {4 * D, D}, D);
      at::Tensor b1 = init.bias(n + ".mlp.c_fc.bias", 4 * D);
      at::Tensor w2 = init.weight(n + ".mlp.c_proj.weight", {D, 4 * D}, 4 * D);
      at::Tensor b2 = init.bias(n + ".mlp.c_proj.bias", D);
      net->addStage(n, [=](const at::Tensor& x, bool) {
        const int64_t hd = D / H;
        at::Tensor h = at::layer_norm(x, {D}, ln1w, ln1b, 1e-5);
        auto qkv = at::linear(h, wqkv, bqkv).chunk(3, -1);
        const int64_t b = x.size(0);  // B, or a micro-batch's rows
        const auto heads = [&](const at::Tensor& t) {
          return t.view({b, T, H, hd}).transpose(1, 2);
        };
        at::Tensor att = at::matmul(heads(qkv[0]), heads(qkv[1]).transpose(-2, -1)) /
                         std::sqrt(static_cast<double>(hd));
        att = at::dropout(at::softmax(att.masked_fill(causal, -INFINITY), -1), p, true);
        at::Tensor y = at::matmul(att, heads(qkv[2])).transpose(1, 2).reshape({b, T, D});
        at::Tensor r = x + at::dropout(at::linear(y, wo, bo), p, true);
        at::Tensor m = at::linear(
            at::gelu(at::linear(at::layer_norm(r, {D}, ln2w, ln2b, 1e-5), w1, b1), "tanh"), w2, b2);
        return r + at::dropout(m, p, true);
      });
    }
    at::Tensor lnfw = init.ones("ln_f.weight", D), lnfb = init.zeros("ln_f.bias", D);
    net->addStage("ln_f", [=](const at::Tensor& x, bool) {
      return at::layer_norm(x, {D}, lnfw, lnfb, 1e-5);
    });
    init.data({B, T, D}, {B, T, D});
    return net;
  }
};

// ---- resnet18 -------------------------------------------------------------------------------

class ResNet18 final : public ChainWorkload {
 public:
  std::string name() const override { return "resnet18"; }
  std::string description() const override {
    return "ResNet-18 (torchvision's layers; width 64 and image 224 at full size)";
  }
  Keys keys(const nlohmann::json& s) const {
    return Keys(name(), s, {"batch", "image", "width", "classes"});
  }
  void validate(const nlohmann::json& s) const override { keys(s).pos("batch", 2); }
  std::string shapeString(const nlohmann::json& s) const override {
    const auto k = keys(s);
    return "batch=" + std::to_string(k.pos("batch", 2)) +
           ";image=" + std::to_string(k.pos("image", 32)) +
           ";width=" + std::to_string(k.pos("width", 16)) +
           ";classes=" + std::to_string(k.pos("classes", 10));
  }
  std::unique_ptr<ChainNet> makeNet(const nlohmann::json& s, at::ScalarType dtype,
                                    uint64_t seed) const override {
    const auto k = keys(s);
    const int64_t B = k.pos("batch", 2), img = k.pos("image", 32), w = k.pos("width", 16),
                  classes = k.pos("classes", 10);
    auto net = std::make_unique<ChainNet>();
    Init init(*net, dtype, seed);
    at::Tensor c1 = init.weight("conv1.weight", {w, 3, 7, 7}, 3 * 49);
    auto bn1 = init.batchNorm("bn1", w);
    net->addStage("stem", [=](const at::Tensor& x, bool u) {
      return at::max_pool2d(at::relu(bn1(at::conv2d(x, c1, {}, 2, 3), u)), 3, 2, 1);
    });
    int64_t in = w;
    for (int layer = 1; layer <= 4; ++layer) {
      const int64_t out = w << (layer - 1);
      for (int blk = 0; blk < 2; ++blk) {
        const std::string n = "layer" + std::to_string(layer) + "." + std::to_string(blk);
        const int64_t stride = (layer > 1 && blk == 0) ? 2 : 1;
        at::Tensor ca = init.weight(n + ".conv1.weight", {out, in, 3, 3}, in * 9);
        auto ba = init.batchNorm(n + ".bn1", out);
        at::Tensor cb = init.weight(n + ".conv2.weight", {out, out, 3, 3}, out * 9);
        auto bb = init.batchNorm(n + ".bn2", out);
        at::Tensor cd;
        std::function<at::Tensor(const at::Tensor&, bool)> bd;
        if (stride != 1 || in != out) {
          cd = init.weight(n + ".downsample.0.weight", {out, in, 1, 1}, in);
          bd = init.batchNorm(n + ".downsample.1", out);
        }
        net->addStage(n, [=](const at::Tensor& x, bool u) {
          at::Tensor h = at::relu(ba(at::conv2d(x, ca, {}, stride, 1), u));
          h = bb(at::conv2d(h, cb, {}, 1, 1), u);
          const at::Tensor skip = cd.defined() ? bd(at::conv2d(x, cd, {}, stride), u) : x;
          return at::relu(h + skip);
        });
        in = out;
      }
    }
    at::Tensor fw = init.weight("fc.weight", {classes, in}, in);
    at::Tensor fb = init.bias("fc.bias", classes);
    net->addStage("head", [=](const at::Tensor& x, bool) {
      return at::linear(at::adaptive_avg_pool2d(x, {1, 1}).flatten(1), fw, fb);
    });
    init.data({B, 3, img, img}, {B, classes});
    return net;
  }
};

// ---- densenet121 ----------------------------------------------------------------------------

class DenseNet121 final : public ChainWorkload {
 public:
  std::string name() const override { return "densenet121"; }
  std::string description() const override {
    return "DenseNet-121 (blocks 6-12-24-16; growth 32, 64 initial features at full size)";
  }
  Keys keys(const nlohmann::json& s) const {
    return Keys(name(), s, {"batch", "image", "growth", "init", "blocks", "bn_size", "classes"});
  }
  void validate(const nlohmann::json& s) const override { keys(s).list("blocks", {6, 12, 24, 16}); }
  std::string shapeString(const nlohmann::json& s) const override {
    const auto k = keys(s);
    std::string blocks;
    for (auto b : k.list("blocks", {6, 12, 24, 16}))
      blocks += (blocks.empty() ? "" : "-") + std::to_string(b);
    return "batch=" + std::to_string(k.pos("batch", 2)) +
           ";image=" + std::to_string(k.pos("image", 32)) +
           ";growth=" + std::to_string(k.pos("growth", 8)) +
           ";init=" + std::to_string(k.pos("init", 16)) + ";blocks=" + blocks;
  }
  std::unique_ptr<ChainNet> makeNet(const nlohmann::json& s, at::ScalarType dtype,
                                    uint64_t seed) const override {
    const auto k = keys(s);
    const int64_t B = k.pos("batch", 2), img = k.pos("image", 32), g = k.pos("growth", 8),
                  c0 = k.pos("init", 16), bns = k.pos("bn_size", 4), classes = k.pos("classes", 10);
    const auto blocks = k.list("blocks", {6, 12, 24, 16});
    auto net = std::make_unique<ChainNet>();
    Init init(*net, dtype, seed);
    at::Tensor c1 = init.weight("features.conv0.weight", {c0, 3, 7, 7}, 3 * 49);
    auto bn0 = init.batchNorm("features.norm0", c0);
    net->addStage("stem", [=](const at::Tensor& x, bool u) {
      return at::max_pool2d(at::relu(bn0(at::conv2d(x, c1, {}, 2, 3), u)), 3, 2, 1);
    });
    int64_t c = c0;
    for (size_t bi = 0; bi < blocks.size(); ++bi) {
      for (int64_t li = 0; li < blocks[bi]; ++li) {
        const std::string n =
            "features.denseblock" + std::to_string(bi + 1) + ".denselayer" + std::to_string(li + 1);
        auto na = init.batchNorm(n + ".norm1", c);
        at::Tensor ca = init.weight(n + ".conv1.weight", {bns * g, c, 1, 1}, c);
        auto nb = init.batchNorm(n + ".norm2", bns * g);
        at::Tensor cb = init.weight(n + ".conv2.weight", {g, bns * g, 3, 3}, bns * g * 9);
        net->addStage(n, [=](const at::Tensor& x, bool u) {
          at::Tensor h = at::conv2d(at::relu(na(x, u)), ca);
          h = at::conv2d(at::relu(nb(h, u)), cb, {}, 1, 1);
          return at::cat({x, h}, 1);
        });
        c += g;
      }
      if (bi + 1 < blocks.size()) {
        const std::string n = "features.transition" + std::to_string(bi + 1);
        auto nt = init.batchNorm(n + ".norm", c);
        at::Tensor ct = init.weight(n + ".conv.weight", {c / 2, c, 1, 1}, c);
        net->addStage(n, [=](const at::Tensor& x, bool u) {
          return at::avg_pool2d(at::conv2d(at::relu(nt(x, u)), ct), 2, 2);
        });
        c /= 2;
      }
    }
    auto n5 = init.batchNorm("features.norm5", c);
    at::Tensor fw = init.weight("classifier.weight", {classes, c}, c);
    at::Tensor fb = init.bias("classifier.bias", classes);
    net->addStage("head", [=](const at::Tensor& x, bool u) {
      return at::linear(at::adaptive_avg_pool2d(at::relu(n5(x, u)), {1, 1}).flatten(1), fw, fb);
    });
    init.data({B, 3, img, img}, {B, classes});
    return net;
  }
};

}  // namespace

const ChainWorkload* findChainWorkload(const std::string& name) {
  static const MlpChain mlp;
  static const Gpt2Stack gpt2;
  static const ResNet18 resnet;
  static const DenseNet121 densenet;
  for (const ChainWorkload* w :
       std::initializer_list<const ChainWorkload*>{&mlp, &gpt2, &resnet, &densenet}) {
    if (w->name() == name) return w;
  }
  return nullptr;
}

std::vector<const Workload*> chainWorkloads() {
  std::vector<const Workload*> out;
  for (const char* n : {"mlp_chain", "gpt2_stack", "resnet18", "densenet121"}) {
    out.push_back(findChainWorkload(n));
  }
  return out;
}

}  // namespace sb::reference
