// An operator's shape (ops.h's OpShape): the keys each operator takes, their validation, and
// what follows from them (operands, outputs, reduced dimensions, permutations, getitem's rows).
// The operator computed on tensors, and the "op" workload, are ops.cpp's.

#include "reference/ops.h"

#include "reference/torchscript/aten_op.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

namespace sb::reference {
namespace {

// Each operator's keys beyond "op", and which of them are tensor shapes.
struct OpKeys {
  std::vector<std::string> required, optional;
};

const std::map<std::string, OpKeys>& opKeys() {
  static const std::map<std::string, OpKeys> keys = {
      {"addmm", {{"input", "other"}, {"bias"}}},
      {"mm", {{"input", "other"}, {}}},
      {"rms_norm", {{"input"}, {}}},
      {"rope", {{"input"}, {"theta"}}},
      {"bmm", {{"input", "other"}, {}}},
      {"matmul", {{"input", "other"}, {}}},
      {"embedding", {{"input", "num_embeddings", "embedding_dim"}, {}}},
      {"layer_norm", {{"input"}, {}}},
      {"batch_norm", {{"input"}, {}}},
      {"conv2d", {{"input", "out_channels", "kernel"}, {"stride", "padding"}}},
      {"max_pool2d", {{"input", "kernel"}, {"stride"}}},
      {"avg_pool2d", {{"input", "kernel"}, {"stride"}}},
      {"add", {{"input", "other"}, {}}},
      {"mul", {{"input", "other"}, {}}},
      {"gelu", {{"input"}, {}}},
      {"relu", {{"input"}, {}}},
      {"silu", {{"input"}, {}}},
      {"aten", {{"schema", "operands", "dtypes", "args", "outputs"}, {"view"}}},
      {"dropout", {{"input", "p"}, {}}},
      {"softmax", {{"input", "dim"}, {"scale", "causal", "query_group"}}},
      {"view", {{"input", "size"}, {}}},
      {"reshape", {{"input", "size"}, {}}},
      {"getitem", {{"input", "index"}, {}}},
      {"permute", {{"input", "dims"}, {}}},
      {"transpose", {{"input", "dim0", "dim1"}, {}}},
      {"contiguous", {{"input"}, {}}},
      {"split", {{"input", "split_size", "dim"}, {}}},
      {"sum", {{"input", "dims"}, {}}},
  };
  return keys;
}

std::string where(const OpShape& s) { return "op " + (s.op.empty() ? "?" : s.op) + ": "; }

std::vector<int64_t> parseDims(const OpShape& s, const nlohmann::json& v, const std::string& key,
                               bool allowMinusOne, bool allowEmpty) {
  TORCH_CHECK(v.is_array() && (allowEmpty || !v.empty()) && v.size() <= 8, where(s), "shape key '",
              key, "' must be a list of 1 to 8 dimensions, got ", v.dump());
  std::vector<int64_t> dims;
  for (const auto& d : v) {
    TORCH_CHECK(d.is_number_integer() &&
                    (d.get<int64_t>() > 0 || (allowMinusOne && d.get<int64_t>() == -1)),
                where(s), "shape key '", key, "' must hold positive integers, got ", v.dump());
    TORCH_CHECK(d.get<int64_t>() <= (1 << 24), where(s), "shape key '", key,
                "' holds a dimension over 2^24: ", v.dump());
    dims.push_back(d.get<int64_t>());
  }
  return dims;
}

int64_t normDim(const OpShape& s, int64_t d, int64_t ndim, const std::string& key) {
  TORCH_CHECK(d >= -ndim && d < ndim, where(s), "shape key '", key, "' is ", d,
              ", not a dimension of the ", ndim, "-dimensional input");
  return d < 0 ? d + ndim : d;
}

int64_t numelOf(const std::vector<int64_t>& dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<>());
}

// Broadcast shape of two operands (numpy rules), or an error naming both.
std::vector<int64_t> broadcastShape(const OpShape& s) {
  const size_t n = std::max(s.input.size(), s.other.size());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t a = i < n - s.input.size() ? 1 : s.input[i - (n - s.input.size())];
    const int64_t b = i < n - s.other.size() ? 1 : s.other[i - (n - s.other.size())];
    TORCH_CHECK(a == b || a == 1 || b == 1, where(s), "input ", dimsString(s.input), " and other ",
                dimsString(s.other), " do not broadcast (dimension ", i, ": ", a, " vs ", b, ")");
    out[i] = std::max(a, b);
  }
  return out;
}

