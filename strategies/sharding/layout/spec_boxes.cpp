// Boxes from sharding specifications as text (see spec_boxes.h). Deliberately free of the
// Layout / ShardingSpec code and of harness/box.h's chunk helpers: it is the independent side
// of the runner's layout check.

#include "strategies/sharding/layout/spec_boxes.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>
#include <tuple>

namespace sb::harness {
namespace {

std::string trimmed(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// One item, "R" or "S" and its axes' digits; nullopt otherwise.
std::optional<std::vector<int>> parseItem(const std::string& item) {
  if (item == "R") return std::vector<int>{};
  if (item.size() < 2 || item[0] != 'S') return std::nullopt;
  std::vector<int> axes;
  for (size_t i = 1; i < item.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(item[i]))) return std::nullopt;
    axes.push_back(item[i] - '0');
  }
  return axes;
}

// torch.chunk's cut of n into `parts`: chunk i starts at min(n, i * ceil(n / parts)) and holds
// what is left of its ceil(n / parts), possibly nothing (PyTorch's get_split_size and
// get_chunked_dim_size).
std::pair<int64_t, int64_t> chunkOf(int64_t n, int64_t parts, int64_t i) {
  const int64_t split = (n + parts - 1) / parts;
  const int64_t start = std::min(n, split * i);
  const int64_t end = std::min(n, split * (i + 1));
  return {start, std::max<int64_t>(end - start, 0)};
}

std::string bracketed(const DimAxes& dims) {
  std::string s = "[";
  for (size_t d = 0; d < dims.size(); ++d) {
    s += d ? ", " : "";
    if (dims[d].empty()) {
      s += "R";
    } else {
      s += "S";
      for (int a : dims[d]) s += std::to_string(a);
    }
  }
  return s + "]";
}

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument(what); }

// A Linear name's operand, compact and logical (two dimensions).
DimAxes logicalOperand(const std::string& name, const std::string& text, const char* operand) {
  auto dims = parseColossalSequence(text);
  if (!dims || dims->size() != 2) {
    fail("ColossalAI Linear strategy `" + name + "`: its " + operand + " `" + text +
         "` is not a two-dimensional sharding sequence");
  }
  return *dims;
}

}  // namespace

std::optional<DimAxes> parseColossalSequence(const std::string& sequence) {
  const std::string text = trimmed(sequence);
  DimAxes dims;
  if (!text.empty() && text.front() == '[') {
    if (text.back() != ']') return std::nullopt;
    const std::string inner = text.substr(1, text.size() - 2);
    size_t start = 0;
    while (true) {
      const size_t comma = inner.find(',', start);
      std::string item = trimmed(inner.substr(start, comma - start));
      if (item.size() >= 2 && (item.front() == '"' || item.front() == '\'') &&
          item.back() == item.front()) {
        item = item.substr(1, item.size() - 2);
      }
      auto axes = parseItem(item);
      if (!axes) return std::nullopt;
      dims.push_back(*axes);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else {
    // Compact: each item starts with R or S; an S takes the digits after it.
    size_t i = 0;
    while (i < text.size()) {
      size_t j = i + 1;
      if (text[i] == 'S') {
        while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
      }
      auto axes = parseItem(text.substr(i, j - i));
      if (!axes) return std::nullopt;
      dims.push_back(*axes);
      i = j;
    }
  }
  if (dims.empty()) return std::nullopt;
  std::set<int> used;
  for (const auto& axes : dims) {
    for (int a : axes) {
      if (!used.insert(a).second) return std::nullopt;
    }
  }
  return dims;
}

Box colossalSequenceBox(const std::string& sequence, at::IntArrayRef shape,
                        const std::vector<int64_t>& mesh, int rank) {
  const auto dims = parseColossalSequence(sequence);
  if (!dims) fail("`" + sequence + "` is not a ColossalAI sharding sequence");
  if (dims->size() != shape.size()) {
    fail("sharding sequence `" + sequence + "` has " + std::to_string(dims->size()) +
         " dimensions but the tensor has " + std::to_string(shape.size()));
  }
  int64_t ranks = 1;
  for (int64_t m : mesh) ranks *= m;
  if (rank < 0 || rank >= ranks) {
    fail("rank " + std::to_string(rank) + " is not on a mesh of " + std::to_string(ranks));
  }
  // Row-major: the last axis varies fastest.
  std::vector<int64_t> coord(mesh.size());
  for (int64_t a = static_cast<int64_t>(mesh.size()) - 1, r = rank; a >= 0; --a) {
    coord[a] = r % mesh[a];
    r /= mesh[a];
  }
  Box box{std::vector<int64_t>(shape.size(), 0), shape.vec()};
  for (size_t d = 0; d < dims->size(); ++d) {
    int64_t parts = 1, shard = 0;
    for (int a : (*dims)[d]) {
      if (a >= static_cast<int>(mesh.size())) {
        fail("sharding sequence `" + sequence + "` splits over mesh axis " + std::to_string(a) +
             " but the mesh has " + std::to_string(mesh.size()) + " axes");
      }
      shard = shard * mesh[a] + coord[a];
      parts *= mesh[a];
    }
    std::tie(box.offset[d], box.length[d]) = chunkOf(shape[d], parts, shard);
  }
  return box;
}

ColossalLinearSequences colossalLinearSequences(const std::string& name, int64_t inputDims) {
  const size_t eq = name.find('=');
  const size_t times = name.find(" x ");
  if (eq == std::string::npos || times == std::string::npos || times < eq) {
    fail("`" + name + "` is not a ColossalAI Linear strategy name (OUT = IN x OTHER)");
  }
  std::string other = trimmed(name.substr(times + 3));
  std::optional<int64_t> batchDim;
  if (const size_t us = other.find('_'); us != std::string::npos) {
    const std::string digits = other.substr(us + 1);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char ch) {
          return std::isdigit(static_cast<unsigned char>(ch));
        })) {
      fail("ColossalAI Linear strategy `" + name + "`: `_" + digits +
           "` is not a physical dimension");
    }
    batchDim = std::stoll(digits);
    other = other.substr(0, us);
  }
  const DimAxes out = logicalOperand(name, trimmed(name.substr(0, eq)), "output");
  const DimAxes in = logicalOperand(name, trimmed(name.substr(eq + 1, times - eq - 1)), "input");
  const DimAxes oth = logicalOperand(name, other, "other (the weight transposed)");
  if (inputDims < 1) fail("a Linear input needs a dimension");
  // Where M's axes land: the suffix's dimension, or the only leading one of a 2-D input.
  const auto mDim = [&](const std::vector<int>& mAxes) -> int64_t {
    if (mAxes.empty()) return -1;
    const int64_t d = batchDim ? *batchDim : (inputDims == 2 ? 0 : -1);
    if (d < 0 || d >= inputDims - 1) {
      fail("ColossalAI Linear strategy `" + name + "` splits the batch, but " +
           (batchDim ? "dimension " + std::to_string(d) + " is not a leading dimension of"
                     : std::string("no `_d` suffix says which dimension of")) +
           " a " + std::to_string(inputDims) + "-D input");
    }
    return d;
  };
  const auto physical = [&](const std::vector<int>& m, const std::vector<int>& last) {
    DimAxes p(inputDims);
    if (const int64_t d = mDim(m); d >= 0) p[d] = m;
    p[inputDims - 1] = last;
    return bracketed(p);
  };
  ColossalLinearSequences s;
  s.input = physical(in[0], in[1]);
  s.output = physical(out[0], out[1]);
  s.weight = bracketed({oth[1], oth[0]});
  s.bias = bracketed({oth[1]});
  return s;
}

