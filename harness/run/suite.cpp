#include "harness/run/suite.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include "harness/comm/mesh.h"
#include "harness/hidden_text.h"
#include "harness/in_file.h"
#include "harness/parse_number.h"

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

// A quoted value is text: `steps: '2'` is not the number 2 (YAML's own reading), and taking it
// as one would accept what the suite's reader of numbers documents it refuses.
void refuseQuoted(const std::string& file, const YAML::Node& n, const std::string& key,
                  const std::string& expected) {
  if (n.Tag() == "!") {
    fail(file, n,
         "key '" + key + "' must be " + expected + ", not the quoted text '" + n.Scalar() +
             "' (write the number without quotes)");
  }
}

template <class T>
T number(const std::string& file, const YAML::Node& n, const std::string& key,
         const std::string& expected) {
  if (!n.IsScalar()) fail(file, n, "key '" + key + "' must be " + expected);
  refuseQuoted(file, n, key, expected);
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    fail(file, n, "key '" + key + "' must be " + expected + ", got '" + n.Scalar() + "'");
  }
}

// A whole number in [lo, hi] written with digits only: yaml-cpp would read "-5" into a
// uint64_t as 18446744073709551611 and "1e3" not at all.
uint64_t wholeNumber(const std::string& file, const YAML::Node& n, const std::string& key,
                     uint64_t lo, uint64_t hi) {
  const std::string expected =
      "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
  if (!n.IsScalar()) fail(file, n, "key '" + key + "' must be " + expected);
  refuseQuoted(file, n, key, expected);
  uint64_t v = 0;
  if (!parseWholeNumber(n.Scalar(), lo, hi, &v)) {
    fail(file, n, "key '" + key + "' must be " + expected + ", got '" + n.Scalar() + "'");
  }
  return v;
}

// A finite number in (lo, hi]: YAML's .inf and .nan are refused, not run forever or compared
// false.
double realNumber(const std::string& file, const YAML::Node& n, const std::string& key, double lo,
                  double hi, const std::string& unit) {
  std::ostringstream expected;
  expected << "a number of " << unit << " in (" << lo << ", " << hi << "]";
  const double v = number<double>(file, n, key, expected.str());
  if (!std::isfinite(v) || !(v > lo) || v > hi) {
    fail(file, n, "key '" + key + "' must be " + expected.str() + ", got '" + n.Scalar() + "'");
  }
  return v;
}

// [-+]? digits [. digits] [e [-+]? digits], with digits on at least one side of the point.
bool isDecimalNumber(const std::string& s) {
  size_t i = s.size() > 0 && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  const auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return i - from;
  };
  size_t mantissa = digits();
  if (i < s.size() && s[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
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
      // Quoted: text, whatever it spells ('0.5' is no number, 'true' no boolean), so that a
      // reader of a number or a flag refuses it instead of taking it.
      if (n.Tag() == "!") return s;
      if (s == "true" || s == "false") return s == "true";
      // A number as YAML writes one in decimal: std::stod also takes C's hexadecimal floats
      // ("0x4" was 4.0, and "got 4.0" the message), which stay text here for a reader to refuse.
      if (!isDecimalNumber(s)) return s;
      try {
        size_t used = 0;
        long long v = std::stoll(s, &used);
        if (used == s.size()) return v;
        double d = std::stod(s, &used);
        // "nan" and "inf" stay text, which every reader of a number refuses.
        if (used == s.size() && std::isfinite(d)) return d;
      } catch (const std::exception&) {
      }
      return s;
    }
    default:
      return nullptr;
  }
}

// Limits on what a suite file may make the reader do (docs/suites.md, "Limits").
constexpr size_t kMaxSuiteBytes = size_t{16} << 20;
constexpr int kMaxDepth = 32;
constexpr int64_t kMaxNodes = 1000000;
constexpr size_t kMaxSweepCases = 10000;
constexpr size_t kMaxCases = 100000;
constexpr size_t kMaxNameBytes = 200;