std::vector<int64_t> viewShape(const OpShape& s) {
  auto size = s.attrDims("size");
  const int64_t n = numelOf(s.input);
  int64_t known = 1, minus = -1;
  for (size_t i = 0; i < size.size(); ++i) {
    if (size[i] == -1) {
      TORCH_CHECK(minus < 0, where(s), "shape key 'size' has more than one -1");
      minus = static_cast<int64_t>(i);
    } else {
      known *= size[i];
    }
  }
  if (minus >= 0) {
    TORCH_CHECK(n % known == 0, where(s), "shape key 'size' ", dimsString(size),
                " cannot view an input of ", n, " elements");
    size[minus] = n / known;
  }
  TORCH_CHECK(numelOf(size) == n, where(s), "shape key 'size' ", dimsString(size), " has ",
              numelOf(size), " elements, the input ", n);
  return size;
}

// getitem's rows of the input's first dimension, [start, stop): one for an integer index
// (negative counting from the end), the range for [start, stop].
std::pair<int64_t, int64_t> getitemRange(const OpShape& s) {
  const auto& v = s.attrs.at("index");
  const int64_t n = s.input.empty() ? 0 : s.input[0];
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    TORCH_CHECK(i >= -n && i < n, where(s), "shape key 'index' is ", i,
                ", not a row of the first dimension's ", n);
    return {i < 0 ? i + n : i, (i < 0 ? i + n : i) + 1};
  }
  TORCH_CHECK(v.is_array() && v.size() == 2 && v[0].is_number_integer() && v[1].is_number_integer(),
              where(s), "shape key 'index' must be an integer or [start, stop], got ", v.dump());
  const int64_t start = v[0].get<int64_t>(), stop = v[1].get<int64_t>();
  TORCH_CHECK(0 <= start && start < stop && stop <= n, where(s), "shape key 'index' ", v.dump(),
              " is not a non-empty range of the first dimension's ", n, " rows");
  return {start, stop};
}

std::vector<int64_t> permuteDims(const OpShape& s) {
  const int64_t nd = static_cast<int64_t>(s.input.size());
  if (s.op == "transpose") {
    std::vector<int64_t> dims(nd);
    std::iota(dims.begin(), dims.end(), 0);
    std::swap(dims[normDim(s, s.attrInt("dim0"), nd, "dim0")],
              dims[normDim(s, s.attrInt("dim1"), nd, "dim1")]);
    return dims;
  }
  const auto& v = s.attrs.at("dims");
  TORCH_CHECK(v.is_array() && static_cast<int64_t>(v.size()) == nd, where(s),
              "shape key 'dims' must list all ", nd, " input dimensions, got ", v.dump());
  std::vector<int64_t> dims;
  std::vector<bool> seen(nd, false);
  for (const auto& d : v) {
    TORCH_CHECK(d.is_number_integer(), where(s), "shape key 'dims' must hold integers, got ",
                v.dump());
    const int64_t k = normDim(s, d.get<int64_t>(), nd, "dims");
    TORCH_CHECK(!seen[k], where(s), "shape key 'dims' names dimension ", k, " twice");
    seen[k] = true;
    dims.push_back(k);
  }
  return dims;
}

int64_t convOut(int64_t in, int64_t kernel, int64_t stride, int64_t padding) {
  return (in + 2 * padding - kernel) / stride + 1;
}

}  // namespace

const std::vector<std::string>& opNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& [op, keys] : opKeys()) n.push_back(op);
    return n;
  }();
  return names;
}

