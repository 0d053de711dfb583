// Training over several optimizer steps (training.h).

#include "reference/training.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "reference/autograd_engine.h"
#include "reference/block.h"
#include "reference/chain_nets.h"
#include "reference/evoformer.h"
#include "reference/graph.h"
#include "reference/moe.h"
#include "reference/torchscript/import.h"
#include "reference/transformer.h"

namespace sb::reference {
namespace {

double number(const nlohmann::json& j, const std::string& where, const std::string& key, double lo,
              double hi) {
  const auto& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo ||
      v.get<double>() > hi) {
    std::ostringstream os;
    os << where << ": optimizer key '" << key << "' must be a number in [" << lo << ", " << hi
       << "], got " << v.dump();
    throw std::invalid_argument(os.str());
  }
  return v.get<double>();
}

// LibTorch keys an optimizer's state by the parameter's TensorImpl: as its address printed to a
// string in 1.13, as the address itself in 2.x.
using StateKey = std::decay_t<decltype(std::declval<const torch::optim::Optimizer&>().state())>::key_type;

template <typename Key>
Key keyAs(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;  // what 1.13's c10::guts::to_string does
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

StateKey key(const at::Tensor& p) { return keyAs<StateKey>(p); }

}  // namespace

OptimizerSpec OptimizerSpec::fromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) {
    throw std::invalid_argument(where +
                                ": key 'optimizer' must be a mapping, e.g. {kind: adamw, "
                                "lr: 0.001}, got " +
                                j.dump());
  }
  OptimizerSpec s;
  if (!j.contains("kind") || !j.at("kind").is_string()) {
    throw std::invalid_argument(where + ": optimizer key 'kind' must be sgd or adamw");
  }
  s.kind = j.at("kind").get<std::string>();
  if (s.kind != "sgd" && s.kind != "adamw") {
    throw std::invalid_argument(where + ": optimizer kind '" + s.kind +
                                "' (expected sgd or adamw)");
  }
  if (s.kind == "adamw") s.weightDecay = 0.01;  // torch.optim.AdamW's default
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "kind") continue;
    if (k == "lr") {
      s.lr = number(j, where, k, 0, 10);
    } else if (k == "momentum" && s.kind == "sgd") {
      s.momentum = number(j, where, k, 0, 1);
    } else if (k == "betas" && s.kind == "adamw") {
      const auto& b = it.value();
      if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number() ||
          b[0].get<double>() < 0 || b[0].get<double>() >= 1 || b[1].get<double>() < 0 ||
          b[1].get<double>() >= 1) {
        throw std::invalid_argument(where +
                                    ": optimizer key 'betas' must be two numbers in "
                                    "[0, 1), got " +
                                    b.dump());
      }
      s.beta1 = b[0].get<double>();
      s.beta2 = b[1].get<double>();
    } else if (k == "eps" && s.kind == "adamw") {
      s.eps = number(j, where, k, 0, 1);
    } else if (k == "weight_decay") {
      s.weightDecay = number(j, where, k, 0, 1);
    } else if (k == "clip_grad_norm") {
      s.clipGradNorm = number(j, where, k, 0, 1e30);
      // torch.nn.utils.clip_grad_norm_(max_norm=0) zeroes every gradient; here 0 meant "no
      // clipping". Neither reading is safe to guess: leave the key out for no clipping.
      if (s.clipGradNorm == 0) {
        throw std::invalid_argument(where +
                                    ": optimizer key 'clip_grad_norm' is 0, which torch reads "
                                    "as 'zero every gradient'; give a positive max norm, or "
                                    "leave the key out for no clipping");
      }
    } else if (k == "schedule") {
      const auto& sc = it.value();
      const std::string at = where + ": optimizer key 'schedule'";
      if (!sc.is_object()) {
        throw std::invalid_argument(
            at + " must be a mapping, e.g. {warmup_steps: 2, decay: cosine, min_lr: 0}, got " +
            sc.dump());
      }
      for (auto e = sc.begin(); e != sc.end(); ++e) {
        if (e.key() == "warmup_steps") {
          const double w = number(sc, at, e.key(), 0, 1e6);
          if (w != std::floor(w)) {
            throw std::invalid_argument(at + ": key 'warmup_steps' must be a whole number, got " +
                                        e.value().dump());
          }
          s.warmupSteps = static_cast<int>(w);
        } else if (e.key() == "decay") {
          if (!e.value().is_string() ||
              (e.value() != "none" && e.value() != "linear" && e.value() != "cosine")) {
            throw std::invalid_argument(at + ": key 'decay' must be none, linear or cosine, got " +
                                        e.value().dump());
          }
          s.decay = e.value().get<std::string>();
        } else if (e.key() == "min_lr") {
          s.minLr = number(sc, at, e.key(), 0, 10);
        } else {
          throw std::invalid_argument(at + ": unknown key '" + e.key() +
                                      "' (expected warmup_steps, decay, min_lr)");
        }
      }
      if (s.minLr > s.lr) {
        throw std::invalid_argument(at + ": min_lr " + std::to_string(s.minLr) + " is above lr " +
                                    std::to_string(s.lr));
      }
    } else {
      throw std::invalid_argument(
          where + ": unknown optimizer key '" + k + "' for " + s.kind + " (expected " +
          (s.kind == "sgd" ? "lr, momentum, weight_decay, clip_grad_norm, schedule"
                           : "lr, betas, eps, weight_decay, clip_grad_norm, schedule") +
          ")");
    }
  }
  return s;
}

