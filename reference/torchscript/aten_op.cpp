// The graph operator "aten" (aten_op.h): an imported model's operator that no strategy set
// knows, run by LibTorch's own kernel.

#include "reference/torchscript/aten_op.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <set>

#include "reference/ops.h"

namespace sb::reference {
namespace {

std::string where() { return "op aten: "; }

std::vector<int64_t> parseShape(const nlohmann::json& v, const std::string& key) {
  TORCH_CHECK(v.is_array() && v.size() <= 8, where(), "shape key '", key,
              "' must hold lists of at most 8 dimensions, got ", v.dump());
  std::vector<int64_t> dims;
  for (const auto& d : v) {
    TORCH_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0 && d.get<int64_t>() <= (1 << 24),
                where(), "shape key '", key, "' must hold dimensions in [0, 2^24], got ", v.dump());
    dims.push_back(d.get<int64_t>());
  }
  return dims;
}

// The operator of "aten::name.overload", looked up once (ranks run on threads).
std::shared_ptr<torch::jit::Operator> findOp(const std::string& schema) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<torch::jit::Operator>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(schema); it != cache.end()) return it->second;
  const auto colons = schema.find("::");
  TORCH_CHECK(colons != std::string::npos && colons > 0, where(), "shape key 'schema' must name ",
              "an operator as namespace::name[.overload], got '", schema, "'");
  const auto dot = schema.find('.', colons);
  const c10::OperatorName name(schema.substr(0, dot),
                               dot == std::string::npos ? "" : schema.substr(dot + 1));
  auto op = torch::jit::findOperatorFor(name);
  TORCH_CHECK(op != nullptr, where(), "no operator '", schema, "' in this LibTorch");
  cache[schema] = op;
  return op;
}

const std::vector<std::string>& argKinds() {
  static const std::vector<std::string> k = {"tensor", "tensors", "int",    "double",
                                             "bool",   "none",    "ints",   "doubles",
                                             "bools",  "str",     "device", "scalar_tensor"};
  return k;
}

double jsonDouble(const nlohmann::json& v) {
  if (v.is_number()) return v.get<double>();
  TORCH_CHECK(v.is_string(), where(), "a double must be a number or inf, -inf, nan, got ",
              v.dump());
  const std::string s = v.get<std::string>();
  if (s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf") return -std::numeric_limits<double>::infinity();
  TORCH_CHECK(s == "nan", where(), "a double must be a number or inf, -inf, nan, got ", v.dump());
  return std::numeric_limits<double>::quiet_NaN();
}

at::ScalarType scalarTypeNamed(const std::string& n) {
  for (auto t : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kBool,
                 at::kByte, at::kChar, at::kShort}) {
    if (n == c10::toString(t)) return t;
  }
  TORCH_CHECK(false, where(), "unknown dtype '", n, "'");
}

}  // namespace