OpShape OpShape::parse(const nlohmann::json& shape) {
  OpShape s;
  // The operators, from the table parse() reads: the message cannot leave one out.
  std::string every;
  for (const auto& n : opNames()) every += (every.empty() ? "" : ", ") + n;
  TORCH_CHECK(shape.is_object() && shape.contains("op") && shape.at("op").is_string(),
              "op: shape must be a mapping with the key 'op' naming the operator (one of ", every,
              ")");
  s.op = shape.at("op").get<std::string>();
  const auto it = opKeys().find(s.op);
  TORCH_CHECK(it != opKeys().end(), "op: unknown operator '", s.op, "' (expected one of ", every,
              ")");
  const OpKeys& keys = it->second;
  for (auto k = shape.begin(); k != shape.end(); ++k) {
    if (k.key() == "op") continue;
    const bool known = std::count(keys.required.begin(), keys.required.end(), k.key()) +
                           std::count(keys.optional.begin(), keys.optional.end(), k.key()) >
                       0;
    std::string expected;
    for (const auto& r : keys.required) expected += (expected.empty() ? "" : ", ") + r;
    for (const auto& o : keys.optional) expected += ", " + o + " (optional)";
    TORCH_CHECK(known, where(s), "unknown shape key '", k.key(), "' (expected ", expected, ")");
  }
  for (const auto& r : keys.required) {
    TORCH_CHECK(shape.contains(r), where(s), "shape key '", r, "' is missing");
  }
  for (auto k = shape.begin(); k != shape.end(); ++k) {
    if (k.key() == "input") {
      s.input = parseDims(s, k.value(), "input", false, false);
    } else if (k.key() == "other") {
      s.other = parseDims(s, k.value(), "other", false, false);
    } else if (k.key() != "op") {
      s.attrs[k.key()] = k.value();
    }
  }
  if (s.op == "aten") {
    parseAtenOp(s);
    return s;
  }
  const int64_t nd = static_cast<int64_t>(s.input.size());
  const auto need = [&](bool ok, const std::string& what) {
    TORCH_CHECK(ok, where(s), what, " (input ", dimsString(s.input),
                s.other.empty() ? "" : ", other " + dimsString(s.other), ")");
  };
  if (s.op == "addmm") {
    need(nd == 2 && s.other.size() == 2 && s.input[1] == s.other[0],
         "addmm needs input [M, K] and other [K, N]");
    s.bias = {s.other[1]};
    if (s.attrs.contains("bias")) {  // [N] (a Linear's) or [M, N] (a full bias, not broadcast)
      s.bias = parseDims(s, s.attrs.at("bias"), "bias", false, false);
      TORCH_CHECK(s.bias == std::vector<int64_t>{s.other[1]} ||
                      s.bias == (std::vector<int64_t>{s.input[0], s.other[1]}),
                  where(s), "shape key 'bias' must be [N] = [", s.other[1], "] or [M, N] = [",
                  s.input[0], ", ", s.other[1], "], got ", s.attrs.at("bias").dump());
    }
  } else if (s.op == "mm") {
    need(nd == 2 && s.other.size() == 2 && s.input[1] == s.other[0],
         "mm needs input [M, K] and other [K, N]");
  } else if (s.op == "rms_norm") {
    need(nd >= 2, "rms_norm needs input [..., hidden] of 2 or more dimensions");
    s.weight = {s.input.back()};
  } else if (s.op == "rope") {
    need(nd == 4 && s.input[3] % 2 == 0,
         "rope needs input [batch, seq, heads, head_dim] with an even head_dim");
    if (s.attrs.contains("theta")) {
      TORCH_CHECK(s.attrDouble("theta") > 1, where(s), "shape key 'theta' must be over 1");
    }
  } else if (s.op == "bmm") {
    need(nd == 3 && s.other.size() == 3 && s.input[0] == s.other[0] && s.input[2] == s.other[1],
         "bmm needs input [b, i, k] and other [b, k, j]");
  } else if (s.op == "matmul") {
    const bool batched = nd == 4 && s.other.size() == 4 && s.input[0] == s.other[0] &&
                         s.input[1] == s.other[1] && s.input[3] == s.other[2];
    need(batched || ((nd == 1 || nd == 2) && s.other.size() == 1 && s.input.back() == s.other[0]),
         "matmul here is the dot product ([k] x [k]), matrix-vector product ([m, k] x [k]) or "
         "product batched over two dimensions ([b, h, m, k] x [b, h, k, n])");
  } else if (s.op == "embedding") {
    const int64_t v = s.attrInt("num_embeddings"), e = s.attrInt("embedding_dim");
    TORCH_CHECK(v > 0 && e > 0, where(s), "num_embeddings and embedding_dim must be positive");
    s.weight = {v, e};
  } else if (s.op == "layer_norm") {
    s.weight = s.bias = {s.input.back()};
  } else if (s.op == "batch_norm") {
    need(nd >= 2 && nd <= 5, "batch_norm needs input [N, C, ...] of 2 to 5 dimensions");
    s.weight = s.bias = {s.input[1]};
  } else if (s.op == "conv2d") {
    need(nd == 4, "conv2d needs input [N, C, H, W]");
    const int64_t k = s.kernel(), stride = s.stride(), pad = s.padding();
    TORCH_CHECK(k > 0 && stride > 0 && pad >= 0 && s.attrInt("out_channels") > 0, where(s),
                "kernel, stride and out_channels must be positive and padding not negative");
    need(convOut(s.input[2], k, stride, pad) > 0 && convOut(s.input[3], k, stride, pad) > 0,
         "the kernel is larger than the padded input");
    s.weight = {s.attrInt("out_channels"), s.input[1], k, k};
    s.bias = {s.attrInt("out_channels")};
  } else if (s.op == "max_pool2d" || s.op == "avg_pool2d") {
    need(nd == 4, s.op + " needs input [N, C, H, W]");
    const int64_t k = s.kernel(), stride = s.stride();
    TORCH_CHECK(k > 0 && stride > 0, where(s), "kernel and stride must be positive");
    need(s.input[2] >= k && s.input[3] >= k, "the kernel is larger than the input");
  } else if (s.op == "add" || s.op == "mul") {
    broadcastShape(s);
  } else if (s.op == "dropout") {
    const double p = s.attrDouble("p");
    TORCH_CHECK(p >= 0 && p < 1, where(s), "shape key 'p' must be in [0, 1), got ", p);
  } else if (s.op == "softmax") {
    const int64_t d = normDim(s, s.attrInt("dim"), nd, "dim");
    if (s.attrs.contains("scale")) {
      TORCH_CHECK(s.attrDouble("scale") > 0, where(s), "shape key 'scale' must be positive");
    }
    if (s.attrs.contains("causal")) {
      TORCH_CHECK(s.attrs.at("causal").is_boolean(), where(s),
                  "shape key 'causal' must be true or false, got ", s.attrs.at("causal").dump());
      TORCH_CHECK(!s.causal() || (nd >= 2 && d == nd - 1), where(s),
                  "a causal softmax normalises the last dimension of an input of 2 or more");
    }
    if (s.attrs.contains("query_group")) {
      TORCH_CHECK(s.causal() && s.queryGroup() > 0 && s.input[nd - 2] % s.queryGroup() == 0,
                  where(s),
                  "shape key 'query_group' (queries per position, grouped-query "
                  "attention's) must divide the rows of a causal softmax, got ",
                  s.attrs.at("query_group").dump());
    }
  } else if (s.op == "view" || s.op == "reshape") {
    viewShape(s);
  } else if (s.op == "getitem") {
    getitemRange(s);
  } else if (s.op == "permute" || s.op == "transpose") {
    permuteDims(s);
  } else if (s.op == "split") {
    normDim(s, s.attrInt("dim"), nd, "dim");
    TORCH_CHECK(s.attrInt("split_size") > 0, where(s), "shape key 'split_size' must be positive");
  } else if (s.op == "sum") {
    for (int64_t d : s.attrDims("dims")) normDim(s, d, nd, "dims");
  }
  return s;
}