nlohmann::json OptimizerSpec::toJson() const {
  nlohmann::json j = {{"kind", kind}, {"lr", lr}, {"weight_decay", weightDecay}};
  if (kind == "sgd") j["momentum"] = momentum;
  if (kind == "adamw") {
    j["betas"] = {beta1, beta2};
    j["eps"] = eps;
  }
  if (clipGradNorm > 0) j["clip_grad_norm"] = clipGradNorm;
  if (scheduled()) {
    j["schedule"] = {{"warmup_steps", warmupSteps}, {"decay", decay}, {"min_lr", minLr}};
  }
  return j;
}

double OptimizerSpec::lrAt(int k, int steps) const {
  if (k < warmupSteps) return lr * (k + 1) / (warmupSteps + 1);
  if (decay == "none") return lr;
  const double p = static_cast<double>(k - warmupSteps) / std::max(1, steps - warmupSteps);
  const double f = decay == "linear" ? 1 - p : 0.5 * (1 + std::cos(M_PI * p));
  return minLr + (lr - minLr) * f;
}

std::string OptimizerSpec::toString() const {
  std::ostringstream os;
  os << kind << " lr=" << lr;
  if (kind == "sgd") os << " momentum=" << momentum;
  if (kind == "adamw") os << " betas=" << beta1 << "," << beta2 << " eps=" << eps;
  os << " wd=" << weightDecay;
  if (clipGradNorm > 0) os << " clip=" << clipGradNorm;
  if (scheduled()) os << " warmup=" << warmupSteps << " decay=" << decay << " min_lr=" << minLr;
  return os.str();
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const OptimizerSpec& spec,
                                                       const std::vector<at::Tensor>& params) {
  if (spec.kind == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params,
        torch::optim::SGDOptions(spec.lr).momentum(spec.momentum).weight_decay(spec.weightDecay));
  }
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(spec.lr)
                                                           .betas({spec.beta1, spec.beta2})
                                                           .eps(spec.eps)
                                                           .weight_decay(spec.weightDecay));
}

std::vector<std::string> optimizerStateKeys(const OptimizerSpec& spec) {
  if (spec.kind == "adamw") return {"exp_avg", "exp_avg_sq"};
  if (spec.momentum > 0) return {"momentum_buffer"};
  return {};
}

std::vector<std::pair<std::string, at::Tensor>> optimizerState(const torch::optim::Optimizer& opt,
                                                               const at::Tensor& param) {
  const auto it = opt.state().find(key(param));
  if (it == opt.state().end()) return {};
  if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(it->second.get())) {
    return {{"momentum_buffer", s->momentum_buffer()}};
  }
  if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get())) {
    return {{"exp_avg", s->exp_avg()}, {"exp_avg_sq", s->exp_avg_sq()}};
  }
  return {};
}