void checkText(const std::string& file, const YAML::Node& n, const std::string& text) {
  if (const int64_t at = firstInvalidUtf8(text); at >= 0) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(text[at]));
    fail(file, n,
         "not UTF-8 text: byte " + std::string(hex) + " at offset " + std::to_string(at) + " of '" +
             text.substr(0, at) + "...'");
  }
}

// An explicit tag (!!binary, !!float, !custom) asks for a conversion this reader does not make:
// its value would be read as the plain text after it, the tag dropped in silence. Untagged
// nodes have "?" (plain) or "!" (quoted).
void checkTag(const std::string& file, const YAML::Node& n) {
  const std::string& tag = n.Tag();
  if (tag.empty() || tag == "?" || tag == "!") return;
  std::string shown = tag;
  if (const std::string core = "tag:yaml.org,2002:"; shown.rfind(core, 0) == 0) {
    shown = "!!" + shown.substr(core.size());
  }
  fail(file, n,
       "the YAML tag '" + shown +
           "' is not read (the value would be taken as plain text, the tag dropped): write the "
           "value without it");
}

// Walks the whole document once before anything reads it: every mapping key given once, every
// key a plain value, all text UTF-8, and the document bounded in depth and in nodes, counting
// every alias each time it is used (an alias "bomb" of nested anchors is refused here instead
// of being expanded exponentially later).
void checkTree(const std::string& file, const YAML::Node& n, int depth, int64_t* nodes) {
  if (++*nodes > kMaxNodes) {
    fail(file, n,
         "the suite expands to more than " + std::to_string(kMaxNodes) +
             " values, counting each use of an alias (anchors that repeat anchors?)");
  }
  if (depth > kMaxDepth) {
    fail(file, n, "values are nested deeper than " + std::to_string(kMaxDepth) + " levels");
  }
  checkTag(file, n);
  switch (n.Type()) {
    case YAML::NodeType::Scalar:
      checkText(file, n, n.Scalar());
      break;
    case YAML::NodeType::Sequence:
      for (const auto& v : n) checkTree(file, v, depth + 1, nodes);
      break;
    case YAML::NodeType::Map: {
      std::set<std::string> seen;
      for (const auto& kv : n) {
        if (!kv.first.IsScalar()) fail(file, kv.first, "a mapping key must be a plain value");
        checkTag(file, kv.first);
        const std::string key = kv.first.Scalar();
        checkText(file, kv.first, key);
        if (!seen.insert(key).second) {
          fail(file, kv.first,
               "key '" + key +
                   "' is given twice in the same mapping (YAML would keep one "
                   "of them and drop the other)");
        }
        checkTree(file, kv.second, depth + 1, nodes);
      }
      break;
    }
    default:
      break;
  }
}

const std::set<std::string> kCaseKeys = {
    "name",       "workload", "shape",      "mesh",   "dtype", "inputs", "seed",     "repetitions",
    "min_time_s", "device",   "strategies", "params", "sweep", "steps",  "optimizer"};