int64_t OpShape::attrInt(const std::string& key) const {
  TORCH_CHECK(attrs.contains(key) && attrs.at(key).is_number_integer(), where(*this), "shape key '",
              key, "' must be an integer",
              attrs.contains(key) ? ", got " + attrs.at(key).dump() : " (it is missing)");
  return attrs.at(key).get<int64_t>();
}

int64_t OpShape::stride() const {
  if (attrs.contains("stride")) return attrInt("stride");
  return op == "conv2d" ? 1 : kernel();
}

int64_t OpShape::padding() const { return attrs.contains("padding") ? attrInt("padding") : 0; }

double OpShape::scale() const { return attrs.contains("scale") ? attrDouble("scale") : 1.0; }

bool OpShape::causal() const { return attrs.value("causal", false); }

double OpShape::theta() const { return attrs.contains("theta") ? attrDouble("theta") : 10000.0; }

int64_t OpShape::queryGroup() const {
  return attrs.contains("query_group") ? attrInt("query_group") : 1;
}

at::Tensor attentionSoftmax(const at::Tensor& x, int64_t dim, double scale, bool causal,
                            int64_t rowOffset, int64_t queryGroup) {
  at::Tensor z = scale == 1.0 ? x : x * scale;
  if (causal) {
    // Key j is hidden from query i (row rowOffset + i of the whole tensor) when j > i; with
    // grouped queries, row r is position r / queryGroup.
    const auto opts = x.options().dtype(at::kLong);
    at::Tensor rows = at::arange(rowOffset, rowOffset + x.size(-2), opts);
    if (queryGroup > 1) rows = rows.div(queryGroup, "floor");
    const at::Tensor cols = at::arange(x.size(-1), opts);
    z = z.masked_fill(cols.unsqueeze(0) > rows.unsqueeze(1),
                      -std::numeric_limits<double>::infinity());
  }
  return at::softmax(z, dim);
}

