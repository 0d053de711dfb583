// `stratbench solve parallel`: the degrees of a composed-parallel run (pp x dp_replicate x
// dp_shard x cp x tp, schedule, micro-batches, sp, checkpointing) for a model on N ranks, every
// valid assignment priced and ranked (strategies/sharding/compose/parallel_search.h); with
// `--verify K` the top K run as torch/compose rows and each prediction is put beside its
// measured step time and peak. One subcommand per file (cli/commands.h).

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/numbers.h"
#include "harness/case.h"
#include "harness/dist/cost_profile.h"
#include "harness/error.h"
#include "harness/out_file.h"
#include "harness/run/run_util.h"
#include "reference/graph.h"
#include "reference/json_strict.h"
#include "reference/torchscript/import.h"
#include "reports/results_file.h"
#include "strategies/sharding/compose/parallel_graph.h"

namespace {

namespace cs = sb::strategies::compose;
using sb::cli::kExitBadInput;
constexpr const char* kWho = "stratbench solve parallel: ";

struct ParallelArgs {
  std::string workload = "llama", shape = "{}", profile, out, dtype = "float32";
  std::string optimizer = "adamw";
  sb::cli::ModelOptions model;
  int ranks = 0, top = 10, verify = 0, steps = 1, repetitions = 3, virtualStages = 2;
  int ranksPerNode = 8;
  double maxMemory = 0, gflops = 0, copyGBps = 0, kernelUs = -1, intra = 0, inter = 0, latency = -1,
         hostCores = 0;
  std::vector<std::string> schedules{"gpipe", "1f1b", "interleaved-1f1b"};
  std::vector<std::string> ac{"none", "selective", "full"};
  std::vector<int> microbatches;
  bool noCp = false, noPp = false;
  std::string verifyDir;
};

std::string human(double bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1);
  if (bytes >= 1 << 30) {
    s << bytes / (1 << 30) << " GiB";
  } else if (bytes >= 1 << 20) {
    s << bytes / (1 << 20) << " MiB";
  } else {
    s << bytes / 1024 << " KiB";
  }
  return s.str();
}

std::string ms(double us) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(us < 1e4 ? 3 : 1) << us / 1e3 << " ms";
  return s.str();
}

// Prices from the flags, over a calibrated profile where one is given: its matmul and copy
// fits, its collectives' latency and bandwidth (the all-reduce fit of its largest group).
cs::Prices pricesFrom(const ParallelArgs& a) {
  cs::Prices p;
  if (!a.profile.empty()) {
    const auto prof = sb::harness::CostProfile::load(a.profile);
    if (prof.gemm.usPerByte > 0) p.gflops = 1e-3 / prof.gemm.usPerByte;
    if (prof.copy && prof.copy->usPerByte > 0) p.copyGBps = 1e-3 / prof.copy->usPerByte;
    const sb::harness::CostProfile::Group* widest = nullptr;
    for (const auto& [key, g] : prof.groups) {
      if (g.size > 1 && g.collectives.count(sb::harness::Collective::kAllReduce) &&
          (!widest || g.size > widest->size))
        widest = &g;
    }
    if (widest) {
      const auto& fit = widest->collectives.at(sb::harness::Collective::kAllReduce);
      p.latencyUs = fit.latencyUs;
      const int g = widest->size;
      if (fit.usPerByte > 0) p.intraGBps = p.interGBps = 2.0 * (g - 1) / g / fit.usPerByte / 1e3;
    }
  }
  if (a.gflops > 0) p.gflops = a.gflops;
  if (a.copyGBps > 0) p.copyGBps = a.copyGBps;
  if (a.kernelUs >= 0) p.kernelUs = a.kernelUs;
  if (a.intra > 0) p.intraGBps = a.intra;
  if (a.inter > 0) p.interGBps = a.inter;
  if (a.latency >= 0) p.latencyUs = a.latency;
  p.ranksPerNode = a.ranksPerNode;
  p.hostCores = a.hostCores;
  return p;
}