void parseAtenOp(OpShape& s) {
  for (const char* key : {"schema", "operands", "dtypes", "args", "outputs"}) {
    TORCH_CHECK(s.attrs.contains(key), where(), "shape key '", key, "' is missing");
  }
  TORCH_CHECK(s.attrs.at("schema").is_string(), where(), "shape key 'schema' must be a string");
  const auto op = findOp(s.attrs.at("schema").get<std::string>());
  const auto& ops = s.attrs.at("operands");
  const auto& dtypes = s.attrs.at("dtypes");
  TORCH_CHECK(ops.is_array() && !ops.empty() && ops.size() <= 64, where(),
              "shape key 'operands' must list 1 to 64 operand shapes");
  TORCH_CHECK(dtypes.is_array() && dtypes.size() == ops.size(), where(),
              "shape key 'dtypes' must give one dtype per operand");
  s.extra.clear();
  for (size_t i = 0; i < ops.size(); ++i) {
    auto dims = parseShape(ops[i], "operands");
    TORCH_CHECK(dtypes[i].is_string(), where(), "shape key 'dtypes' must hold strings");
    const std::string d = dtypes[i].get<std::string>();
    TORCH_CHECK(d == "float" || d == "long" || d == "bool" || d == "int", where(),
                "shape key 'dtypes' holds '", d, "' (expected float, long, bool or int)");
    if (i == 0) {
      s.input = dims;
    } else if (i == 1) {
      s.other = dims;
    } else {
      s.extra.push_back(dims);
    }
  }
  const auto& args = s.attrs.at("args");
  const auto& schemaArgs = op->schema().arguments();
  TORCH_CHECK(args.is_array() && args.size() == schemaArgs.size(), where(), "shape key 'args' ",
              "must give each of the ", schemaArgs.size(), " arguments of ", op->schema().name());
  for (const auto& a : args) {
    TORCH_CHECK(a.is_object() && a.size() >= 1, where(), "shape key 'args' holds ", a.dump(),
                " (expected an object naming how the argument is given)");
    const std::string kind = a.contains("scalar_tensor") ? "scalar_tensor" : a.begin().key();
    TORCH_CHECK(std::count(argKinds().begin(), argKinds().end(), kind) == 1, where(),
                "shape key 'args' holds an argument of kind '", kind, "'");
    const auto index = [&](const nlohmann::json& k, bool optional) {
      TORCH_CHECK(
          k.is_number_integer() && ((optional && k.get<int64_t>() == -1) ||
                                    (k.get<int64_t>() >= 0 && k.get<size_t>() < ops.size())),
          where(), "shape key 'args' refers to operand ", k.dump(), " of ", ops.size());
    };
    if (kind == "tensor") index(a.at("tensor"), false);
    if (kind == "tensors") {
      TORCH_CHECK(a.at("tensors").is_array(), where(), "'tensors' must be a list");
      for (const auto& k : a.at("tensors")) index(k, true);
    }
    if (kind == "double") jsonDouble(a.at("double"));
  }
  TORCH_CHECK(!s.attrs.contains("view") || s.attrs.at("view").is_boolean(), where(),
              "shape key 'view' must be true or false");
  const auto& outs = s.attrs.at("outputs");
  TORCH_CHECK(outs.is_array() && !outs.empty() && outs.size() <= 64, where(),
              "shape key 'outputs' must list 1 to 64 output shapes");
  for (const auto& o : outs) parseShape(o, "outputs");
}

std::vector<std::vector<int64_t>> atenOutputs(const OpShape& s) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& o : s.attrs.at("outputs")) out.push_back(o.get<std::vector<int64_t>>());
  return out;
}

bool atenOperandFloating(const OpShape& s, size_t index) {
  return s.attrs.at("dtypes").at(index).get<std::string>() == "float";
}

std::vector<at::Tensor> atenForward(const OpShape& s, const std::vector<at::Tensor>& operands) {
  const auto op = findOp(s.attrs.at("schema").get<std::string>());
  const auto& schemaArgs = op->schema().arguments();
  const at::Device device = operands.empty() ? caseDevice() : operands[0].device();
  torch::jit::Stack stack;
  const auto& args = s.attrs.at("args");
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    const std::string kind = a.contains("scalar_tensor") ? "scalar_tensor" : a.begin().key();
    const auto& v = a.at(kind);
    if (kind == "tensor") {
      stack.emplace_back(operands.at(v.get<size_t>()));
    } else if (kind == "tensors") {
      const auto list = schemaArgs[i].type()->cast<c10::ListType>();
      if (list && list->getElementType()->kind() == c10::TypeKind::OptionalType) {
        c10::List<c10::optional<at::Tensor>> l;
        for (const auto& k : v) {
          l.push_back(k.get<int64_t>() < 0
                          ? c10::optional<at::Tensor>()
                          : c10::optional<at::Tensor>(operands.at(k.get<size_t>())));
        }
        stack.emplace_back(l);
      } else {
        std::vector<at::Tensor> l;
        for (const auto& k : v) l.push_back(operands.at(k.get<size_t>()));
        stack.emplace_back(l);
      }
    } else if (kind == "int") {
      stack.emplace_back(v.get<int64_t>());
    } else if (kind == "double") {
      stack.emplace_back(jsonDouble(v));
    } else if (kind == "bool") {
      stack.emplace_back(v.get<bool>());
    } else if (kind == "none") {
      stack.emplace_back(c10::IValue());
    } else if (kind == "ints") {
      stack.emplace_back(v.get<std::vector<int64_t>>());
    } else if (kind == "doubles") {
      std::vector<double> d;
      for (const auto& x : v) d.push_back(jsonDouble(x));
      stack.emplace_back(d);
    } else if (kind == "bools") {
      c10::List<bool> l;
      for (const auto& x : v) l.push_back(x.get<bool>());
      stack.emplace_back(l);
    } else if (kind == "str") {
      stack.emplace_back(v.get<std::string>());
    } else if (kind == "device") {
      stack.emplace_back(device);  // the case's device, wherever the model was traced
    } else {                       // scalar_tensor
      const at::ScalarType t = scalarTypeNamed(a.at("dtype").get<std::string>());
      stack.emplace_back(
          at::scalar_tensor(jsonDouble(v), at::TensorOptions().dtype(t).device(device)));
    }
  }
  op->getOperation()(stack);
  std::vector<at::Tensor> out;
  const std::function<void(const c10::IValue&)> flatten = [&](const c10::IValue& r) {
    if (r.isTensor()) {
      out.push_back(r.toTensor());
    } else if (r.isTensorList()) {
      for (const at::Tensor& t : r.toTensorVector()) out.push_back(t);
    } else if (r.isTuple()) {
      for (const auto& e : r.toTupleRef().elements()) flatten(e);
    }
  };
  for (const auto& r : stack) flatten(r);
  const auto shapes = atenOutputs(s);
  TORCH_CHECK(out.size() == shapes.size(), where(), s.attrs.at("schema").get<std::string>(),
              " returned ", out.size(), " tensors, its shape lists ", shapes.size());
  for (size_t i = 0; i < out.size(); ++i) {
    TORCH_CHECK(out[i].sizes().vec() == shapes[i], where(), s.attrs.at("schema").get<std::string>(),
                " returned output ", i, " of shape ", out[i].sizes(), ", its shape lists ",
                dimsString(shapes[i]));
  }
  return out;
}