double OpShape::attrDouble(const std::string& key) const {
  TORCH_CHECK(attrs.contains(key) && attrs.at(key).is_number(), where(*this), "shape key '", key,
              "' must be a number", attrs.contains(key) ? ", got " + attrs.at(key).dump() : "");
  return attrs.at(key).get<double>();
}

std::vector<int64_t> OpShape::attrDims(const std::string& key) const {
  TORCH_CHECK(attrs.contains(key), where(*this), "shape key '", key, "' is missing");
  const auto& v = attrs.at(key);
  TORCH_CHECK(v.is_array() && !v.empty(), where(*this), "shape key '", key,
              "' must be a non-empty list of integers, got ", v.dump());
  std::vector<int64_t> out;
  for (const auto& d : v) {
    TORCH_CHECK(d.is_number_integer(), where(*this), "shape key '", key,
                "' must hold integers, got ", v.dump());
    out.push_back(d.get<int64_t>());
  }
  return out;
}

std::vector<std::string> OpShape::operands() const {
  if (op == "aten") {
    std::vector<std::string> names = {"input"};
    const size_t n = attrs.at("operands").size();
    if (n > 1) names.push_back("other");
    for (size_t i = 2; i < n; ++i) names.push_back("arg" + std::to_string(i));
    return names;
  }
  std::vector<std::string> names = {"input"};
  if (!other.empty()) names.push_back("other");
  if (!weight.empty()) names.push_back("weight");
  if (!bias.empty()) names.push_back("bias");
  return names;
}

const std::vector<int64_t>& OpShape::operandShape(const std::string& name) const {
  if (name == "input") return input;
  if (name == "other") return other;
  if (name == "weight") return weight;
  if (op == "aten" && name.rfind("arg", 0) == 0) return extra.at(std::stoul(name.substr(3)) - 2);
  TORCH_CHECK(name == "bias", "no operand ", name);
  return bias;
}

bool OpShape::differentiable(const std::string& name) const {
  if (op == "aten") {
    const auto names = operands();
    return atenOperandFloating(
        *this, static_cast<size_t>(std::find(names.begin(), names.end(), name) - names.begin()));
  }
  return !(op == "embedding" && name == "input");
}