void printTable(const cs::SearchResult& r, std::ostream& out) {
  out << std::left << std::setw(4) << "#" << std::right << std::setw(13) << "step" << std::setw(8)
      << "bubble" << std::setw(11) << "peak/rank"
      << "  configuration\n";
  int i = 0;
  for (const auto& p : r.ranked) {
    std::ostringstream bubble;
    bubble << std::fixed << std::setprecision(1) << 100 * p.bubbleFraction << "%";
    out << std::left << std::setw(4) << ++i << std::right << std::setw(13) << ms(p.stepUs)
        << std::setw(8) << bubble.str() << std::setw(11) << human(p.peakBytes) << "  "
        << p.config.label() << "\n";
  }
}

// A case name from a configuration's label: letters, digits and '-'.
std::string caseName(int rank, const cs::ParallelConfig& c) {
  std::string s = "top" + std::to_string(rank) + "-";
  for (char ch : c.label()) {
    if (std::isalnum(static_cast<unsigned char>(ch))) {
      s += ch;
    } else if (!s.empty() && s.back() != '-') {
      s += '-';
    }
  }
  while (!s.empty() && s.back() == '-') s.pop_back();
  return s;
}

// The suite of the top K runnable predictions as torch/compose rows; those it leaves out (cp:
// PyTorch's context parallelism does not run on the CPU) are said on stderr.
// The generated suite's first line, by which a later --verify-out knows the file is its own.
std::string verifySuitePrefix() { return "# Written by `stratbench solve parallel --verify "; }

std::string verifySuite(const ParallelArgs& a, const nlohmann::json& shape,
                        const std::vector<const cs::Prediction*>& chosen) {
  std::ostringstream y;
  y << verifySuitePrefix() << a.verify
    << "`: the search's top configurations, each run by torch/compose.\n"
    << "suite: solve-parallel\n"
    << "description: the degree search's top " << chosen.size() << " as torch/compose rows\n"
    << "defaults: {dtype: " << a.dtype
    << ", inputs: random, seed: 1234, repetitions: " << a.repetitions << ", min_time_s: 0.002}\n"
    << "cases:\n";
  int i = 0;
  for (const cs::Prediction* p : chosen) {
    const cs::ParallelConfig& c = p->config;
    nlohmann::json s = shape;
    s["file"] = std::filesystem::absolute(shape.at("file").get<std::string>()).string();
    if (c.pp > 1) s["microbatches"] = c.microbatches;
    nlohmann::json params = {{"axes", c.axes()}, {"ac", c.ac}};
    if (c.tp > 1) params["sp"] = c.sp;
    if (c.pp > 1) {
      params["schedule"] = c.schedule;
      params["virtual_stages"] = c.virtualStages;
    }
    std::string mesh;
    for (int d : c.mesh()) mesh += (mesh.empty() ? "" : "x") + std::to_string(d);
    if (mesh.empty()) mesh = "1";
    nlohmann::json opt =
        a.optimizer == "adamw"
            ? nlohmann::json{{"kind", "adamw"}, {"lr", 0.001}, {"weight_decay", 0.01}}
        : a.optimizer == "sgd" ? nlohmann::json{{"kind", "sgd"}, {"lr", 0.01}, {"momentum", 0.9}}
                               : nlohmann::json{{"kind", "sgd"}, {"lr", 0.01}};
    y << "  # predicted: step " << p->stepUs << " us, peak " << static_cast<int64_t>(p->peakBytes)
      << " bytes a rank\n"
      << "  - name: " << caseName(++i, c) << "\n"
      << "    workload: torchscript\n"
      << "    shape: " << s.dump() << "\n"
      << "    mesh: " << mesh << "\n"
      << "    steps: " << a.steps << "\n"
      << "    optimizer: " << opt.dump() << "\n"
      << "    params: " << params.dump() << "\n"
      << "    strategies: [\"torch/compose\"]\n";
  }
  return y.str();
}