std::string keyList(const std::set<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

// A case name as result files and reports can hold it: 1 to kMaxNameBytes bytes, nothing
// hiddenCharacter refuses in a name (the text is UTF-8 already, checkTree).
void checkName(const std::string& file, const YAML::Node& n, const std::string& name,
               const std::string& what) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    fail(file, n, what + " must be 1 to " + std::to_string(kMaxNameBytes) + " bytes long");
  }
  // Blank: Unicode's spaces only (U+0020, no-break, en to hair, ideographic, ...).
  const auto isSpace = [](uint32_t cp) {
    return cp == 0x20 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
  };
  bool blank = true, spaceFirst = false, spaceLast = false;
  for (size_t i = 0; i < name.size();) {
    size_t len = 0;
    const uint32_t cp = codePointAt(name, i, len);
    if (i == 0) spaceFirst = isSpace(cp);
    spaceLast = isSpace(cp);
    blank = blank && spaceLast;
    i += len;
  }
  if (blank) {
    fail(file, n, what + " must not be blank (spaces only): a name must read as what it is");
  }
  // A space at either end is lost on the way (a CSV reader trims it, a JSON one keeps it: the
  // run's own results.csv and results.json then name two cases, and `report` refused them).
  if (spaceFirst || spaceLast) {
    fail(file, n,
         what + " must not " + (spaceFirst ? "start" : "end") +
             " with a space: a name must read back as what it is");
  }
  const HiddenCharacter hidden = hiddenCharacter(name, TextKind::kName);
  if (hidden && hidden.code.rfind("0x", 0) == 0) {
    fail(file, n,
         what + " must not hold control characters (a newline, a tab, ...; " + hidden.text() +
             "): names are printed, written in result files and matched by reports");
  }
  if (hidden) {
    fail(file, n,
         what + " must not hold Unicode control, invisible or text-direction characters (" +
             hidden.code + " at byte " + std::to_string(hidden.byte) +
             "): a name must read as what it is wherever it is shown");
  }
}