double optimizerStep(const torch::optim::Optimizer& opt, const at::Tensor& param) {
  const auto it = opt.state().find(key(param));
  if (it == opt.state().end()) return 0;
  if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get())) {
    return static_cast<double>(s->step());
  }
  return 0;
}

double gradientSquares(const std::vector<at::Tensor>& params) {
  double sq = 0;
  for (const auto& p : params) {
    if (p.defined() && p.grad().defined())
      sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  return sq;
}

void clipGradients(const std::vector<at::Tensor>& params, double norm, double maxNorm) {
  if (maxNorm <= 0) return;
  const double coef = std::min(1.0, maxNorm / (norm + 1e-6));
  if (coef >= 1) return;
  for (const auto& p : params) {
    if (p.defined() && p.grad().defined()) p.mutable_grad().mul_(coef);
  }
}

TrainingLoop::TrainingLoop(const TrainingSpec& spec,
                           std::vector<std::pair<std::string, at::Tensor>> params)
    : spec_(spec), named_(std::move(params)) {
  for (const auto& [name, p] : named_) params_.push_back(p);
  opt_ = makeOptimizer(spec_.optimizer, params_);
}

TrainingLoop::~TrainingLoop() = default;

void TrainingLoop::shareNorm(std::vector<bool> counted, std::function<double(double)> reduce) {
  counted_ = std::move(counted);
  reduce_ = std::move(reduce);
}

void TrainingLoop::update(double loss) {
  losses_.push_back(loss);
  double squares = 0;
  if (reduce_) {
    std::vector<at::Tensor> mine;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (counted_.at(i)) mine.push_back(params_[i]);
    }
    squares = reduce_(gradientSquares(mine));
  } else {
    squares = gradientSquares(params_);
  }
  const double norm = std::sqrt(squares);
  norms_.push_back(norm);
  clipGradients(params_, norm, spec_.optimizer.clipGradNorm);
  if (spec_.optimizer.scheduled()) {
    const double lr = spec_.optimizer.lrAt(static_cast<int>(losses_.size()) - 1, spec_.steps);
    for (auto& group : opt_->param_groups()) group.options().set_lr(lr);
  }
  opt_->step();
}

void TrainingLoop::write(std::map<std::string, at::Tensor>& out,
                         std::vector<std::string>* checked) const {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  auto put = [&](const std::string& name, at::Tensor t) {
    out[name] = std::move(t);
    if (checked) checked->push_back(name);
  };
  put("loss", at::tensor(losses_, f64));
  put("grad_norm", at::tensor(norms_, f64));
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = named_[i].first;
    put("param/" + name, params_[i].detach().clone());
    for (const auto& [k, t] : optimizerState(*opt_, params_[i])) {
      put("state/" + name + "/" + k, t.clone());
    }
  }
  if (spec_.optimizer.kind == "adamw" && !params_.empty()) {
    put("state/step", at::tensor({optimizerStep(*opt_, params_.front())}, f64));
  }
}

int64_t TrainingLoop::stateBytes() const {
  int64_t n = 0;
  for (const auto& p : params_) {
    for (const auto& [k, t] : optimizerState(*opt_, p)) n += static_cast<int64_t>(t.nbytes());
  }
  return n;
}

bool hasTrainingReference(const std::string& workload) {
  return workload == "mlp" || workload == "gpt2" || workload == "bert" || workload == "llama" ||
         workload == "linear" || workload == "transformer_block" || workload == "gpt2_prefill" ||
         workload == "vit_encoder" || workload == "evoformer_pair" || workload == "torchscript" ||
         workload == "moe" || findChainWorkload(workload) != nullptr;
}

std::string trainingWorkloadList() {
  std::string s =
      "linear, mlp, gpt2, bert, llama, transformer_block, gpt2_prefill, vit_encoder, "
      "evoformer_pair, torchscript, moe";
  for (const Workload* w : chainWorkloads()) s += ", " + w->name();
  return s;
}

