// The importer's mapping of TorchScript operators to graph nodes (import_map.h): the forms the
// strategy sets know where the arguments allow, "aten" otherwise; and the graph's finish.

#include "reference/torchscript/import_map.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>

namespace sb::reference::torchscript {
namespace {

using torch::jit::Node;
using torch::jit::Value;
using Dims = std::vector<int64_t>;

int64_t numel(const Dims& d) {
  return std::accumulate(d.begin(), d.end(), int64_t{1}, std::multiplies<>());
}

nlohmann::json jsonDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

std::string dtypeClass(const at::Tensor& t) {
  if (at::isFloatingType(t.scalar_type())) return "float";
  switch (t.scalar_type()) {
    case at::kLong:
      return "long";
    case at::kBool:
      return "bool";
    case at::kInt:
      return "int";
    default:
      throw ImportError(std::string("a tensor of dtype ") + c10::toString(t.scalar_type()) +
                        " (expected a floating dtype, int64, int32 or bool)");
  }
}

// "aten::relu_" -> "aten::relu": the functional form of an in-place operator.
std::string functional(const std::string& k) {
  if (k.size() > 2 && k.back() == '_' && k[k.size() - 2] != '_') return k.substr(0, k.size() - 1);
  return k;
}

}  // namespace

std::string GraphMapper::unique(const std::string& base) {
  std::string name = base;
  for (int i = 2; used_.count(name); ++i) name = base + "_" + std::to_string(i);
  used_.insert(name);
  return name;
}

std::string GraphMapper::parameter(const std::string& qualified, const at::Tensor& t, bool wrong) {
  if (wrong && !faulted_) {
    for (const auto& other : seenParams_) {
      if (other != qualified && pendingParams_.at(other).sizes() == t.sizes()) {
        faulted_ = true;  // planted: this parameter's reads bound to another's tensor
        pendingParams_.emplace(qualified, t);
        return other;
      }
    }
  }
  if (!pendingParams_.count(qualified)) seenParams_.push_back(qualified);
  pendingParams_.emplace(qualified, t);
  return qualified;
}

std::string GraphMapper::buffer(const std::string& qualified, const at::Tensor& t) {
  pendingBuffers_.emplace(qualified, t);
  return qualified;
}

std::string GraphMapper::ref(const std::string& name, const at::Tensor& t) {
  if (!name.empty()) {
    if (auto p = pendingParams_.find(name); p != pendingParams_.end()) {
      if (!out_.parameters.count(name)) {
        out_.parameters[name] = p->second.detach();  // the module's, not a leaf of ours
        g_.parameters.emplace_back(name, p->second.sizes().vec());
      }
    } else if (auto b = pendingBuffers_.find(name); b != pendingBuffers_.end()) {
      if (!out_.constants.count(name)) {
        out_.constants[name] = {b->second.detach(), at::isFloatingType(b->second.scalar_type())};
        g_.inputs.emplace_back(name, b->second.sizes().vec());
      }
    }
    return name;
  }
  // A constant (folded from constants alone): a graph input holding it, in its own dtype.
  const auto* impl = t.unsafeGetTensorImpl();
  if (auto it = constantName_.find(impl); it != constantName_.end()) return it->second;
  const std::string c = "const." + std::to_string(constantName_.size());
  constantName_[impl] = c;
  out_.constants[c] = {t.clone(), false};
  g_.inputs.emplace_back(c, t.sizes().vec());
  return c;
}

std::string GraphMapper::ref(const Entry& e) {
  TORCH_CHECK(e.v.isTensor(), "importer: a tensor argument expected");
  return ref(e.dynamic ? e.name : "", e.v.toTensor());
}

std::string GraphMapper::zeros(const Dims& dims) {
  if (auto it = zerosName_.find(dims); it != zerosName_.end()) return it->second;
  const std::string c = "zeros." + std::to_string(zerosName_.size());
  zerosName_[dims] = c;
  out_.constants[c] = {at::zeros(dims, at::kFloat), true};
  g_.inputs.emplace_back(c, dims);
  return c;
}

std::string GraphMapper::add(const std::string& name, const nlohmann::json& shape,
                             std::vector<std::string> args) {
  GraphNode n;
  n.name = name;
  n.role = name;
  n.shape = OpShape::parse(shape);
  n.args = std::move(args);
  TORCH_CHECK(n.args.size() == n.shape.operands().size(), "importer: ", name, " has ",
              n.args.size(), " arguments for ", n.shape.operands().size(), " operands");
  g_.nodes.push_back(n);
  return n.outputs()[0];
}

bool GraphMapper::mapped(const Node* n, Env& env, const std::string& fk, const std::string& base,
                         std::string& as) {
  const auto in = [&](size_t i) -> const Entry& { return env.at(n->input(i)); };
  const auto iv = [&](size_t i) -> const c10::IValue& { return in(i).v; };
  const auto dims = [&](size_t i) { return iv(i).toTensor().sizes().vec(); };
  const auto isTensor = [&](size_t i) { return iv(i).isTensor(); };
  const auto floating = [&](size_t i) {
    return isTensor(i) && at::isFloatingType(iv(i).toTensor().scalar_type());
  };
  const auto number = [&](size_t i) { return iv(i).isInt() ? iv(i).toInt() : iv(i).toDouble(); };
  const auto ints = [&](size_t i) { return iv(i).toIntVector(); };
  const auto allEq = [](const Dims& d, int64_t v) {
    return std::all_of(d.begin(), d.end(), [v](int64_t x) { return x == v; });
  };
  // Operand i made contiguous, as the kernel that reads it makes it (matmul's reshape of a
  // transposed input, the im2col convolution's input): a `contiguous` node, a copy where the
  // operand is not, so that the copy is an allocation the replay sees and the sharding
  // strategies split like any other.
  const auto contiguousRef = [&](size_t i, const std::string& name) {
    if (iv(i).toTensor().is_contiguous()) return ref(in(i));
    return add(name, {{"op", "contiguous"}, {"input", dims(i)}}, {ref(in(i))});
  };
  const size_t nin = n->inputs().size();
  Entry& out = env[n->output(0)];
  const auto result = [&](const std::string& name, const std::string& how) {
    out.name = name;
    out.dynamic = true;
    as = how;
    return true;
  };
  const Dims outDims =
      out.v.isTensor() ? out.v.toTensor().sizes().vec() : Dims{};  // from the execution
  if (fk == "aten::contiguous" || (fk == "aten::clone" && iv(1).isNone())) {
    return result(ref(in(0)), "identity");
  }
  if (!floating(0)) return false;
  if (fk == "aten::embedding") {
    const Dims w = dims(0);
    if (w.size() != 2 || !isTensor(1) || iv(1).toTensor().scalar_type() != at::kLong ||
        dims(1).empty() || iv(2).toInt() != -1 || iv(3).toBool() || iv(4).toBool()) {
      return false;
    }
    return result(add(base,
                      {{"op", "embedding"},
                       {"input", dims(1)},
                       {"num_embeddings", w[0]},
                       {"embedding_dim", w[1]}},
                      {ref(in(1)), ref(in(0))}),
                  "embedding");
  }
  if (fk == "aten::linear" && nin == 3) {
    const Dims x = dims(0), w = dims(1);
    if (!floating(1) || w.size() != 2 || x.size() < 2) return false;
    const int64_t N = w[0], K = w[1], M = numel(x) / K;
    const std::string wt =
        add(base + ".weight_t", {{"op", "transpose"}, {"input", w}, {"dim0", 0}, {"dim1", 1}},
            {ref(in(1))});
    // An input of more dimensions is folded to rows, a copy first where it is not contiguous
    // (matmul's reshape).
    std::string x2 = x.size() == 2 ? ref(in(0)) : contiguousRef(0, base + ".input_contiguous");
    if (x.size() != 2) {
      x2 = add(base + ".input_2d", {{"op", "view"}, {"input", x}, {"size", {M, K}}}, {x2});
    }
    const std::string b = iv(2).isNone() ? zeros({N}) : ref(in(2));
    std::string y = add(base, {{"op", "addmm"}, {"input", {M, K}}, {"other", {K, N}}}, {x2, wt, b});
    if (x.size() != 2) {
      y = add(base + ".output", {{"op", "view"}, {"input", {M, N}}, {"size", outDims}}, {y});
    }
    return result(y, x.size() == 2 ? "transpose+addmm" : "transpose+view+addmm+view");
  }
  if ((fk == "aten::matmul" || fk == "aten::mm" || fk == "aten::bmm") && floating(1)) {
    const Dims a = dims(0), b = dims(1);
    if (b.size() == 2 && a.size() >= 2) {
      // [.., K] x [K, N]: LibTorch folds the batch into rows (a copy first where they are not
      // contiguous) and runs one matrix product.
      const int64_t K = b[0], N = b[1], M = numel(a) / K;
      std::string a2 = a.size() == 2 ? ref(in(0)) : contiguousRef(0, base + ".input_contiguous");
      if (a.size() != 2) {
        a2 = add(base + ".input_2d", {{"op", "view"}, {"input", a}, {"size", {M, K}}}, {a2});
      }
      std::string y = add(base, {{"op", "addmm"}, {"input", {M, K}}, {"other", {K, N}}},
                          {a2, ref(in(1)), zeros({N})});
      if (a.size() != 2) {
        y = add(base + ".output", {{"op", "view"}, {"input", {M, N}}, {"size", outDims}}, {y});
      }
      return result(y, a.size() == 2 ? "addmm" : "view+addmm+view");
    }
    if (a.size() >= 3 && a.size() == b.size() && std::equal(a.begin(), a.end() - 2, b.begin())) {
      const int64_t B = numel(a) / (a[a.size() - 2] * a.back());
      const Dims a3 = {B, a[a.size() - 2], a.back()}, b3 = {B, b[b.size() - 2], b.back()};
      std::string x = ref(in(0)), y = ref(in(1));
      if (a.size() != 3) {
        x = add(base + ".input_3d", {{"op", "view"}, {"input", a}, {"size", a3}}, {x});
        y = add(base + ".other_3d", {{"op", "view"}, {"input", b}, {"size", b3}}, {y});
      }
      std::string r = add(base, {{"op", "bmm"}, {"input", a3}, {"other", b3}}, {x, y});
      if (a.size() != 3) {
        r = add(base + ".output", {{"op", "view"}, {"input", {B, a3[1], b3[2]}}, {"size", outDims}},
                {r});
      }
      return result(r, a.size() == 3 ? "bmm" : "view+bmm+view");
    }
    return false;
  }
  if (fk == "aten::layer_norm") {
    const Dims x = dims(0);
    if (ints(1) != Dims{x.back()} || !floating(2) || !floating(3) ||
        std::abs(iv(4).toDouble() - 1e-5) > 1e-12) {
      return false;
    }
    return result(
        add(base, {{"op", "layer_norm"}, {"input", x}}, {ref(in(0)), ref(in(2)), ref(in(3))}),
        "layer_norm");
  }
  if (fk == "aten::batch_norm") {
    const Dims x = dims(0);
    if (!floating(1) || !floating(2) || !iv(5).toBool() ||
        std::abs(iv(7).toDouble() - 1e-5) > 1e-12 || x.size() < 2 || x.size() > 5) {
      return false;
    }
    return result(
        add(base, {{"op", "batch_norm"}, {"input", x}}, {ref(in(0)), ref(in(1)), ref(in(2))}),
        "batch_norm");
  }
  if (fk == "aten::_convolution" || fk == "aten::conv2d") {
    const Dims x = dims(0), w = dims(1);
    const bool full = fk == "aten::_convolution";
    const Dims stride = ints(3), pad = ints(4), dil = ints(5);
    const bool transposed = full && iv(6).toBool();
    const int64_t groups = full ? iv(8).toInt() : iv(6).toInt();
    if (x.size() != 4 || w.size() != 4 || transposed || groups != 1 || !allEq(dil, 1) ||
        stride.size() != 2 || stride[0] != stride[1] || pad.size() != 2 || pad[0] != pad[1] ||
        w[2] != w[3]) {
      return false;
    }
    const std::string b = iv(2).isNone() ? zeros({w[0]}) : ref(in(2));
    return result(add(base,
                      {{"op", "conv2d"},
                       {"input", x},
                       {"out_channels", w[0]},
                       {"kernel", w[2]},
                       {"stride", stride[0]},
                       {"padding", pad[0]}},
                      {contiguousRef(0, base + ".input_contiguous"), ref(in(1)), b}),
                  "conv2d");
  }
  if (fk == "aten::max_pool2d" || fk == "aten::avg_pool2d") {
    const Dims k = ints(1), s = ints(2).empty() ? k : ints(2), p = ints(3);
    const bool plain = fk == "aten::max_pool2d" ? allEq(ints(4), 1) && !iv(5).toBool()
                                                : !iv(4).toBool() && iv(6).isNone();
    if (!plain || k.size() != 2 || k[0] != k[1] || s.size() != 2 || s[0] != s[1] || !allEq(p, 0)) {
      return false;
    }
    return result(
        add(base, {{"op", fk.substr(6)}, {"input", dims(0)}, {"kernel", k[0]}, {"stride", s[0]}},
            {ref(in(0))}),
        fk.substr(6));
  }
  if (fk == "aten::relu" || fk == "aten::silu" ||
      (fk == "aten::gelu" && iv(1).toStringRef() == "none")) {
    return result(add(base, {{"op", fk.substr(6)}, {"input", dims(0)}}, {ref(in(0))}),
                  fk.substr(6));
  }
  if ((fk == "aten::add" || fk == "aten::mul") && floating(1) && dims(0).size() > 0 &&
      dims(1).size() > 0 && (fk == "aten::mul" || number(2) == 1) &&
      iv(0).toTensor().scalar_type() == iv(1).toTensor().scalar_type()) {
    return result(add(base, {{"op", fk.substr(6)}, {"input", dims(0)}, {"other", dims(1)}},
                      {ref(in(0)), ref(in(1))}),
                  fk.substr(6));
  }
  if (fk == "aten::softmax" && iv(2).isNone()) {
    return result(
        add(base, {{"op", "softmax"}, {"input", dims(0)}, {"dim", iv(1).toInt()}}, {ref(in(0))}),
        "softmax");
  }
  if ((fk == "aten::view" || fk == "aten::reshape" || fk == "aten::_unsafe_view" ||
       fk == "aten::flatten") &&
      !dims(0).empty() && !outDims.empty() && numel(outDims) > 0) {
    return result(add(base, {{"op", "view"}, {"input", dims(0)}, {"size", outDims}}, {ref(in(0))}),
                  "view");
  }
  if (fk == "aten::t" && dims(0).size() == 2) {
    return result(add(base, {{"op", "transpose"}, {"input", dims(0)}, {"dim0", 0}, {"dim1", 1}},
                      {ref(in(0))}),
                  "transpose");
  }
  if (fk == "aten::transpose") {
    return result(add(base,
                      {{"op", "transpose"},
                       {"input", dims(0)},
                       {"dim0", iv(1).toInt()},
                       {"dim1", iv(2).toInt()}},
                      {ref(in(0))}),
                  "transpose");
  }
  if (fk == "aten::permute") {
    return result(
        add(base, {{"op", "permute"}, {"input", dims(0)}, {"dims", ints(1)}}, {ref(in(0))}),
        "permute");
  }
  if (fk == "aten::sum" && nin == 4 && iv(1).isIntList() && !iv(2).toBool() && iv(3).isNone()) {
    return result(add(base, {{"op", "sum"}, {"input", dims(0)}, {"dims", ints(1)}}, {ref(in(0))}),
                  "sum");
  }
  if ((fk == "aten::split" || fk == "aten::unsafe_split" || fk == "aten::chunk") && iv(1).isInt() &&
      out.v.isTensorList()) {
    const Dims x = dims(0);
    const int64_t dim =
        iv(2).toInt() < 0 ? iv(2).toInt() + static_cast<int64_t>(x.size()) : iv(2).toInt();
    const int64_t size =
        fk == "aten::chunk" ? (x.at(dim) + iv(1).toInt() - 1) / iv(1).toInt() : iv(1).toInt();
    const auto pieces = out.v.toTensorVector();
    if ((x.at(dim) + size - 1) / size != static_cast<int64_t>(pieces.size())) return false;
    add(base, {{"op", "split"}, {"input", x}, {"split_size", size}, {"dim", dim}}, {ref(in(0))});
    out.names = g_.nodes.back().outputs();
    out.dynamic = true;
    as = "split";
    return true;
  }
  return false;
}

void GraphMapper::opaque(const Node* n, Env& env, const std::string& base) {
  const c10::FunctionSchema& schema = n->schema();
  std::string name = schema.name();
  if (schema.is_mutable()) {
    name = functional(name);
    if (!torch::jit::findOperatorFor(c10::OperatorName(name, schema.overload_name()))) {
      throw ImportError("an in-place operator without a functional form " + name + "." +
                        schema.overload_name());
    }
  }
  const std::string full =
      name + (schema.overload_name().empty() ? "" : "." + schema.overload_name());
  nlohmann::json operands = nlohmann::json::array(), dtypes = nlohmann::json::array(),
                 args = nlohmann::json::array(), outputs = nlohmann::json::array();
  std::vector<std::string> names;
  const auto operand = [&](const std::string& v, const at::Tensor& t) {
    names.push_back(ref(v, t));
    operands.push_back(t.sizes().vec());
    dtypes.push_back(dtypeClass(t));
    return static_cast<int64_t>(names.size() - 1);
  };
  for (size_t i = 0; i < n->inputs().size(); ++i) {
    const Entry& e = env.at(n->input(i));
    const c10::IValue& v = e.v;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!e.dynamic && t.dim() == 0) {
        args.push_back({{"scalar_tensor", jsonDouble(t.item<double>())},
                        {"dtype", c10::toString(t.scalar_type())}});
      } else {
        args.push_back({{"tensor", operand(e.dynamic ? e.name : "", t)}});
      }
    } else if (v.isList() && (v.isTensorList() || v.toListRef().empty() ||
                              v.toListRef()[0].isTensor() || v.toListRef()[0].isNone())) {
      nlohmann::json ks = nlohmann::json::array();
      const auto& l = v.toListRef();
      for (size_t j = 0; j < l.size(); ++j) {
        if (l[j].isNone()) {
          ks.push_back(-1);
          continue;
        }
        const std::string dyn = j < e.names.size() ? e.names[j] : "";
        ks.push_back(operand(dyn, l[j].toTensor()));
      }
      args.push_back({{"tensors", ks}});
    } else if (v.isNone()) {
      args.push_back({{"none", true}});
    } else if (v.isBool()) {
      args.push_back({{"bool", v.toBool()}});
    } else if (v.isInt()) {
      args.push_back({{"int", v.toInt()}});
    } else if (v.isDouble()) {
      args.push_back({{"double", jsonDouble(v.toDouble())}});
    } else if (v.isIntList()) {
      args.push_back({{"ints", v.toIntVector()}});
    } else if (v.isDoubleList()) {
      nlohmann::json d = nlohmann::json::array();
      for (double x : v.toDoubleVector()) d.push_back(jsonDouble(x));
      args.push_back({{"doubles", d}});
    } else if (v.isBoolList()) {
      std::vector<bool> b;
      for (bool x : v.toBoolList()) b.push_back(x);
      args.push_back({{"bools", b}});
    } else if (v.isString()) {
      args.push_back({{"str", v.toStringRef()}});
    } else if (v.isDevice()) {
      args.push_back({{"device", v.toDevice().str()}});
    } else {
      throw ImportError("argument " + std::to_string(i) + " of " + full + " is a " + v.tagKind() +
                        ", which the importer does not carry");
    }
  }
  size_t count = 0;
  for (const Value* o : n->outputs()) {
    const auto& v = env.at(o).v;
    if (v.isTensor()) {
      outputs.push_back(v.toTensor().sizes().vec());
      ++count;
    } else if (v.isTensorList()) {
      for (const auto& t : v.toTensorVector()) outputs.push_back(t.sizes().vec());
      count += v.toTensorVector().size();
    }
  }
  if (count == 0) throw ImportError(full + " returns no tensor");
  nlohmann::json shape = {{"op", "aten"},     {"schema", full}, {"operands", operands},
                          {"dtypes", dtypes}, {"args", args},   {"outputs", outputs}};
  // A view of its input (the schema's alias annotation, "Tensor(a) self -> Tensor(a)"): it
  // allocates nothing, which the plans' memory model counts.
  const auto& returns = schema.returns();
  if (!schema.is_mutable() && returns.size() == 1 && returns[0].alias_info() &&
      !returns[0].alias_info()->isWrite()) {
    shape["view"] = true;
  }
  add(base, shape, names);
  const auto outNames = g_.nodes.back().outputs();
  size_t k = 0;
  for (const Value* o : n->outputs()) {
    Entry& e = env[o];
    if (e.v.isTensor()) {
      e.name = outNames[k++];
      e.dynamic = true;
    } else if (e.v.isTensorList()) {
      for (size_t j = 0; j < e.v.toTensorVector().size(); ++j) e.names.push_back(outNames[k++]);
      e.dynamic = true;
    }
  }
}