// Applies the keys of `node` (a defaults block or a case) onto `c`.
void applyKeys(const std::string& file, const YAML::Node& node, CaseSpec& c) {
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (key == "backend") {
      fail(file, kv.first,
           "key 'backend' is not a case key: the backend is chosen for the whole run "
           "(`stratbench run --backend threads|gloo`)");
    }
    if (!kCaseKeys.count(key)) {
      fail(file, kv.first,
           "unknown key '" + key + "' (expected one of: " + keyList(kCaseKeys) + ")");
    }
    if (key == "name") {
      c.name = scalar(file, v, key);
      checkName(file, v, c.name, "key 'name'");
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
        for (const auto& d : v) mesh.push_back(wholeNumber(file, d, key, 1, 64));
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
        if (d <= 0 || d > 64) fail(file, v, "key 'mesh' must have extents from 1 to 64");
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
      c.seed = wholeNumber(file, v, key, 0, std::numeric_limits<uint64_t>::max());
    } else if (key == "repetitions") {
      c.repetitions = static_cast<int>(wholeNumber(file, v, key, 1, 100000));
    } else if (key == "min_time_s") {
      c.minTimeSec = realNumber(file, v, key, 0, 3600, "seconds");
    } else if (key == "device") {
      c.device = scalar(file, v, key);
      // Whether this process can run it is the runner's question: a suite for GPU machines
      // reads the same everywhere, and its cases are skipped, saying why, where there is none.
      if (c.device != "cpu" && c.device != "cuda") {
        fail(file, v, "key 'device' must be cpu or cuda (got '" + c.device + "')");
      }
    } else if (key == "steps") {
      c.training.steps = static_cast<int>(wholeNumber(file, v, key, 1, 10000));
    } else if (key == "optimizer") {
      if (!v.IsMap()) {
        fail(file, v, "key 'optimizer' must be a mapping, e.g. {kind: adamw, lr: 0.001}");
      }
      try {
        c.training.optimizer =
            reference::OptimizerSpec::fromJson(toJson(file, v), "key 'optimizer'");
      } catch (const std::invalid_argument& e) {
        fail(file, v, e.what());
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
  if (text.size() > kMaxSuiteBytes) {
    throw InputError(file + ": " + std::to_string(text.size()) + " bytes; a suite is at most " +
                     std::to_string(kMaxSuiteBytes) + " bytes");
  }
  // One document only. Found in the text, before any parsing: a document marker at the start
  // of a line ("---", or "..." then more content) after the first document's content starts a
  // second one, wherever it stands (YAML ends a block scalar there too). Parsing every
  // document to count them would build a hostile file's later documents first.
  {
    bool content = false, ended = false;
    size_t lineNo = 0;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      ++lineNo;
      const auto marker = [&](const char* m) {
        return line.rfind(m, 0) == 0 &&
               (line.size() == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r');
      };
      const bool blank = line.find_first_not_of(" \t\r") == std::string::npos ||
                         line[line.find_first_not_of(" \t\r")] == '#';
      if (marker("---") ? content : (!blank && !marker("...") && line[0] != '%' && ended)) {
        throw InputError(file + ":" + std::to_string(lineNo) +
                         ": a second YAML document; a suite file holds one document: put its "
                         "cases in the first one's 'cases' list, or another suite in a file "
                         "of its own");
      }
      if (marker("...")) {
        ended = content;
      } else if (!blank && !marker("---") && line[0] != '%') {
        content = true;
      }
    }
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp's own message for it is "bad file".
    throw InputError(file + ":" + std::to_string(e.mark.line + 1) +
                     ": not valid YAML here: lists or mappings nested over " +
                     std::to_string(e.depth()) + " levels deep (a suite nests a few)");
  } catch (const YAML::Exception& e) {
    throw InputError(file + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) throw InputError(file + ":1: a suite must be a mapping with a 'cases' list");
  int64_t nodes = 0;
  checkTree(file, root, 0, &nodes);

  Suite suite;
  suite.file = file;
  suite.name = std::filesystem::path(file).stem().string();
  CaseSpec defaults;
  defaults.file = file;
  const std::set<std::string> topKeys = {"suite", "description", "golden", "defaults", "cases"};
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    if (!topKeys.count(key)) {
      fail(file, kv.first,
           "unknown top-level key '" + key + "' (expected one of: " + keyList(topKeys) + ")");
    }
  }
  if (root["suite"]) {
    suite.name = scalar(file, root["suite"], "suite");
    checkName(file, root["suite"], suite.name, "key 'suite'");
  }
  if (root["description"]) suite.description = scalar(file, root["description"], "description");
  if (root["golden"]) {
    const std::string g = scalar(file, root["golden"], "golden");
    // A file name held to a name's rules: a NUL cut it short where it was opened (another file
    // written), and control characters reached the terminal and the file system.
    checkName(file, root["golden"], g, "key 'golden'");
    if (g.empty() || g.find('/') != std::string::npos) {
      fail(file, root["golden"],
           "key 'golden' must name a file beside the suite (no folders), got '" + g + "'");
    }
    suite.golden = (std::filesystem::path(file).parent_path() / g).string();
  }
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
    {
      const bool hasOptimizer =
          node["optimizer"] || (root["defaults"] && root["defaults"]["optimizer"]);
      if (hasOptimizer && !c.training.enabled()) {
        fail(file, node["optimizer"] ? node["optimizer"] : node,
             "case '" + c.name + "': key 'optimizer' needs key 'steps' (how many optimizer steps)");
      }
      if (c.training.enabled() && !reference::hasTrainingReference(c.workload)) {
        fail(file, node["steps"] ? node["steps"] : node,
             "case '" + c.name + "': workload '" + c.workload +
                 "' has no training reference (steps need one): " +
                 reference::trainingWorkloadList());
      }
    }
    try {
      reference::findWorkload(c.workload)->validate(c.shape);
    } catch (const c10::Error& e) {
      fail(file, node["shape"] ? node["shape"] : node,
           "case '" + c.name + "': " + e.what_without_backtrace());
    } catch (const std::logic_error& e) {
      // The graph workloads say what is wrong with a shape as std::invalid_argument.
      fail(file, node["shape"] ? node["shape"] : node, "case '" + c.name + "': " + e.what());
    } catch (const nlohmann::json::exception& e) {
      // A parser that read a value as the type it expected without asking first (`dtype: 5`
      // where a name belongs): bad input naming the case and the workload, never an abort.
      std::string what = e.what();
      if (what.rfind("[json.exception.", 0) == 0 && what.find("] ") != std::string::npos) {
        what = what.substr(what.find("] ") + 2);
      }
      fail(file, node["shape"] ? node["shape"] : node,
           "case '" + c.name + "': " + c.workload + ": a shape value of the wrong type (" + what +
               ")");
    }
    // A sweep is the cartesian product of its lists: one case per combination, named
    // NAME/key=value/..., the values in its params.
    std::vector<CaseSpec> expanded = {c};
    YAML::Node sweep;  // the case's own, else the defaults'
    // The params a sweep's key would silently replace: the case's own, and with a sweep of the
    // defaults' the defaults' too (a case's sweep over a default param is how a default is
    // varied: that one is meant).
    std::vector<std::pair<YAML::Node, std::string>> overridden;
    if (node["sweep"]) {
      sweep.reset(node["sweep"]);
      if (node["params"]) overridden.emplace_back(node["params"], "the case's params");
    } else if (root["defaults"] && root["defaults"]["sweep"]) {
      sweep.reset(root["defaults"]["sweep"]);
      if (node["params"]) overridden.emplace_back(node["params"], "the case's params");
      if (root["defaults"]["params"]) {
        overridden.emplace_back(root["defaults"]["params"], "the defaults' params");
      }
    }
    if (sweep.IsDefined() && !sweep.IsNull()) {
      for (const auto& kv : sweep) {
        for (const auto& [params, which] : overridden) {
          if (params.IsMap() && params[kv.first.Scalar()]) {
            fail(file, kv.first,
                 "case '" + c.name + "': key 'sweep': '" + kv.first.Scalar() + "' is also in " +
                     which + ": every swept case would replace its value (give it in one)");
          }
        }
      }
      size_t product = 1;
      for (const auto& kv : sweep) {
        product *= std::max<size_t>(kv.second.size(), 1);
        if (product > kMaxSweepCases) {
          fail(file, sweep,
               "case '" + c.name + "': the sweep makes more than " +
                   std::to_string(kMaxSweepCases) + " cases");
        }
      }
      for (const auto& kv : sweep) {
        std::vector<CaseSpec> next;
        for (const auto& base : expanded) {
          for (const auto& value : kv.second) {
            CaseSpec e = base;
            e.params[kv.first.Scalar()] = toJson(file, value);
            if (!value.IsScalar()) {
              fail(file, value,
                   "key 'sweep': the values of '" + kv.first.Scalar() +
                       "' must be plain values (they name the cases)");
            }
            e.name += "/" + kv.first.Scalar() + "=" + value.Scalar();
            next.push_back(std::move(e));
          }
        }
        expanded = std::move(next);
      }
    }
    for (auto& e : expanded) {
      // A sweep's values become part of the name (found by ci/fuzz/suite_fuzz.cpp: a value
      // holding a control character made a name the result files could not hold).
      if (e.name != c.name) {
        checkName(file, node, e.name, "case '" + c.name + "': the name its sweep makes");
      }
      if (!names.insert(e.name).second) {
        fail(file, node, "case name '" + e.name + "' is used twice");
      }
      suite.cases.push_back(std::move(e));
    }
    if (suite.cases.size() > kMaxCases) {
      fail(file, node, "the suite has more than " + std::to_string(kMaxCases) + " cases");
    }
  }
  return suite;
}

Suite loadSuite(const std::string& path) {
  // A FIFO blocked forever and /dev/zero was read until memory ran out: a suite is a regular
  // file, or the stream the caller hands over (/dev/stdin, a shell's /dev/fd/N: a heredoc, a
  // process substitution), and is read no further than the limit (parseSuite refuses what
  // reaches it).
  const bool stream = path == "/dev/stdin" || path.rfind("/dev/fd/", 0) == 0 ||
                      path.rfind("/proc/self/fd/", 0) == 0;
  if (const std::string why = whyNotAFile(path); !stream && !why.empty() && why != "no such file") {
    throw InputError(path + ": " + why + "; a suite is a YAML file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read the suite file (does it exist?)");
  std::string text(kMaxSuiteBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return parseSuite(text, path);
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