namespace {

WorkloadData buildChainTraining(const ChainWorkload& w, const nlohmann::json& shape,
                                at::ScalarType dtype, uint64_t seed, const TrainingSpec& training) {
  const auto net = w.makeNet(shape, dtype, seed);
  WorkloadData d;
  d.inputs["input"] = net->input();
  d.inputs["target"] = net->target();
  at::manual_seed(ChainWorkload::dropoutSeed(seed));
  TrainingLoop loop(training, net->parameters());
  // `microbatches` M: each step accumulates the batch's M micro-batches in order (the pipeline
  // family's reference), its loss their losses' sum in float64.
  const int64_t M = shape.is_object() ? shape.value("microbatches", int64_t{1}) : 1;
  const auto xs = net->input().chunk(M, 0), ts = net->target().chunk(M, 0);
  for (int k = 0; k < training.steps; ++k) {
    net->zeroGrad();
    double loss = 0;
    for (int64_t m = 0; m < M; ++m) {
      const at::Tensor y = net->forward(M == 1 ? net->input() : xs[m]);
      const at::Tensor l = (y * (M == 1 ? net->target() : ts[m])).sum();
      backward({l});
      loss += l.item<double>();
    }
    loop.update(loss);
  }
  loop.write(d.expected, &d.checked);
  for (const auto& [name, b] : net->buffers()) {
    d.expected["buffer/" + name] = b.clone();
    d.checked.push_back("buffer/" + name);
  }
  d.expected["rng/cpu"] = at::detail::getDefaultCPUGenerator().get_state();
  d.checked.push_back("rng/cpu");
  if (net->input().is_cuda()) {
    d.expected["rng/cuda"] = deviceGeneratorState(net->input().device());
    d.checked.push_back("rng/cuda");
  }
  return d;
}

// The loop every reference of a model with a fixed target shares: `steps` times, the gradients
// let go (or zeroed in place, as an executor that keeps them does: `zero`), the loss
// sum(forward() * target), its backward, the loop's update; then the expected tensors.
void trainReference(const TrainingSpec& training,
                    std::vector<std::pair<std::string, at::Tensor>> params,
                    const std::function<at::Tensor()>& forward, const at::Tensor& target,
                    const std::function<void()>& zero, WorkloadData& d) {
  TrainingLoop loop(training, params);
  for (int k = 0; k < training.steps; ++k) {
    if (zero) {
      zero();
    } else {
      for (auto& [name, p] : params) p.mutable_grad() = at::Tensor();
    }
    double loss = 0;
    {
      const at::Tensor l = (forward() * target).sum();
      backward({l});
      loss = l.item<double>();
    }
    loop.update(loss);
  }
  loop.write(d.expected, &d.checked);
}

// Megatron's block: the one-step workload's input and parameters, its grad_output as the
// target; the same dropout masks every step (they hash the element's index and the seed).
WorkloadData buildBlockTraining(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                                InputMode mode, const TrainingSpec& training) {
  const BlockShape s = BlockShape::parse(shape);
  WorkloadData one = blockWorkload()->build(shape, dtype, seed, mode);
  WorkloadData d;
  d.inputs = std::move(one.inputs);
  d.inputs["target"] = d.inputs.at("grad_output");
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::map<std::string, at::Tensor> leaves;
  for (const auto& [name, dims] : blockParameters(s)) {
    at::Tensor p = d.inputs.at(name).clone().requires_grad_(true);
    params.emplace_back(name, p);
    leaves[name] = p;
  }
  trainReference(
      training, params, [&] { return blockForward(s, leaves, d.inputs.at("input"), seed); },
      d.inputs.at("target"), nullptr, d);
  return d;
}

// torch.nn.Linear trained: y = x W^T + b, the loss sum(y * grad_output), the weight and bias
// stepped.
WorkloadData buildLinearTraining(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                                 InputMode mode, const TrainingSpec& training) {
  const LinearShape s = LinearShape::parse(shape);
  WorkloadData one = findWorkload("linear")->build(shape, dtype, seed, mode);
  WorkloadData d;
  d.inputs = std::move(one.inputs);
  d.inputs["target"] = d.inputs.at("grad_output");
  at::Tensor w = d.inputs.at("weight").clone().requires_grad_(true);
  at::Tensor b;
  std::vector<std::pair<std::string, at::Tensor>> params = {{"weight", w}};
  if (s.bias) {
    b = d.inputs.at("bias").clone().requires_grad_(true);
    params.emplace_back("bias", b);
  }
  trainReference(
      training, params, [&] { return at::linear(d.inputs.at("input"), w, b); },
      d.inputs.at("target"), nullptr, d);
  return d;
}

// The chunking family's models (the transformer stacks gpt2_prefill and vit_encoder, the
// Evoformer's pair stack), in mode: training: built from the seed as the executors build them,
// the loss sum(output * target) from their input, gradients zeroed in place each step.
template <class Model, class Shape>
WorkloadData buildModelTraining(const std::string& workload, const Shape& shape,
                                at::ScalarType dtype, uint64_t seed, const TrainingSpec& training) {
  if (!shape.training) {
    throw std::invalid_argument(workload +
                                ": training over steps needs shape key mode: training (steps "
                                "train it; inference has no backward)");
  }
  const Model m(shape, dtype, seed);
  WorkloadData d;
  d.inputs["input"] = m.input();
  d.inputs["target"] = m.target();
  trainReference(
      training, m.parameters(), [&] { return m.forward(m.input().detach().requires_grad_(true)); },
      m.target(), [&] { m.zeroGrad(); }, d);
  return d;
}

}  // namespace