void GraphMapper::emit(const Node* n, Env& env, const std::string& path) {
  const std::string k = n->kind().toQualString();
  const std::string fk = functional(k);
  const std::string shortName = fk.substr(fk.find("::") + 2);
  const std::string base = unique(path.empty() ? shortName : path + "." + shortName);
  const size_t mark = g_.nodes.size();
  Emission em;
  em.aten = k;
  bool done = false;
  try {
    done = mapped(n, env, fk, base, em.mapped);
  } catch (const c10::Error&) {
    done = false;  // arguments outside what the graph operator takes: kept whole below
  }
  if (!done) {
    g_.nodes.resize(mark);
    try {
      opaque(n, env, base);
    } catch (const c10::Error& e) {
      throw ImportError(e.what_without_backtrace());
    }
    em.mapped = "aten (replicated)";
  } else {
    em.strategies = true;
  }
  for (size_t i = mark; i < g_.nodes.size(); ++i) em.nodes.push_back(g_.nodes[i].name);
  emissions_.push_back(em);
}

void GraphMapper::finish(const std::string& output) {
  g_.workload = "torchscript";
  g_.index();
  // Backwards from the output: the nodes it needs.
  std::set<std::string> needed = {output};
  std::vector<bool> keep(g_.nodes.size(), false);
  for (size_t i = g_.nodes.size(); i-- > 0;) {
    for (const auto& o : g_.nodes[i].outputs()) keep[i] = keep[i] || needed.count(o) > 0;
    if (keep[i]) needed.insert(g_.nodes[i].args.begin(), g_.nodes[i].args.end());
  }
  std::vector<GraphNode> nodes;
  for (size_t i = 0; i < g_.nodes.size(); ++i) {
    if (keep[i]) nodes.push_back(g_.nodes[i]);
  }
  g_.nodes = std::move(nodes);
  const auto reads = [&](const std::string& name) { return needed.count(name) > 0; };
  std::vector<std::pair<std::string, std::vector<int64_t>>> inputs, params;
  for (const auto& in : g_.inputs) {
    const bool data = std::find(out_.dataInputs.begin(), out_.dataInputs.end(), in.first) !=
                      out_.dataInputs.end();
    if (data || reads(in.first)) {
      inputs.push_back(in);
    } else {
      out_.constants.erase(in.first);
    }
  }
  for (const auto& p : g_.parameters) {
    if (reads(p.first)) {
      params.push_back(p);
    } else {
      out_.parameters.erase(p.first);
    }
  }
  g_.inputs = std::move(inputs);
  g_.parameters = std::move(params);
  std::set<std::string> kept;
  for (const auto& n : g_.nodes) kept.insert(n.name);
  for (auto& em : emissions_) {
    em.nodes.erase(std::remove_if(em.nodes.begin(), em.nodes.end(),
                                  [&](const std::string& s) { return !kept.count(s); }),
                   em.nodes.end());
  }
  findBlocks();
  g_.index();
}