AtenSaved atenSavedTensors(const OpShape& s, at::ScalarType dtype,
                           const std::vector<bool>& requiresGrad,
                           const std::vector<std::vector<int64_t>>& strides,
                           const std::vector<bool>& outputGrads,
                           const AllocationMeasure& measure) {
  static std::mutex mu;
  static std::map<std::string, AtenSaved> cache;
  const auto names = s.operands();
  std::string key = s.toString() + "|" + c10::toString(dtype) + "|";
  for (size_t i = 0; i < names.size(); ++i) {
    key += i < requiresGrad.size() && requiresGrad[i] ? '1' : '0';
    if (i < strides.size()) key += dimsString(strides[i]);
  }
  key += "|";
  for (bool g : outputGrads) key += g ? '1' : '0';
  key += measure ? "|measured" : "";
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  AtenSaved saved;
  saved.operands.assign(names.size(), false);
  if (s.attrs.value("view", false) && !measure) {
    saved.known = true;
  } else {
    try {
      at::AutoGradMode grad(true);
      std::vector<at::Tensor> in;
      for (size_t i = 0; i < names.size(); ++i) {
        const std::string d = s.attrs.at("dtypes").at(i).get<std::string>();
        const at::ScalarType t = d == "float" ? dtype
                                 : d == "long" ? at::kLong
                                 : d == "int"  ? at::kInt
                                               : at::kBool;
        const std::vector<int64_t>& sizes = s.operandShape(names[i]);
        bool strided = false;
        if (i < strides.size() && strides[i].size() == sizes.size()) {
          int64_t expected = 1;
          for (size_t d = sizes.size(); d-- > 0;) {
            strided |= sizes[d] != 1 && strides[i][d] != expected;
            expected *= sizes[d];
          }
        }
        int64_t extent = 1;  // the storage's elements under these strides
        for (size_t d = 0; strided && d < sizes.size(); ++d) {
          extent += sizes[d] == 0 ? 0 : (sizes[d] - 1) * strides[i][d];
        }
        at::Tensor x = at::zeros(strided ? std::vector<int64_t>{extent} : sizes,
                                 at::TensorOptions().dtype(t));
        // A value of the graph, not a leaf: its node saves it as LibTorch saves any
        // intermediate (a leaf is saved another way).
        if (d == "float" && i < requiresGrad.size() && requiresGrad[i]) {
          x = x.requires_grad_(true).mul(1);
        }
        if (strided) x = x.as_strided(sizes, strides[i]);
        in.push_back(std::move(x));
      }
      std::vector<at::Tensor> out;
      if (measure) {
        const auto [peak, net] = measure([&] { out = atenForward(s, in); });
        // The new storage its outputs hold (once each, an output viewing an operand none).
        std::set<const void*> storages;
        int64_t outputBytes = 0;
        for (const at::Tensor& o : out) {
          if (!o.defined() || !o.has_storage()) continue;
          bool aliases = false;
          for (const at::Tensor& x : in) aliases |= x.has_storage() && o.is_alias_of(x);
          if (!aliases && storages.insert(o.storage().unsafeGetStorageImpl()).second) {
            outputBytes += static_cast<int64_t>(o.storage().nbytes());
          }
        }
        saved.forwardPeak = peak;
        saved.internal = std::max<int64_t>(net - outputBytes, 0);
        for (const at::Tensor& o : out) {
          int alias = -1;
          for (size_t i = 0; i < in.size() && alias < 0; ++i) {
            if (o.defined() && o.has_storage() && in[i].has_storage() && o.is_alias_of(in[i])) {
              alias = static_cast<int>(i);
            }
          }
          saved.aliasOf.push_back(alias);
          saved.outStrides.push_back(o.defined() ? o.strides().vec() : std::vector<int64_t>{});
        }
        saved.passThrough = out.size() == 1 && saved.aliasOf[0] >= 0 &&
                            out[0].unsafeGetTensorImpl() ==
                                in[static_cast<size_t>(saved.aliasOf[0])].unsafeGetTensorImpl();
      } else {
        out = atenForward(s, in);
      }
      // Every reference beyond this function's own is the node's (a SavedVariable holds an
      // operand itself, an output's data through another TensorImpl on its storage). Ours:
      // the handles in `in` and `out` on the same TensorImpl, and the distinct TensorImpls
      // among them on the same storage (an output that is its operand, or a view of it), with
      // the bases of those that are views (a view holds its base: linear's 3-D output is a
      // view of its addmm's result, which no node saved).
      const auto held = [&](const at::Tensor& t) {
        if (!t.defined()) return false;
        std::set<const c10::TensorImpl*> impls;
        size_t handles = 0;
        for (const auto* v : {&in, &out}) {
          for (const at::Tensor& o : *v) {
            if (!o.defined()) continue;
            handles += o.unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
            // A view among them holds its base (select's output, its operand).
            handles += o.is_view() && o._base().unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
            if (t.has_storage() && o.has_storage() && o.is_alias_of(t)) {
              impls.insert(o.unsafeGetTensorImpl());
              if (o.is_view()) impls.insert(o._base().unsafeGetTensorImpl());
            }
          }
        }
        return static_cast<size_t>(t.use_count()) > handles ||
               (t.has_storage() && static_cast<size_t>(t.storage().use_count()) > impls.size());
      };
      for (size_t i = 0; i < in.size(); ++i) saved.operands[i] = held(in[i]);
      saved.output = !out.empty() && held(out[0]);
      if (measure) {
        // Its backward, from zeros for the outputs a gradient reaches to the operands that
        // take one: what it holds above what the forward left, at its most.
        std::vector<at::Tensor> roots, rootGrads, wrt;
        for (size_t j = 0; j < out.size(); ++j) {
          if (out[j].defined() && out[j].requires_grad() && !saved.passThrough &&
              (outputGrads.empty() || (j < outputGrads.size() && outputGrads[j]))) {
            roots.push_back(out[j]);
            // Contiguous, as the gradients a consumer's backward hands on mostly are (a
            // select's, a view's): an operator whose output is laid out otherwise (2.x's LSTM,
            // batch_first: a transpose of its time-major buffer) copies it in its backward.
            rootGrads.push_back(at::zeros(out[j].sizes(), out[j].options()));
          }
        }
        for (const at::Tensor& x : in) {
          if (x.requires_grad()) wrt.push_back(x);
        }
        if (!roots.empty() && !wrt.empty()) {
          saved.backwardPeak =
              measure([&] {
                torch::autograd::grad(roots, wrt, rootGrads, /*retain_graph=*/false,
                                      /*create_graph=*/false, /*allow_unused=*/true);
              }).first;
        }
        saved.measured = true;
      }
      saved.known = true;
    } catch (const std::exception&) {
      saved = AtenSaved{};
      saved.operands.assign(names.size(), false);
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace(key, saved);
  return saved;
}

}  // namespace sb::reference