WorkloadData buildTraining(const std::string& workload, const nlohmann::json& shape,
                           at::ScalarType dtype, uint64_t seed, InputMode mode,
                           const TrainingSpec& training) {
  if (!hasTrainingReference(workload)) {
    throw std::invalid_argument(
        "workload '" + workload +
        "' has no training reference (steps need one): " + trainingWorkloadList());
  }
  if (const ChainWorkload* w = findChainWorkload(workload)) {
    return buildChainTraining(*w, shape, dtype, seed, training);
  }
  if (workload == "transformer_block") {
    return buildBlockTraining(shape, dtype, seed, mode, training);
  }
  if (workload == "torchscript") {
    return torchscript::buildTraining(shape, dtype, seed, mode, training);
  }
  if (workload == "linear") return buildLinearTraining(shape, dtype, seed, mode, training);
  if (workload == "moe") return buildMoeTraining(shape, dtype, seed, mode, training);
  if (workload == "gpt2_prefill" || workload == "vit_encoder") {
    return buildModelTraining<Transformer>(workload, TransformerShape::parse(shape, workload),
                                           dtype, seed, training);
  }
  if (workload == "evoformer_pair") {
    return buildModelTraining<PairStack>(workload, PairShape::parse(shape), dtype, seed, training);
  }
  const Graph g = buildGraph(workload, shape);
  if (g.shape.dropout > 0 && workload != "mlp") {
    throw std::invalid_argument(workload +
                                ": training over steps needs shape key dropout: 0 (each rank's "
                                "masks would be the slice of the whole batch's)");
  }
  WorkloadData d;
  d.inputs = graphInputs(g, dtype, seed, mode);
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::map<std::string, at::Tensor> values;
  for (const auto& [name, dims] : g.inputs) values[name] = d.inputs.at(name);
  for (const auto& [name, dims] : g.parameters) {
    at::Tensor p = d.inputs.at(name).clone().requires_grad_(true);
    values[name] = p;
    params.emplace_back(name, p);
  }
  TrainingLoop loop(training, params);
  at::Tensor target;
  for (int k = 0; k < training.steps; ++k) {
    for (auto& [name, p] : params) p.mutable_grad() = at::Tensor();
    double loss = 0;
    {
      const auto all = runGraph(g, values, seed);
      const at::Tensor& out = all.at(g.output);
      if (!target.defined()) {
        target = makeNormal(out.sizes(), dtype, seed, 999, mode);
        d.inputs["target"] = target;
      }
      const at::Tensor l = (out * target).sum();
      backward({l});
      loss = l.item<double>();
    }
    loop.update(loss);
  }
  loop.write(d.expected, &d.checked);
  return d;
}

}  // namespace sb::reference
