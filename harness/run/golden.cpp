// Golden losses (see golden.h).

#include "harness/run/golden.h"
#include "harness/in_file.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <ATen/Parallel.h>

#include "harness/error.h"
#include "harness/measure/verify.h"

namespace sb::harness {
namespace {

constexpr const char* kGoldenFirstLine = "# Golden losses:";

std::string hexFloat(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

std::string decimal(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// A case name as the file's first cell: quoted as CSV quotes (the quotes doubled inside) where
// it holds a comma or a quote, or begins with '#' (a comment line) or a space.
std::string nameCell(const std::string& name) {
  const bool quote = name.find_first_of(",\"") != std::string::npos ||
                     (!name.empty() && (name[0] == '#' || name[0] == ' '));
  if (!quote) return name;
  std::string out = "\"";
  for (char c : name) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// The cells of a data line: the first one quoted or not (nameCell), the rest plain. Empty with
// `problem` set for a quoted cell that does not end.
std::vector<std::string> splitCells(const std::string& line, std::string& problem) {
  std::vector<std::string> out;
  size_t at = 0;
  if (!line.empty() && line[0] == '"') {
    std::string name;
    size_t i = 1;
    for (; i < line.size(); ++i) {
      if (line[i] != '"') {
        name += line[i];
      } else if (i + 1 < line.size() && line[i + 1] == '"') {
        name += '"';
        ++i;
      } else {
        break;
      }
    }
    if (i >= line.size() || (i + 1 < line.size() && line[i + 1] != ',')) {
      problem = "the quoted case name does not end with '\"' before a ','";
      return {};
    }
    out.push_back(name);
    at = i + 2;
    if (at > line.size()) return out;
  }
  std::string cell;
  std::istringstream is(line.substr(at));
  while (std::getline(is, cell, ',')) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

}  // namespace

std::string hostVectorFeatures() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream is(line.substr(line.find(':') + 1));
    std::set<std::string> keep;
    std::string f;
    while (is >> f) {
      if (f.rfind("avx", 0) == 0 || f == "fma" || f == "f16c" || f.rfind("amx", 0) == 0) {
        keep.insert(f);
      }
    }
    std::string out;
    for (const auto& k : keep) out += (out.empty() ? "" : " ") + k;
    return out.empty() ? "none" : out;
  }
  return "unknown";
}

int hostThreads() { return at::get_num_threads(); }

GoldenLosses readGolden(const std::string& path) {
  if (const auto why = notARegularFile(path); !why.empty()) throw InputError(path + ": " + why);
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    throw InputError(path + ": cannot read the golden losses file (" + std::strerror(err) + ")" +
                     (err == ENOENT ? ": `stratbench run SUITE --write-golden` writes it" : ""));
  }
  GoldenLosses g;
  g.file = path;
  std::string line;
  int lineNo = 0;
  bool header = false;
  const auto bad = [&](const std::string& what) {
    throw InputError(path + ":" + std::to_string(lineNo) + ": " + what);
  };
  while (std::getline(in, line)) {
    ++lineNo;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (line.rfind("# suite:", 0) == 0) {
        g.suite = line.substr(8);
        g.suite.erase(0, g.suite.find_first_not_of(' '));
      }
      if (line.rfind("# cpu:", 0) == 0) {
        g.cpu = line.substr(6);
        g.cpu.erase(0, g.cpu.find_first_not_of(' '));
      }
      if (line.rfind("# threads:", 0) == 0) {
        char* end = nullptr;
        const long t = std::strtol(line.c_str() + 10, &end, 10);
        if (t < 1 || t > 100000 || *end != '\0') {
          bad("'# threads:' must be a whole number from 1 to 100000, got '" + line.substr(10) +
              "'");
        }
        g.threads = static_cast<int>(t);
      }
      continue;
    }
    std::string problem;
    const std::vector<std::string> cells = splitCells(line, problem);
    if (!problem.empty()) bad(problem);
    if (!header) {
      if (line != "case,step,loss,grad_norm") {
        bad("expected the header 'case,step,loss,grad_norm', got '" + line + "'");
      }
      header = true;
      continue;
    }
    if (cells.size() != 4) {
      bad("expected 4 cells (case,step,loss,grad_norm), got " + std::to_string(cells.size()));
    }
    auto& steps = g.cases[cells[0]];
    char* end = nullptr;
    const long step = std::strtol(cells[1].c_str(), &end, 10);
    if (cells[1].empty() || *end != '\0' || step != static_cast<long>(steps.size()) + 1) {
      bad("case '" + cells[0] + "': expected step " + std::to_string(steps.size() + 1) + ", got '" +
          cells[1] + "'");
    }
    GoldenLosses::Step s;
    for (int k = 0; k < 2; ++k) {
      const std::string& cell = cells[2 + k];
      const double v = std::strtod(cell.c_str(), &end);
      if (cell.empty() || *end != '\0' || !std::isfinite(v)) {
        bad(std::string("key '") + (k == 0 ? "loss" : "grad_norm") +
            "': expected a finite number (hexadecimal, as %a writes it), got '" + cell + "'");
      }
      (k == 0 ? s.loss : s.gradNorm) = v;
    }
    steps.push_back(s);
  }
  if (!header) throw InputError(path + ": no header 'case,step,loss,grad_norm'");
  if (g.cpu.empty()) throw InputError(path + ": no '# cpu: ...' line naming the writer's host");
  return g;
}

std::string goldenText(const GoldenLosses& g) {
  std::ostringstream os;
  os << kGoldenFirstLine
     << " the reference's loss and gradient norm per optimizer step, written by\n"
        "# `stratbench run SUITE --write-golden`. Compared bitwise on hosts with these vector\n"
        "# features and threads, within the steps' tolerance elsewhere (harness/run/golden.h).\n";
  if (!g.suite.empty()) os << "# suite: " << g.suite << "\n";
  os << "# cpu: " << g.cpu << "\n";
  os << "# threads: " << g.threads << "\n";
  os << "case,step,loss,grad_norm\n";
  for (const auto& [name, steps] : g.cases) {
    for (size_t k = 0; k < steps.size(); ++k) {
      os << nameCell(name) << "," << k + 1 << "," << hexFloat(steps[k].loss) << ","
         << hexFloat(steps[k].gradNorm) << "\n";
    }
  }
  return os.str();
}

std::vector<GoldenLosses::Step> goldenSteps(const reference::WorkloadData& data) {
  const at::Tensor loss = data.expected.at("loss").to(at::kDouble).cpu();
  const at::Tensor norm = data.expected.at("grad_norm").to(at::kDouble).cpu();
  std::vector<GoldenLosses::Step> out;
  for (int64_t k = 0; k < loss.numel(); ++k) {
    const double l = loss[k].item<double>(), n = norm[k].item<double>();
    if (!std::isfinite(l) || !std::isfinite(n)) {
      throw std::runtime_error(
          "the reference's " + std::string(std::isfinite(l) ? "gradient norm" : "loss") +
          " at step " + std::to_string(k + 1) + " is " + decimal(std::isfinite(l) ? n : l) +
          ": not a golden loss (the reference diverged; nothing written "
          "for this case)");
    }
    out.push_back({l, n});
  }
  return out;
}

void checkGoldenTarget(const std::string& path, const std::string& suiteFile) {
  std::error_code ec;
  if (std::filesystem::equivalent(path, suiteFile, ec)) {
    throw InputError(path +
                     ": key 'golden' names the suite file itself; --write-golden "
                     "would replace it (name another file, e.g. " +
                     std::filesystem::path(suiteFile).stem().string() + ".golden.csv)");
  }
  const auto link = std::filesystem::symlink_status(path, ec);
  if (!std::filesystem::exists(link)) return;
  // Written through a link, the file would be another's (another suite's golden losses, whose
  // cases not in this suite the rewrite drops): the link is refused, naming where it points.
  if (std::filesystem::is_symlink(link)) {
    throw InputError(path + ": a symbolic link (-> " +
                     std::filesystem::read_symlink(path, ec).string() +
                     "); --write-golden writes only the file the suite's key 'golden' names "
                     "itself, never through a link (name the target in the suite instead)");
  }
  std::ifstream in(path);
  std::string first;
  if (!std::filesystem::is_regular_file(path, ec) || !in || !std::getline(in, first) ||
      first.rfind(kGoldenFirstLine, 0) != 0) {
    throw InputError(
        path +
        ": --write-golden replaces only a golden losses file it wrote "
        "(its first line '" +
        std::string(kGoldenFirstLine) + " ...'); this one " +
        (first.empty() ? std::string("is not one") : "begins '" + first.substr(0, 60) + "'") +
        ": remove it or name another file in the suite's key 'golden'");
  }
}

GoldenVerdict compareGolden(const GoldenLosses& g, const CaseSpec& c,
                            const reference::WorkloadData& data, const std::string& host,
                            int threads) {
  GoldenVerdict v;
  auto it = g.cases.find(c.name);
  if (it == g.cases.end()) {
    v.problem = "the golden file " + g.file + " has no losses for case '" + c.name +
                "' (write them with `stratbench run SUITE --write-golden`)";
    return v;
  }
  const std::vector<GoldenLosses::Step> got = goldenSteps(data);
  if (got.size() != it->second.size()) {
    v.problem = "the golden file " + g.file + " has " + std::to_string(it->second.size()) +
                " steps for case '" + c.name + "', the case takes " + std::to_string(got.size());
    return v;
  }
  const bool bitwise = host == g.cpu && threads == g.threads;
  const int steps = static_cast<int>(got.size());
  for (size_t k = 0; k < got.size(); ++k) {
    for (int q = 0; q < 2; ++q) {
      const double a = q == 0 ? got[k].loss : got[k].gradNorm;
      const double e = q == 0 ? it->second[k].loss : it->second[k].gradNorm;
      const Tolerance t = stepsTolerance(c.dtype, steps, std::abs(e));
      const bool ok = bitwise ? a == e : std::abs(a - e) <= t.atol + t.rtol * std::abs(e);
      if (ok) continue;
      v.problem = std::string("the reference's ") + (q == 0 ? "loss" : "gradient norm") +
                  " at step " + std::to_string(k + 1) + " is " + decimal(a) + " (" + hexFloat(a) +
                  "), the golden file " + g.file + " has " + decimal(e) + " (" + hexFloat(e) + ")" +
                  (bitwise ? ", compared bitwise" : ", beyond the tolerance");
      return v;
    }
  }
  v.how = bitwise ? "bitwise equal to " + g.file + " over " + std::to_string(got.size()) + " steps"
                  : "within 10 x steps x the dtype's tolerance of " + g.file + " over " +
                        std::to_string(got.size()) + " steps (written with the vector features '" +
                        g.cpu + "' and " + std::to_string(g.threads) +
                        " intra-op threads, this host has '" + host + "' and " +
                        std::to_string(threads) + ")";
  return v;
}

}  // namespace sb::harness