// Blocks: the children of one ModuleList ("h.0.", "h.1.", ...) holding the same operators on
// the same shapes, in the same order. Otherwise no blocks: every node is its own class.
void GraphMapper::findBlocks() {
  struct Place {
    std::string prefix, role;
    int layer = -1;
  };
  const auto placeOf = [](const std::string& name) {
    Place p;
    size_t start = 0;
    while (start < name.size()) {
      const size_t dot = name.find('.', start);
      const std::string part =
          name.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (start > 0 && !part.empty() && part.size() < 6 &&
          std::all_of(part.begin(), part.end(), [](unsigned char c) { return std::isdigit(c); })) {
        p.prefix = name.substr(0, start - 1);
        p.layer = std::stoi(part);
        p.role = p.prefix + "." + (dot == std::string::npos ? "" : name.substr(dot + 1));
        return p;
      }
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    return p;
  };
  std::map<std::string, std::set<int>> layersOf;
  for (const auto& n : g_.nodes) {
    const Place p = placeOf(n.name);
    if (p.layer >= 0) layersOf[p.prefix].insert(p.layer);
  }
  std::string best;
  for (const auto& [prefix, layers] : layersOf) {
    if (layers.size() >= 2 && (best.empty() || layers.size() > layersOf[best].size()))
      best = prefix;
  }
  g_.shape.layers = 0;
  if (best.empty()) return;
  const int L = static_cast<int>(layersOf[best].size());
  if (*layersOf[best].rbegin() != L - 1) return;  // not 0 .. L-1
  std::vector<std::vector<std::string>> seqs(L);
  int last = -1;
  for (const auto& n : g_.nodes) {
    const Place p = placeOf(n.name);
    if (p.prefix != best) continue;
    if (p.layer < last) return;  // blocks interleaved
    last = p.layer;
    seqs[p.layer].push_back(p.role + "|" + n.shape.toString());
  }
  for (int l = 1; l < L; ++l) {
    if (seqs[l] != seqs[0]) return;
  }
  for (auto& n : g_.nodes) {
    const Place p = placeOf(n.name);
    if (p.prefix != best) continue;
    n.layer = p.layer;
    n.role = p.role;
  }
  g_.shape.layers = L;
}

std::vector<CoverageRow> GraphMapper::coverage() const {
  std::map<std::string, CoverageRow> rows;
  for (const auto& em : emissions_) {
    if (em.nodes.empty() && em.mapped != "identity") continue;  // dropped: the output needs none
    CoverageRow& r = rows[em.aten];
    r.aten = em.aten;
    r.count += 1;
    if (r.mapped.empty()) {
      r.mapped = em.mapped;
    } else if (r.mapped.find(em.mapped) == std::string::npos) {
      r.mapped += " | " + em.mapped;
    }
    r.strategies = r.strategies || em.strategies;
  }
  std::vector<CoverageRow> out;
  for (auto& [k, r] : rows) out.push_back(r);
  return out;
}

}  // namespace sb::reference::torchscript
