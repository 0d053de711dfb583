#include "strategies/sharding/layout/placement.h"

#include <algorithm>
#include <cctype>
#include <set>

namespace sb::harness {
namespace {

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::string stripSpaces(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (!std::isspace(static_cast<unsigned char>(ch))) out += ch;
  }
  return out;
}

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw LayoutError("layout '" + text + "': " + why);
}

bool allDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
}

std::vector<int> digitsToAxes(const std::string& digits) {
  std::vector<int> axes;
  for (char c : digits) axes.push_back(c - '0');
  return axes;
}

// Splits "[a, b, c]" into its entries (the brackets already removed).
std::vector<std::string> splitEntries(const std::string& inner) {
  std::vector<std::string> out;
  int depth = 0;
  std::string cur;
  for (char c : inner) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty() || !out.empty()) out.push_back(cur);
  return out;
}

// ColossalAI's compact sequence: "RS01R" then pending-sum tokens "P1". Returns false if the text
// is not of that form at all.
bool parseCompact(const std::string& text, const std::string& s, std::vector<std::string>& dims,
                  std::string& partial) {
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == 'R') {
      dims.push_back("R");
      ++i;
    } else if (s[i] == 'S' || s[i] == 'P') {
      const char kind = s[i];
      size_t j = i + 1;
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      if (j == i + 1) return false;
      if (kind == 'S') {
        if (!partial.empty()) bad(text, "a shard entry after the pending sums");
        dims.push_back(s.substr(i, j - i));
      } else {
        partial += s.substr(i + 1, j - i - 1);
      }
      i = j;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string Placement::toString() const {
  switch (kind) {
    case Kind::kReplicate:
      return "Replicate()";
    case Kind::kShard:
      return "Shard(" + std::to_string(dim) + ")";
    case Kind::kPartial:
      return "Partial(sum)";
  }
  return "?";
}

Layout::Layout(std::vector<std::vector<int>> dimAxes, std::vector<int> partialAxes)
    : dimAxes_(std::move(dimAxes)), partialAxes_(std::move(partialAxes)) {
  std::sort(partialAxes_.begin(), partialAxes_.end());
  std::set<int> used;
  auto use = [&](int a) {
    if (a < 0) throw LayoutError("layout " + sequence() + ": negative mesh axis");
    if (!used.insert(a).second) {
      throw LayoutError("layout " + sequence() + ": mesh axis " + std::to_string(a) +
                        " is used twice");
    }
  };
  for (const auto& axes : dimAxes_) {
    for (int a : axes) use(a);
  }
  for (int a : partialAxes_) use(a);
}

Layout Layout::fromPlacements(const std::vector<Placement>& placements, int ndim) {
  std::vector<std::vector<int>> dimAxes(ndim);
  std::vector<int> partial;
  for (size_t a = 0; a < placements.size(); ++a) {
    const Placement& p = placements[a];
    if (p.kind == Placement::Kind::kShard) {
      if (p.dim < 0 || p.dim >= ndim) {
        throw LayoutError("Shard(" + std::to_string(p.dim) + ") on mesh axis " + std::to_string(a) +
                          ": the tensor has dimensions 0.." + std::to_string(ndim - 1));
      }
      dimAxes[p.dim].push_back(static_cast<int>(a));
    } else if (p.kind == Placement::Kind::kPartial) {
      partial.push_back(static_cast<int>(a));
    }
  }
  return Layout(std::move(dimAxes), std::move(partial));
}

Layout Layout::parse(const std::string& original, int ndim, int meshNdim) {
  const std::string text = trim(original);
  if (text.empty()) bad(original, "empty");
  const std::string s = stripSpaces(text);
  std::vector<std::string> entries;
  std::string partialDigits;
  bool bracketed = s.front() == '[';
  if (bracketed) {
    const auto close = s.find(']');
    if (close == std::string::npos) bad(text, "missing ']'");
    entries = splitEntries(s.substr(1, close - 1));
    std::string rest = s.substr(close + 1);
    if (!rest.empty() && rest.front() == '+') rest = rest.substr(1);
    while (!rest.empty()) {
      if (rest.front() != 'P') bad(text, "after ']' only pending sums such as 'P1' may follow");
      size_t j = 1;
      while (j < rest.size() && std::isdigit(static_cast<unsigned char>(rest[j]))) ++j;
      if (j == 1) bad(text, "'P' after ']' needs the mesh axes it is pending on, e.g. 'P1'");
      partialDigits += rest.substr(1, j - 1);
      rest = rest.substr(j);
    }
  } else if (!parseCompact(text, s, entries, partialDigits)) {
    bad(text,
        "expected DTensor placements such as [Shard(0), Replicate()] or a sharding "
        "sequence such as [S01, R, R] or S01RR");
  }

  // DTensor's spelling names a placement per mesh axis; ColossalAI's an entry per dimension.
  bool dtensorForm = false;
  bool allR = !entries.empty();
  for (const auto& e : entries) {
    if (e.rfind("Shard(", 0) == 0 || e.rfind("S(", 0) == 0 || e.rfind("Partial", 0) == 0 ||
        e == "P" || e == "Replicate()") {
      dtensorForm = true;
    }
    allR = allR && e == "R";
  }
  // "[R, R]" is a replicated layout in either spelling: one entry per dimension or per axis.
  if (allR && partialDigits.empty() && static_cast<int>(entries.size()) == meshNdim &&
      meshNdim != ndim) {
    return Layout(ndim);
  }
  if (dtensorForm) {
    if (!partialDigits.empty()) bad(text, "mixes DTensor placements with a 'P<axes>' suffix");
    if (static_cast<int>(entries.size()) != meshNdim) {
      bad(text, "has " + std::to_string(entries.size()) + " placements but the mesh has " +
                    std::to_string(meshNdim) + " axes");
    }
    std::vector<Placement> placements;
    for (const auto& e : entries) {
      if (e == "R" || e == "Replicate()") {
        placements.push_back(Placement::replicate());
      } else if (e == "P" || e == "Partial()" || e == "Partial(sum)") {
        placements.push_back(Placement::partial());
      } else {
        std::string inner;
        if (e.rfind("Shard(", 0) == 0 && e.back() == ')') inner = e.substr(6, e.size() - 7);
        if (e.rfind("S(", 0) == 0 && e.back() == ')') inner = e.substr(2, e.size() - 3);
        if (!allDigits(inner)) {
          bad(text, "'" + e + "' is not a placement (Shard(d), Replicate(), Partial(sum))");
        }
        // Any dimension past the tensor's is refused; say so without parsing a number that
        // does not fit an int.
        const int d = inner.size() > 6 ? ndim : std::stoi(inner);
        if (d >= ndim) {
          bad(text, "'" + e + "' shards dimension " + inner + " but the tensor has " +
                        std::to_string(ndim) + " dimensions");
        }
        placements.push_back(Placement::shard(d));
      }
    }
    try {
      return fromPlacements(placements, ndim);
    } catch (const LayoutError& e) {
      bad(text, e.what());
    }
  }

  if (static_cast<int>(entries.size()) != ndim) {
    bad(text, "has " + std::to_string(entries.size()) + " entries but the tensor has " +
                  std::to_string(ndim) + " dimensions");
  }
  std::vector<std::vector<int>> dimAxes(ndim);
  for (int d = 0; d < ndim; ++d) {
    const std::string& e = entries[d];
    if (e == "R") continue;
    if (e.size() < 2 || e[0] != 'S' || !allDigits(e.substr(1))) {
      bad(text, "'" + e + "' is not a sharding sequence entry (R, S0, S01, ...)");
    }
    dimAxes[d] = digitsToAxes(e.substr(1));
  }
  std::vector<int> partial = digitsToAxes(partialDigits);
  for (const auto& axes : dimAxes) {
    for (int a : axes) {
      if (a >= meshNdim) {
        bad(text, "uses mesh axis " + std::to_string(a) + " but the mesh has " +
                      std::to_string(meshNdim) + " axes");
      }
    }
  }
  for (int a : partial) {
    if (a >= meshNdim) {
      bad(text, "has sums pending on mesh axis " + std::to_string(a) + " but the mesh has " +
                    std::to_string(meshNdim) + " axes");
    }
  }
  try {
    return Layout(std::move(dimAxes), std::move(partial));
  } catch (const LayoutError& e) {
    bad(text, std::string(e.what()).substr(std::string(e.what()).find(':') + 2));
  }
}

bool Layout::isPartial(int axis) const {
  return std::binary_search(partialAxes_.begin(), partialAxes_.end(), axis);
}

int Layout::shardDimOf(int axis) const {
  for (int d = 0; d < ndim(); ++d) {
    for (int a : dimAxes_[d]) {
      if (a == axis) return d;
    }
  }
  return -1;
}

int Layout::maxAxis() const {
  int m = -1;
  for (const auto& axes : dimAxes_) {
    for (int a : axes) m = std::max(m, a);
  }
  for (int a : partialAxes_) m = std::max(m, a);
  return m;
}

std::vector<Placement> Layout::placements(int meshNdim) const {
  std::vector<Placement> p(meshNdim, Placement::replicate());
  for (int d = 0; d < ndim(); ++d) {
    for (int a : dimAxes_[d]) p.at(a) = Placement::shard(d);
  }
  for (int a : partialAxes_) p.at(a) = Placement::partial();
  return p;
}

bool Layout::meshOrdered() const {
  for (const auto& axes : dimAxes_) {
    if (!std::is_sorted(axes.begin(), axes.end())) return false;
  }
  return true;
}

std::string Layout::sequence() const {
  std::string s = "[";
  for (int d = 0; d < ndim(); ++d) {
    if (d) s += ", ";
    if (dimAxes_[d].empty()) {
      s += "R";
    } else {
      s += "S";
      for (int a : dimAxes_[d]) s += std::to_string(a);
    }
  }
  s += "]";
  if (!partialAxes_.empty()) {
    s += " P";
    for (int a : partialAxes_) s += std::to_string(a);
  }
  return s;
}

std::string Layout::compact() const {
  std::string s;
  for (const auto& axes : dimAxes_) {
    if (axes.empty()) {
      s += "R";
    } else {
      s += "S";
      for (int a : axes) s += std::to_string(a);
    }
  }
  if (!partialAxes_.empty()) {
    s += "P";
    for (int a : partialAxes_) s += std::to_string(a);
  }
  return s;
}

std::string Layout::dtensor(int meshNdim) const {
  if (!meshOrdered()) {
    throw LayoutError("layout " + sequence() +
                      " nests shards out of mesh order, which DTensor's placements cannot say");
  }
  std::string s = "[";
  const auto p = placements(meshNdim);
  for (size_t a = 0; a < p.size(); ++a) s += (a ? ", " : "") + p[a].toString();
  return s + "]";
}

Layout Layout::dual(int meshNdim) const {
  std::vector<int> partial;
  for (int a = 0; a < meshNdim; ++a) {
    if (!isPartial(a) && shardDimOf(a) < 0) partial.push_back(a);
  }
  return Layout(dimAxes_, partial);
}

std::pair<int64_t, int64_t> nestedChunk(int64_t length, const std::vector<int64_t>& extents,
                                        const std::vector<int64_t>& indices) {
  int64_t offset = 0;
  for (size_t i = 0; i < extents.size(); ++i) {
    const auto sizes = chunkSizes(length, extents[i]);
    const auto offsets = chunkOffsets(length, extents[i]);
    offset += offsets[indices[i]];
    length = sizes[indices[i]];
  }
  return {offset, length};
}

Box Layout::box(const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh,
                const std::vector<int64_t>& coords) const {
  Box b;
  for (int d = 0; d < ndim(); ++d) {
    std::vector<int64_t> extents, indices;
    for (int a : dimAxes_[d]) {
      extents.push_back(mesh.at(a));
      indices.push_back(coords.at(a));
    }
    const auto [off, len] = nestedChunk(shape[d], extents, indices);
    b.offset.push_back(off);
    b.length.push_back(len);
  }
  return b;
}

std::vector<Layout> enumerateLayouts(int ndim, int meshNdim, int maxPartial) {
  // Each axis is replicated (0), partial (1) or shards dimension k (2 + k).
  const int choices = 2 + ndim;
  std::vector<Layout> out;
  std::vector<int> pick(meshNdim, 0);
  int64_t total = 1;
  for (int a = 0; a < meshNdim; ++a) total *= choices;
  for (int64_t code = 0; code < total; ++code) {
    int64_t c = code;
    int partials = 0;
    // The first mesh axis varies slowest, so [R, ...] layouts come first.
    for (int a = meshNdim - 1; a >= 0; --a) {
      pick[a] = static_cast<int>(c % choices);
      c /= choices;
      if (pick[a] == 1) ++partials;
    }
    if (partials > maxPartial) continue;
    std::vector<Placement> p;
    for (int a = 0; a < meshNdim; ++a) {
      p.push_back(pick[a] == 0   ? Placement::replicate()
                  : pick[a] == 1 ? Placement::partial()
                                 : Placement::shard(pick[a] - 2));
    }
    out.push_back(Layout::fromPlacements(p, ndim));
  }
  return out;
}

}  // namespace sb::harness
