#include "harness/suite.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "harness/mesh.h"

namespace sb::harness {
namespace {

int lineOf(const YAML::Node& n) { return n.Mark().line + 1; }

[[noreturn]] void fail(const std::string& file, const YAML::Node& n, const std::string& msg) {
  throw InputError(file + ":" + std::to_string(lineOf(n)) + ": " + msg);
}

std::string scalar(const std::string& file, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) fail(file, n, "key '" + key + "' must be a single value");
  return n.Scalar();
}

template <class T>
T number(const std::string& file, const YAML::Node& n, const std::string& key,
         const std::string& expected) {
  if (!n.IsScalar()) fail(file, n, "key '" + key + "' must be " + expected);
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    fail(file, n, "key '" + key + "' must be " + expected + ", got '" + n.Scalar() + "'");
  }
}

nlohmann::json toJson(const std::string& file, const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json j = nlohmann::json::object();
      for (const auto& kv : n) j[kv.first.Scalar()] = toJson(file, kv.second);
      return j;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& v : n) j.push_back(toJson(file, v));
      return j;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = n.Scalar();
      if (s == "true" || s == "false") return s == "true";
      try {
        size_t used = 0;
        long long v = std::stoll(s, &used);
        if (used == s.size()) return v;
        double d = std::stod(s, &used);
        if (used == s.size()) return d;
      } catch (const std::exception&) {
      }
      return s;
    }
    default:
      return nullptr;
  }
}

const std::set<std::string> kCaseKeys = {
    "name",        "workload",   "shape",   "mesh",   "dtype",      "inputs", "seed",
    "repetitions", "min_time_s", "backend", "device", "strategies", "params", "sweep"};

std::string keyList(const std::set<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

// Applies the keys of `node` (a defaults block or a case) onto `c`.
void applyKeys(const std::string& file, const YAML::Node& node, CaseSpec& c) {
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (!kCaseKeys.count(key)) {
      fail(file, kv.first,
           "unknown key '" + key + "' (expected one of: " + keyList(kCaseKeys) + ")");
    }
    if (key == "name") {
      c.name = scalar(file, v, key);
    } else if (key == "workload") {
      c.workload = scalar(file, v, key);
      if (!reference::findWorkload(c.workload)) {
        std::string known;
        for (const auto& w : reference::workloadNames()) known += (known.empty() ? "" : ", ") + w;
        fail(file, v, "unknown workload '" + c.workload + "' (known: " + known + ")");
      }
    } else if (key == "shape") {
      if (!v.IsMap()) fail(file, v, "key 'shape' must be a mapping of shape parameters");
      c.shape = toJson(file, v);
    } else if (key == "mesh") {
      std::vector<int64_t> mesh;
      if (v.IsSequence()) {
        for (const auto& d : v) mesh.push_back(number<int64_t>(file, d, key, "a positive integer"));
      } else {
        try {
          mesh = DeviceMesh::parseShape(scalar(file, v, key));
        } catch (const std::exception&) {
          fail(file, v, "key 'mesh' must look like 2x2, 4 or [2, 2], got '" + v.Scalar() + "'");
        }
      }
      if (mesh.empty()) fail(file, v, "key 'mesh' needs at least one axis");
      int64_t n = 1;
      for (int64_t d : mesh) {
        if (d <= 0) fail(file, v, "key 'mesh' must have positive extents");
        n *= d;
      }
      if (n > 64) fail(file, v, "key 'mesh' has " + std::to_string(n) + " ranks; at most 64");
      c.mesh = mesh;
    } else if (key == "dtype") {
      try {
        c.dtype = parseDtype(scalar(file, v, key));
      } catch (const std::exception& e) {
        fail(file, v, e.what());
      }
    } else if (key == "inputs") {
      const std::string s = scalar(file, v, key);
      if (s == "random") {
        c.inputs = reference::InputMode::kRandom;
      } else if (s == "exact") {
        c.inputs = reference::InputMode::kExact;
      } else {
        fail(file, v, "key 'inputs' must be random or exact, got '" + s + "'");
      }
    } else if (key == "seed") {
      c.seed = number<uint64_t>(file, v, key, "a non-negative integer");
    } else if (key == "repetitions") {
      c.repetitions = number<int>(file, v, key, "a positive integer");
      if (c.repetitions < 1) fail(file, v, "key 'repetitions' must be at least 1");
    } else if (key == "min_time_s") {
      c.minTimeSec = number<double>(file, v, key, "a number of seconds");
      if (!(c.minTimeSec > 0)) fail(file, v, "key 'min_time_s' must be positive");
    } else if (key == "backend") {
      c.backend = scalar(file, v, key);
    } else if (key == "device") {
      c.device = scalar(file, v, key);
      if (c.device != "cpu") {
        fail(file, v, "key 'device' must be cpu in this build (got '" + c.device + "')");
      }
    } else if (key == "params") {
      if (!v.IsMap()) fail(file, v, "key 'params' must be a mapping of strategy parameters");
      for (const auto& kv : v) c.params[kv.first.Scalar()] = toJson(file, kv.second);
    } else if (key == "sweep") {
      if (!v.IsMap() || v.size() == 0) {
        fail(file, v, "key 'sweep' must map parameter names to lists of values");
      }
      for (const auto& kv : v) {
        if (!kv.second.IsSequence() || kv.second.size() == 0) {
          fail(file, kv.second,
               "key 'sweep': '" + kv.first.Scalar() + "' must be a non-empty list");
        }
      }
    } else if (key == "strategies") {
      c.strategies.clear();
      if (v.IsScalar()) {
        c.strategies.push_back(v.Scalar());
      } else if (v.IsSequence()) {
        for (const auto& s : v) c.strategies.push_back(scalar(file, s, key));
      } else {
        fail(file, v, "key 'strategies' must be a list of strategy ids or regular expressions");
      }
    }
  }
}

}  // namespace