std::optional<ChunkSpec> parseChunkShardingSpec(const std::string& text) {
  const size_t open = text.find('(');
  const size_t close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return std::nullopt;
  const std::string head = trimmed(text.substr(0, open));
  if (!head.empty() && head != "ChunkShardingSpec") return std::nullopt;
  const std::string body = text.substr(open + 1, close - open - 1);
  const size_t dimAt = body.find("dim=");
  const size_t lb = body.find('['), rb = body.find(']');
  if (dimAt == std::string::npos || lb == std::string::npos || rb == std::string::npos || rb < lb ||
      dimAt > lb) {
    return std::nullopt;
  }
  ChunkSpec spec;
  size_t used = 0;
  const std::string dimText = trimmed(body.substr(dimAt + 4, lb - dimAt - 4));
  try {
    spec.dim = std::stoll(dimText, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  // After the number only the separator, and perhaps "placements=", may come.
  std::string rest = trimmed(dimText.substr(used));
  if (rest.empty() || rest.front() != ',') return std::nullopt;
  rest = trimmed(rest.substr(1));
  if (!rest.empty() && rest != "placements=") return std::nullopt;
  const std::string list = body.substr(lb + 1, rb - lb - 1);
  size_t start = 0;
  while (true) {
    const size_t comma = list.find(',', start);
    std::string item = trimmed(list.substr(start, comma - start));
    if (item.size() >= 2 && (item.front() == '"' || item.front() == '\'') &&
        item.back() == item.front()) {
      item = item.substr(1, item.size() - 2);
    }
    if (item.rfind("rank:", 0) == 0) item = item.substr(5, item.find('/') - 5);
    if (item.empty() || !std::all_of(item.begin(), item.end(), [](char ch) {
          return std::isdigit(static_cast<unsigned char>(ch));
        })) {
      return std::nullopt;
    }
    spec.placements.push_back(std::stoi(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return spec;
}

Box chunkSpecBox(int64_t dim, const std::vector<int>& placements, at::IntArrayRef shape, int rank) {
  if (dim < 0 || dim >= static_cast<int64_t>(shape.size())) {
    fail("ChunkShardingSpec(dim=" + std::to_string(dim) + ") on a tensor of " +
         std::to_string(shape.size()) + " dimensions");
  }
  const auto it = std::find(placements.begin(), placements.end(), rank);
  if (it == placements.end()) {
    fail("rank " + std::to_string(rank) + " holds no chunk: it is not among the placements");
  }
  Box box{std::vector<int64_t>(shape.size(), 0), shape.vec()};
  std::tie(box.offset[dim], box.length[dim]) =
      chunkOf(shape[dim], static_cast<int64_t>(placements.size()), it - placements.begin());
  return box;
}

}  // namespace sb::harness