std::vector<std::vector<int64_t>> OpShape::outputs() const {
  const int64_t nd = static_cast<int64_t>(input.size());
  if (op == "aten") return atenOutputs(*this);
  if (op == "addmm" || op == "mm") return {{input[0], other[1]}};
  if (op == "bmm") return {{input[0], input[1], other[2]}};
  if (op == "matmul") {
    if (nd == 4) return {{input[0], input[1], input[2], other[3]}};
    return {nd == 1 ? std::vector<int64_t>{} : std::vector<int64_t>{input[0]}};
  }
  if (op == "contiguous") return {input};
  if (op == "embedding") {
    auto o = input;
    o.push_back(weight[1]);
    return {o};
  }
  if (op == "conv2d") {
    const int64_t k = kernel(), st = stride(), p = padding();
    return {{input[0], weight[0], convOut(input[2], k, st, p), convOut(input[3], k, st, p)}};
  }
  if (op == "max_pool2d" || op == "avg_pool2d") {
    const int64_t k = kernel(), st = stride();
    return {{input[0], input[1], convOut(input[2], k, st, 0), convOut(input[3], k, st, 0)}};
  }
  if (op == "add" || op == "mul") return {broadcastShape(*this)};
  if (op == "view" || op == "reshape") return {viewShape(*this)};
  if (op == "getitem") {
    auto o = input;
    const auto [start, stop] = getitemRange(*this);
    if (attrs.at("index").is_number_integer()) {
      o.erase(o.begin());
    } else {
      o[0] = stop - start;
    }
    return {o};
  }
  if (op == "permute" || op == "transpose") {
    std::vector<int64_t> o;
    for (int64_t d : permuteDims(*this)) o.push_back(input[d]);
    return {o};
  }
  if (op == "split") {
    const int64_t d = normDim(*this, attrInt("dim"), nd, "dim"), size = attrInt("split_size");
    std::vector<std::vector<int64_t>> outs;
    for (int64_t b = 0; b < input[d]; b += size) {
      auto o = input;
      o[d] = std::min(size, input[d] - b);
      outs.push_back(o);
    }
    return outs;
  }
  if (op == "sum") {
    const auto dims = reducedDims();
    std::vector<int64_t> o;
    for (int64_t d = 0; d < nd; ++d) {
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) o.push_back(input[d]);
    }
    return {o};
  }
  return {input};  // layer_norm, batch_norm, gelu, relu, dropout, softmax
}

std::vector<std::string> OpShape::outputNames() const {
  const size_t n = outputs().size();
  if (op != "split" && (op != "aten" || n == 1)) return {"output"};
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i) names.push_back("output" + std::to_string(i));
  return names;
}

std::vector<int64_t> OpShape::permutation() const { return permuteDims(*this); }

std::pair<int64_t, int64_t> OpShape::rows() const { return getitemRange(*this); }

std::vector<int64_t> OpShape::reducedDims() const {
  const int64_t nd = static_cast<int64_t>(input.size());
  if (op == "softmax") return {normDim(*this, attrInt("dim"), nd, "dim")};
  if (op == "layer_norm" || op == "rms_norm" || op == "rope") return {nd - 1};
  if (op == "sum") {
    std::vector<int64_t> dims;
    for (int64_t d : attrDims("dims")) dims.push_back(normDim(*this, d, nd, "dims"));
    std::sort(dims.begin(), dims.end());
    dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
    return dims;
  }
  if (op == "split") return {normDim(*this, attrInt("dim"), nd, "dim")};
  if (op == "getitem") return {0};  // the indexed dimension
  return {};
}

std::string OpShape::toString() const {
  if (op == "aten") {  // its arguments are data, not a shape: the operator and its operands
    std::string s = "op=aten;schema=" + attrs.at("schema").get<std::string>() + ";operands=";
    for (const auto& name : operands()) {
      s += (name == "input" ? "" : ",") + dimsString(operandShape(name));
    }
    return s;
  }
  std::string s = "op=" + op + ";input=" + dimsString(input);
  if (!other.empty()) s += ";other=" + dimsString(other);
  for (auto it = attrs.begin(); it != attrs.end(); ++it) {
    if (it.value().is_array()) {
      std::string dims;
      for (const auto& d : it.value()) dims += (dims.empty() ? "" : "x") + d.dump();
      s += ";" + it.key() + "=" + dims;
    } else {
      s += ";" + it.key() + "=" + it.value().dump();
    }
  }
  return s;
}

}  // namespace sb::reference