Suite parseSuite(const std::string& text, const std::string& file) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(file + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) throw InputError(file + ":1: a suite must be a mapping with a 'cases' list");

  Suite suite;
  suite.file = file;
  suite.name = std::filesystem::path(file).stem().string();
  CaseSpec defaults;
  defaults.file = file;
  const std::set<std::string> topKeys = {"suite", "description", "defaults", "cases"};
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    if (!topKeys.count(key)) {
      fail(file, kv.first,
           "unknown top-level key '" + key + "' (expected one of: " + keyList(topKeys) + ")");
    }
  }
  if (root["suite"]) suite.name = scalar(file, root["suite"], "suite");
  if (root["description"]) suite.description = scalar(file, root["description"], "description");
  if (root["defaults"]) {
    if (!root["defaults"].IsMap()) fail(file, root["defaults"], "'defaults' must be a mapping");
    applyKeys(file, root["defaults"], defaults);
  }
  const YAML::Node cases = root["cases"];
  if (!cases) throw InputError(file + ":1: key 'cases' is missing (a list of cases)");
  if (!cases.IsSequence() || cases.size() == 0)
    fail(file, cases, "'cases' must be a non-empty list");

  std::set<std::string> names;
  for (const auto& node : cases) {
    if (!node.IsMap()) fail(file, node, "each case must be a mapping");
    CaseSpec c = defaults;
    c.suite = suite.name;
    c.line = lineOf(node);
    applyKeys(file, node, c);
    for (const char* required : {"name", "workload", "shape", "mesh", "strategies"}) {
      bool have = node[required] || (root["defaults"] && root["defaults"][required]);
      if (!have) fail(file, node, std::string("case is missing key '") + required + "'");
    }
    if (c.strategies.empty()) fail(file, node, "case '" + c.name + "' selects no strategies");
    try {
      reference::findWorkload(c.workload)->validate(c.shape);
    } catch (const c10::Error& e) {
      fail(file, node["shape"] ? node["shape"] : node,
           "case '" + c.name + "': " + e.what_without_backtrace());
    }
    // A sweep is the cartesian product of its lists: one case per combination, named
    // NAME/key=value/..., the values in its params.
    std::vector<CaseSpec> expanded = {c};
    YAML::Node sweep;  // the case's own, else the defaults'
    if (node["sweep"]) {
      sweep.reset(node["sweep"]);
    } else if (root["defaults"] && root["defaults"]["sweep"]) {
      sweep.reset(root["defaults"]["sweep"]);
    }
    if (sweep.IsDefined() && !sweep.IsNull()) {
      for (const auto& kv : sweep) {
        std::vector<CaseSpec> next;
        for (const auto& base : expanded) {
          for (const auto& value : kv.second) {
            CaseSpec e = base;
            e.params[kv.first.Scalar()] = toJson(file, value);
            e.name += "/" + kv.first.Scalar() + "=" + value.Scalar();
            next.push_back(std::move(e));
          }
        }
        expanded = std::move(next);
      }
    }
    for (auto& e : expanded) {
      if (!names.insert(e.name).second) {
        fail(file, node, "case name '" + e.name + "' is used twice");
      }
      suite.cases.push_back(std::move(e));
    }
  }
  return suite;
}

Suite loadSuite(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read the suite file (does it exist?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parseSuite(ss.str(), path);
}

int64_t CaseSpec::meshSize() const {
  int64_t n = 1;
  for (int64_t d : mesh) n *= d;
  return n;
}

std::string CaseSpec::meshString() const { return DeviceMesh(mesh).toString(); }

std::string dtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    default:
      return c10::toString(t);
  }
}

at::ScalarType parseDtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "float64" || name == "fp64") return at::kDouble;
  if (name == "float16" || name == "fp16") return at::kHalf;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  throw InputError("unknown dtype '" + name + "' (expected float32, float64, float16, bfloat16)");
}

}  // namespace sb::harness