// `self run SUITE --out DIR`, waited for; its exit code (127 when it could not start).
int runSuite(const std::string& suite, const std::string& dir) {
  std::vector<std::string> args = {"/proc/self/exe", "run", suite, "--out", dir};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::cout.flush();
  std::cerr.flush();
  const pid_t pid = ::fork();
  if (pid < 0) return 127;
  if (pid == 0) {
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return 127;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Spearman's rank correlation of two equally long lists (no ties expected; 1 for fewer than 2).
double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = x.size();
  if (n < 2) return 1;
  const auto ranks = [n](const std::vector<double>& v) {
    std::vector<size_t> idx(n);
    for (size_t i = 0; i < n; ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&v](size_t a, size_t b) { return v[a] < v[b]; });
    std::vector<double> r(n);
    for (size_t i = 0; i < n; ++i) r[idx[i]] = static_cast<double>(i);
    return r;
  };
  const auto rx = ranks(x), ry = ranks(y);
  double d2 = 0;
  for (size_t i = 0; i < n; ++i) d2 += (rx[i] - ry[i]) * (rx[i] - ry[i]);
  const double nn = static_cast<double>(n);
  return 1 - 6 * d2 / (nn * (nn * nn - 1));
}

int verify(const ParallelArgs& a, const nlohmann::json& shape, const cs::SearchResult& r,
           nlohmann::json& report) {
  std::vector<const cs::Prediction*> chosen;
  for (const auto& p : r.ranked) {
    if (static_cast<int>(chosen.size()) == a.verify) break;
    if (p.config.cp > 1) {
      std::cerr << kWho << "not verified: " << p.config.label()
                << " (cp: PyTorch's context parallelism does not run on the CPU)\n";
      continue;
    }
    if (p.config.pp > 1 && p.config.microbatches < 2) {
      std::cerr << kWho << "not verified: " << p.config.label()
                << " (torch/compose's schedules need 2 micro-batches or more)\n";
      continue;
    }
    chosen.push_back(&p);
  }
  if (chosen.empty()) {
    std::cerr << kWho << "--verify: no configuration of the ranking runs as torch/compose\n";
    return 1;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(a.verifyDir, ec);
  if (ec || !fs::is_directory(a.verifyDir)) {
    std::cerr << kWho << "--verify-out " << a.verifyDir << ": cannot make the folder"
              << (ec ? " (" + ec.message() + ")" : std::string(" (a file is there)")) << "\n";
    return kExitBadInput;
  }
  const std::string suite = (fs::path(a.verifyDir) / "suite.yaml").string();
  const std::string results = (fs::path(a.verifyDir) / "results").string();
  sb::harness::replaceResultFile(suite, verifySuite(a, shape, chosen));
  std::cerr << kWho << "verifying the top " << chosen.size() << ": " << suite << " -> " << results
            << "\n";
  const int rc = runSuite(suite, results);
  if (rc != 0 && rc != 1) {
    std::cerr << kWho << "`run " << suite << "` exited " << rc << "\n";
    return rc == kExitBadInput ? kExitBadInput : 1;
  }
  const auto rows = sb::reports::readResults(results);
  std::vector<double> predicted, measured;
  bool allPass = true;
  nlohmann::json verified = nlohmann::json::array();
  std::cout << "\nverified (" << a.steps << " step" << (a.steps > 1 ? "s" : "")
            << " a row; time the median of " << a.repetitions << "):\n"
            << std::left << std::setw(4) << "#" << std::setw(52) << "configuration" << std::setw(7)
            << "status" << std::right << std::setw(13) << "predicted" << std::setw(13) << "measured"
            << std::setw(12) << "peak pred" << std::setw(12) << "peak meas"
            << "\n";
  for (size_t i = 0; i < chosen.size(); ++i) {
    const cs::Prediction& p = *chosen[i];
    const std::string name = caseName(static_cast<int>(i) + 1, p.config);
    const sb::reports::ResultRow* row = nullptr;
    for (const auto& rr : rows) {
      if (rr.caseName == name) row = &rr;
    }
    const std::string status = row ? row->status : "missing";
    if (status != "pass") allPass = false;
    const double t = row && row->timeMedianUs ? *row->timeMedianUs / a.steps : NAN;
    const double peak = row && row->peakMemBytes ? static_cast<double>(*row->peakMemBytes) : NAN;
    if (std::isfinite(t)) {
      predicted.push_back(p.stepUs);
      measured.push_back(t);
    }
    std::cout << std::left << std::setw(4) << i + 1 << std::setw(52) << p.config.label()
              << std::setw(7) << status << std::right << std::setw(13) << ms(p.stepUs)
              << std::setw(13) << (std::isfinite(t) ? ms(t) : "-") << std::setw(12)
              << human(p.peakBytes) << std::setw(12) << (std::isfinite(peak) ? human(peak) : "-")
              << "\n";
    verified.push_back(
        {{"case", name},
         {"config", p.config.toJson()},
         {"status", status},
         {"predicted_step_us", p.stepUs},
         {"measured_step_us", std::isfinite(t) ? nlohmann::json(t) : nlohmann::json()},
         {"predicted_peak_bytes", p.peakBytes},
         {"measured_peak_bytes", std::isfinite(peak) ? nlohmann::json(peak) : nlohmann::json()},
         {"message", row ? row->message : ""}});
  }
  const double rho = spearman(predicted, measured);
  std::cout << "rank correlation of predicted and measured step times (Spearman): " << rho
            << " over " << predicted.size() << " rows\n";
  report["verified"] = verified;
  report["verified_spearman"] = rho;
  report["verified_results"] = results;
  if (!allPass) {
    std::cerr << kWho << "a verified row did not pass: see " << results << "/results.csv\n";
    return 1;
  }
  return 0;
}

// DIR/suite.yaml of --verify-out is replaced only where this command wrote it before (its first
// line says so): a user's suite there, a link (written through to what it named), a file the
// command reads (--model) or writes (--out) were replaced. Checked before the search; "" where
// it may be written.
std::string verifySuiteProblem(const ParallelArgs& a, sb::harness::InputFiles inputs) {
  namespace fs = std::filesystem;
  const std::string suite = (fs::path(a.verifyDir) / "suite.yaml").string();
  if (!a.out.empty()) inputs.emplace_back("--out", a.out);
  for (const auto& [option, file] : inputs) {
    std::error_code ec;
    if (!file.empty() && fs::equivalent(file, suite, ec)) {
      return suite + " is the file " + option + " names: the suite is written there";
    }
  }
  std::error_code ec;
  const auto st = fs::symlink_status(suite, ec);
  if (st.type() == fs::file_type::not_found) return "";
  if (st.type() == fs::file_type::symlink) {
    return suite + " is a symbolic link: the suite is written only into the folder itself";
  }
  if (st.type() != fs::file_type::regular) return suite + " is there and is not a file";
  std::ifstream in(suite);
  std::string first;
  std::getline(in, first);
  if (first.rfind(verifySuitePrefix(), 0) != 0) {
    return suite + " is there and solve parallel did not write it (its first line is not \"" +
           verifySuitePrefix() + "...\"): give a folder of its own";
  }
  return "";
}

int solveParallel(const ParallelArgs& a) {
  namespace h = sb::harness;
  const h::InputFiles inputs = {{"--model", a.model.file}, {"--profile", a.profile}};
  nlohmann::json shape;
  std::string workload = a.workload;
  try {
    if (!a.model.file.empty()) {
      workload = "torchscript";
      shape = sb::cli::modelShape(a.model);
    } else {
      shape = sb::reference::parseJsonNoDuplicates(a.shape);
    }
  } catch (const nlohmann::json::exception& e) {
    std::cerr << kWho << "--shape is not valid JSON: " << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  } catch (const std::invalid_argument& e) {
    std::cerr << kWho << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  }
  if (a.verify > 0 && a.model.file.empty()) {
    std::cerr << kWho
              << "--verify runs the configurations as torch/compose rows, which run a PyTorch "
                 "module: give it with --model FILE --input SPEC (a traced LLaMA as Meta writes "
                 "it)\n";
    return kExitBadInput;
  }
  if (a.verify == 0 && !a.verifyDir.empty()) {
    std::cerr << kWho << "--verify-out " << a.verifyDir
              << " without --verify K: nothing would be verified or written there (give "
                 "--verify K, or drop --verify-out)\n";
    return kExitBadInput;
  }
  if (a.verify > 0 && a.verifyDir.empty()) {
    std::cerr << kWho << "--verify needs --verify-out DIR (the suite and its results)\n";
    return kExitBadInput;
  }
  if (a.verify > 0) {
    if (const std::string why = verifySuiteProblem(a, inputs); !why.empty()) {
      std::cerr << kWho << "--verify-out " << a.verifyDir << ": " << why << "\n";
      return kExitBadInput;
    }
  }
  int64_t elementBytes = 4;
  try {
    elementBytes = static_cast<int64_t>(c10::elementSize(h::parseDtype(a.dtype)));
  } catch (const std::exception&) {
    std::cerr << kWho << "--dtype '" << a.dtype << "' is not a dtype\n";
    return kExitBadInput;
  }
  try {
    if (!a.out.empty()) h::checkResultPath(a.out, inputs);
    cs::SearchOptions o;
    o.ranks = a.ranks;
    o.memoryLimit = a.maxMemory;
    o.optimizer = a.optimizer;
    o.schedules = a.schedules;
    o.ac = a.ac;
    o.microbatches = a.microbatches;
    o.virtualStages = a.virtualStages;
    o.cp = !a.noCp && a.model.file.empty();
    o.pp = !a.noPp;
    o.top = std::max(a.top, a.verify);
    o.prices = pricesFrom(a);
    const auto start = std::chrono::steady_clock::now();
    const cs::ModelCosts m =
        cs::modelCosts(sb::reference::buildGraph(workload, shape), elementBytes);
    const double graphSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const cs::SearchResult r = cs::search(m, o);
    nlohmann::json report = {
        {"workload", workload},          {"shape", shape},           {"ranks", a.ranks},
        {"memory_limit", a.maxMemory},   {"optimizer", a.optimizer}, {"model", m.toJson()},
        {"graph_seconds", graphSeconds}, {"search", r.toJson()}};
    std::cout << (a.model.file.empty() ? workload : a.model.file) << " on " << a.ranks
              << " ranks: " << r.degreeAssignments << " degree assignments, " << r.configurations
              << " configurations, " << r.fitting << " fit";
    if (a.maxMemory > 0) std::cout << " in " << human(a.maxMemory) << " a rank";
    std::cout << ", " << r.overMemory << " over; searched in " << r.seconds << " s (graph "
              << graphSeconds << " s)\n";
    for (const auto& [why, n] : r.refused) std::cout << "  refused " << n << ": " << why << "\n";
    int rc = 0;
    if (r.ranked.empty()) {
      if (r.anyValid) {
        std::cerr << kWho << "no configuration fits " << static_cast<int64_t>(a.maxMemory)
                  << " bytes a rank; the least memory is "
                  << static_cast<int64_t>(r.leastMemory.peakBytes) << " bytes ("
                  << r.leastMemory.config.label() << ")\n";
      } else {
        std::cerr << kWho << "no configuration of " << a.ranks
                  << " ranks is valid for this model (reasons above)\n";
      }
      rc = 1;
    } else {
      printTable(r, std::cout);
      if (a.verify > 0) rc = verify(a, shape, r, report);
    }
    if (!a.out.empty()) h::replaceResultFile(a.out, report.dump(2) + "\n", inputs);
    return rc;
  } catch (const h::InputError& e) {
    std::cerr << kWho << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  } catch (const sb::reference::torchscript::ImportError& e) {
    std::cerr << kWho << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  } catch (const sb::reports::ReportInputError& e) {
    std::cerr << kWho << "the verified rows: " << e.what() << "\n";
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << kWho << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::logic_error& e) {
    std::cerr << kWho << sb::harness::errorText(e) << "\n";
    return kExitBadInput;
  } catch (const c10::Error& e) {
    std::cerr << kWho << e.what_without_backtrace() << "\n";
    return kExitBadInput;
  }
}

}  // namespace

namespace sb::cli {

Command addSolveParallel(CLI::App& solve) {
  const auto a = std::make_shared<ParallelArgs>();
  auto* cmd = solve.add_subcommand(
      "parallel",
      "Composed parallelism's degrees (pp x dp_replicate x dp_shard x cp x tp, schedule, "
      "micro-batches, sp, checkpointing) for a model on N ranks, ranked by predicted step time");
  cmd->add_option("--workload", a->workload, "llama or gpt2 (a graph workload)")
      ->capture_default_str();
  cmd->add_option("--shape", a->shape,
                  "JSON, e.g. '{\"layers\": 32, \"d_model\": 4096, \"heads\": 32, ...}'")
      ->capture_default_str();
  sb::cli::addModelOptions(cmd, a->model,
                           "A traced LLaMA (torch.jit.trace(...).save) to plan instead; needed "
                           "by --verify");
  cmd->add_option("--ranks", a->ranks, "Ranks in all")
      ->required()
      ->check(wholeNumber(1, 65536, "ranks"));
  cmd->add_option("--max-memory", a->maxMemory, "Bytes per rank (0: no limit)")
      ->check(byteCount(0));
  cmd->add_option("--optimizer", a->optimizer, "adamw, sgd (with momentum) or sgd-plain")
      ->capture_default_str()
      ->check(CLI::IsMember({"adamw", "sgd", "sgd-plain"}));
  cmd->add_option("--dtype", a->dtype, "The parameters' and activations' dtype")
      ->capture_default_str();
  cmd->add_option("--schedules", a->schedules, "Pipeline schedules to consider")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved-1f1b"}));
  cmd->add_option("--ac", a->ac, "Checkpointing choices to consider")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "selective", "full"}));
  cmd->add_option("--microbatches", a->microbatches,
                  "Micro-batch counts a replica to consider under a pipeline (default: pp, 2 pp, "
                  "4 pp, 8 pp)")
      ->check(wholeNumber(1, 4096, "micro-batches"));
  cmd->add_option("--virtual-stages", a->virtualStages, "interleaved-1f1b's stages a rank")
      ->capture_default_str()
      ->check(wholeNumber(2, 8, "virtual stages"));
  cmd->add_flag("--no-cp", a->noCp, "Leave context parallelism out (a traced model: always)");
  cmd->add_flag("--no-pp", a->noPp, "Leave pipelining out");
  cmd->add_option("--profile", a->profile,
                  "Cost profile from `stratbench calibrate` (matmul, copy, collectives)")
      ->check(sb::cli::pathName());
  cmd->add_option("--gflops", a->gflops, "Matmul GFLOP/s (default 20, or the profile's)")
      ->check(realNumber(1e-6, 1e9, true, "GFLOP/s"));
  cmd->add_option("--copy-bandwidth", a->copyGBps, "Element-wise GB/s (default 10)")
      ->check(realNumber(1e-6, 1e9, true, "GB/s"));
  cmd->add_option("--kernel-us", a->kernelUs, "Microseconds a kernel launch costs (default 0)")
      ->check(realNumber(0, 1e6, false, "microseconds"));
  cmd->add_option("--intra-node-bandwidth", a->intra, "GB/s of axes inside a node (default 10)")
      ->check(realNumber(1e-6, 1e6, true, "GB/s"));
  cmd->add_option("--inter-node-bandwidth", a->inter, "GB/s of axes across nodes (default 10)")
      ->check(realNumber(1e-6, 1e6, true, "GB/s"));
  cmd->add_option("--latency", a->latency, "Microseconds a collective costs (default 10)")
      ->check(realNumber(0, 1e7, false, "microseconds"));
  cmd->add_option("--ranks-per-node", a->ranksPerNode, "Ranks of a node (innermost axes first)")
      ->capture_default_str()
      ->check(wholeNumber(1, 65536, "ranks"));
  cmd->add_option("--host-cores", a->hostCores,
                  "Ranks share this many CPU cores (0: a device each)")
      ->check(realNumber(0, 65536, false, "cores"));
  cmd->add_option("--top", a->top, "Configurations listed")
      ->capture_default_str()
      ->check(wholeNumber(1, 100000, "configurations"));
  cmd->add_option("--verify", a->verify,
                  "Run the top K (without cp) as torch/compose rows (needs --model, a PyTorch 2.x)")
      ->check(wholeNumber(0, 64, "configurations"));
  cmd->add_option("--verify-out", a->verifyDir, "With --verify: the suite and results go here")
      ->check(sb::cli::pathName());
  cmd->add_option("--steps", a->steps, "With --verify: optimizer steps a row")
      ->capture_default_str()
      ->check(wholeNumber(1, 100, "steps"));
  cmd->add_option("--repetitions", a->repetitions, "With --verify: timed repetitions a row")
      ->capture_default_str()
      ->check(wholeNumber(1, 100, "repetitions"));
  cmd->add_option("--out", a->out, "Write the search (JSON) here")->check(sb::cli::pathName());
  return {cmd, [a] { return solveParallel(*a); }};
}

}  // namespace sb::cli
