// The suite loop and runPlanned, the run's entry point (see suite_run.h and runner.h). Nothing
// here prints: the run's progress and summary go to a RunObserver (progress.h).

#include "harness/run/suite_run.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include "harness/dist/dist_env.h"
#include "harness/error.h"
#include "harness/hidden_text.h"
#include "harness/measure/device.h"
#include "harness/measure/memory.h"
#include "harness/out_file.h"
#include "harness/run/distributed_row.h"
#include "harness/run/golden.h"
#include "harness/run/row_checks.h"
#include "harness/run/run_util.h"
#include "harness/run/runner.h"
#include "reference/training.h"

namespace sb::harness {
namespace {

using Clock = std::chrono::steady_clock;

// Why this LibTorch cannot compute in `dtype` on the CPU, or "" where it can: a matrix product
// in it, once per dtype (LibTorch 1.13 has no float16 addmm on the CPU; 2.x has). A case asking
// for it is bad input said before anything runs, not a reference that fails on every row.
std::string cpuDtypeMissing(at::ScalarType dtype) {
  static std::map<at::ScalarType, std::string> known;
  if (const auto it = known.find(dtype); it != known.end()) return it->second;
  std::string why;
  try {
    const at::Tensor a = at::ones({2, 2}, at::TensorOptions().dtype(dtype));
    (void)at::addmm(a, a, a);
  } catch (const c10::Error& e) {
    why = e.what_without_backtrace();
    if (const auto nl = why.find('\n'); nl != std::string::npos) why.resize(nl);
    why = "this LibTorch (" + std::string(TORCH_VERSION) + ") has no " + dtypeName(dtype) +
          " matrix product on the CPU (" + why + ")";
  }
  return known.emplace(dtype, why).first->second;
}

// The names a run writes into --out (ResultWriter): the suite, its golden file, a cost profile,
// a case's model or plan file kept there under one of them was replaced by the results, or
// deleted with the lock (`run out/results.csv --out out` exit 0, the suite gone); --trace's
// suite folder there took the name results.csv, and the results were lost after every row ran.
// Refused before any row, through links (the file a link names is what a rename over the name
// would lose).
void checkOutHoldsNoInput(const Suite& suite, const std::vector<PlannedCase>& plan,
                          const RunOptions& options) {
  InputFiles files = {{"the suite file", suite.file}};
  if (!suite.golden.empty()) files.emplace_back("the suite's golden file", suite.golden);
  for (const auto& f : options.readFiles) files.push_back(f);
  // Every text of a case's shape and params that may name a file (shape.file, params.plan,
  // params.schedule, ...): only those at one of the run's names in --out matter below.
  for (const PlannedCase& p : plan) {
    std::vector<const nlohmann::json*> todo = {&p.spec.shape, &p.spec.params};
    for (size_t seen = 0; !todo.empty() && seen < 10000; ++seen) {
      const nlohmann::json* j = todo.back();
      todo.pop_back();
      if (j->is_string()) {
        files.emplace_back("a file case '" + p.spec.name + "' reads", j->get<std::string>());
      } else if (j->is_structured()) {
        for (const auto& v : *j) todo.push_back(&v);
      }
    }
  }
  if (!options.traceDir.empty() && !plan.empty()) {
    files.emplace_back("--trace's folder of the suite",
                       options.traceDir + "/" + traceLevels(plan.front().spec, "").front());
  }
  static const std::set<std::string> written = {"results.csv", "results.json",
                                                "results.partial.csv", "results.partial.json",
                                                ".stratbench.lock"};
  if (const auto hit = inputAmongOutputs(options.outDir, written, files)) {
    throw InputError(hit->path + " (" + hit->option + ") is " + hit->at +
                     ", a file this run writes into --out " + options.outDir +
                     " (results.csv, results.json, their .partial, .stratbench.lock): it would "
                     "be replaced; give the run another --out");
  }
}

}  // namespace

int runLoop(const Suite& suite, const std::vector<PlannedCase>& plan, const RunOptions& options,
            const Provenance& prov, RunObserver& observer, bool writes, const RowFn& row) {
  nlohmann::json runInfo = {
      {"run_id", prov.runId},       {"git_sha", prov.gitSha}, {"timestamp_utc", prov.timestampUtc},
      {"host", prov.host},          {"device", prov.device},  {"torch_version", prov.torchVersion},
      {"backend", options.backend}, {"suite", suite.name},    {"suite_file", suite.file}};
  // The suite's golden losses: read before the first row (a bad file is bad input), or, with
  // --write-golden, collected from the references and written at the end.
  std::optional<GoldenLosses> golden;
  std::map<std::string, std::vector<GoldenLosses::Step>> keptGolden;
  // What the file says of the cases this run trains, kept for one whose reference fails (it
  // errors its row; its old entry is not lost with it), where the file's header is this host's.
  std::map<std::string, std::vector<GoldenLosses::Step>> fallbackGolden;
  const std::string hostCpu = suite.golden.empty() ? "" : hostVectorFeatures();
  const int threads = hostThreads();
  if (!suite.golden.empty()) {
    if (options.writeGolden) {
      golden.emplace();
      golden->file = suite.golden;
      golden->suite = suite.name;
      golden->cpu = hostCpu;
      golden->threads = threads;
      if (writes) checkResultPath(suite.golden);
      checkGoldenTarget(suite.golden, suite.file);
      // The suite's cases this run does not train (a --filter left them out of the plan) keep
      // what the file says of them; a case no longer in the suite is dropped. The file has one
      // writer's header: entries written with other vector units or threads cannot be kept
      // under this host's, so that is refused (rewrite the whole file instead).
      std::optional<GoldenLosses> old;
      try {
        old = readGolden(suite.golden);
      } catch (const std::exception&) {
        // No file yet, or one being replaced because it is broken: nothing to keep.
      }
      // Another suite's losses are not this run's to replace (two suites naming one file: the
      // other's cases were dropped by the rewrite).
      if (old && !old->suite.empty() && old->suite != suite.name) {
        throw InputError(suite.golden + " holds the golden losses of suite '" + old->suite +
                         "', not of '" + suite.name + "': give this suite a file of its own");
      }
      for (auto& [name, steps] : old ? old->cases : decltype(old->cases){}) {
        const auto inSuite = [&](const CaseSpec& c) { return c.name == name; };
        const bool planned = std::any_of(plan.begin(), plan.end(),
                                         [&](const PlannedCase& p) { return p.spec.name == name; });
        if (planned && old->cpu == hostCpu && old->threads == threads) fallbackGolden[name] = steps;
        if (planned || std::none_of(suite.cases.begin(), suite.cases.end(), inSuite)) continue;
        if (old->cpu != hostCpu || old->threads != threads) {
          throw InputError(suite.golden + ": case '" + name +
                           "' is not run here (--filter, --case) and its losses were written with "
                           "other vector units or threads (" +
                           old->cpu + ", " + std::to_string(old->threads) +
                           " threads): they cannot be kept "
                           "under this host's header; run --write-golden without --filter");
        }
        keptGolden[name] = steps;
      }
    } else {
      try {
        golden = readGolden(suite.golden);
      } catch (const InputError& e) {
        // Whose golden file it is: the suite and the key that named it (several suites may
        // name files in one folder).
        throw InputError("suite '" + suite.name + "' (" + suite.file +
                         ", key 'golden'): " + e.what());
      }
      if (!golden->suite.empty() && golden->suite != suite.name) {
        throw InputError(suite.golden + " holds the golden losses of suite '" + golden->suite +
                         "', not of '" + suite.name + "'");
      }
      // A file that does not describe this suite's training (a case added, or its steps
      // changed, since it was written) is bad input, said before anything runs: the file is
      // stale, not the strategies that would fail against it.
      for (const PlannedCase& p : plan) {
        const CaseSpec& c = p.spec;
        if (!c.training.enabled()) continue;
        const auto it = golden->cases.find(c.name);
        if (it == golden->cases.end()) {
          throw InputError(suite.golden + ": no golden losses for case '" + c.name +
                           "', which the suite trains (write them with `stratbench run " +
                           suite.file + " --write-golden`)");
        }
        if (it->second.size() != static_cast<size_t>(c.training.steps)) {
          throw InputError(
              suite.golden + ": case '" + c.name + "' has " + std::to_string(it->second.size()) +
              " step(s) of golden losses; the "
              "suite trains it for " +
              std::to_string(c.training.steps) + " (rewrite them with `stratbench run " +
              suite.file + " --write-golden`)");
        }
      }
    }
  } else if (options.writeGolden) {
    throw InputError(suite.file +
                     ": --write-golden needs the suite's key 'golden' naming the file");
  }
  for (const PlannedCase& p : plan) {
    const CaseSpec& c = p.spec;
    if (c.device == "cuda") continue;
    if (const std::string why = cpuDtypeMissing(c.dtype); !why.empty()) {
      throw InputError(c.where() + ": case '" + c.name + "': dtype " + dtypeName(c.dtype) + ": " +
                       why + "; use float32, float64 or bfloat16 on the CPU, or device: cuda");
    }
  }
  std::optional<ResultWriter> writer;
  if (writes) {
    checkOutHoldsNoInput(suite, plan, options);  // before the lock file is made
    writer.emplace(options.outDir, runInfo);
  }
  observer.suiteStarted(suite, plan, options, prov);

  bool anyBad = false;  // a row failed or errored
  const auto runStart = Clock::now();
  // LibTorch settles its intra-op thread count lazily, at the first parallel region or
  // get_num_threads() (the threads backend's world asks). Until then OpenMP's default is in
  // force, which can differ (logical cores against LibTorch's physical ones), and BLAS splits
  // a matmul by it: a reference built before the first world would not be bitwise the
  // numbers of the same arithmetic run after it. Settled here, before the first reference.
  at::internal::lazy_init_num_threads();
  bool stopped = false;
  for (size_t i = 0; i < plan.size() && !stopped; ++i) {
    const CaseSpec& c = plan[i].spec;
    std::string goldenHow;  // how the case's reference compared with the golden file
    const auto t0 = Clock::now();
    observer.caseStarted(i, plan.size(), c);
    liveStatus().phase = "building the reference";
    reference::WorkloadData data;
    std::string buildError;
    // The reference and every strategy of the case make their tensors on its device.
    const bool onDevice = c.device == "cuda" && deviceMissing(c).empty();
    reference::setCaseDevice(onDevice ? at::Device(at::kCUDA, currentCudaDevice())
                                      : at::Device(at::kCPU));
    if (onDevice) installCudaMemoryTracking(nullptr);
    try {
      if (c.device != "cuda" || onDevice) {
        // On the threads backend every rank runs its kernels on a share of the process's
        // intra-op threads (ThreadsWorld); CPU kernels split their reductions by the thread
        // count (PyTorch 2.13's layer-norm backward does at a pipeline stage's sizes, 1.13's
        // did not), so the reference runs on that share too: the same arithmetic on the same
        // threads gives the same bits (a pipeline's one replica against gradient accumulation).
        struct ReferenceThreads {
          int was = at::get_num_threads();
          explicit ReferenceThreads(int n) {
            if (n != was) at::set_num_threads(n);
          }
          ~ReferenceThreads() {
            if (at::get_num_threads() != was) at::set_num_threads(was);
          }
        } referenceThreads(
            options.backend == "threads" && !onDevice
                ? std::max(1, at::get_num_threads() /
                                  static_cast<int>(std::max<int64_t>(1, c.meshSize())))
                : at::get_num_threads());
        const auto build = [&c](at::ScalarType dtype) {
          return c.training.enabled()
                     ? reference::buildTraining(c.workload, c.shape, dtype, c.seed, c.inputs,
                                                c.training)
                     : reference::findWorkload(c.workload)->build(c.shape, dtype, c.seed, c.inputs);
        };
        data = build(c.dtype);
        if (onDevice) synchronizeDevice();
        std::vector<const Strategy*> strategies;
        for (const auto& entry : plan[i].strategies) strategies.push_back(entry.strategy);
        measureCaseRounding(data, c, strategies, build, onDevice);
        if (golden && c.training.enabled()) {
          if (options.writeGolden) {
            try {
              golden->cases[c.name] = goldenSteps(data);
            } catch (const std::runtime_error& e) {
              buildError = std::string("golden losses: ") + e.what();
            }
          } else {
            const GoldenVerdict v = compareGolden(*golden, c, data, hostCpu, threads);
            if (!v.problem.empty()) buildError = "golden losses: " + v.problem;
            goldenHow = v.how;
          }
        }
      }
      // A reference that is not finite (a NaN weight, a log of a negative, a learning rate
      // that diverges) is the reference's failure, said as such on every row: a strategy
      // compared with NaN would be blamed for the model's own numbers.
      if (buildError.empty() && (c.device != "cuda" || onDevice)) {
        for (const auto& [name, t] : data.expected) {
          if (!t.defined() || !at::isFloatingType(t.scalar_type()) || t.numel() == 0) continue;
          if (!at::isfinite(t).all().item<bool>()) {
            const bool nan = at::isnan(t).any().item<bool>();
            buildError = "the reference is not finite: its '" + name + "' holds " +
                         (nan ? "NaN" : "infinity") +
                         " in plain LibTorch (the model, its weights, its inputs or the "
                         "optimizer's settings; no strategy is judged against it)";
            break;
          }
        }
      }
    } catch (const std::exception& e) {
      buildError = "reference failed: " + errorText(e);
      // The allocator names bytes, not the case: say which shape asked for them.
      if (dynamic_cast<const std::bad_alloc*>(&e) ||
          buildError.find("can't allocate memory") != std::string::npos ||
          buildError.find("not enough memory") != std::string::npos ||
          buildError.find("out of memory") != std::string::npos) {
        buildError += " (the case's workload " + c.workload + " at shape " + c.shape.dump() +
                      " in " + dtypeName(c.dtype) +
                      ": more memory than this machine gives; make the shape smaller)";
      }
    }
    for (size_t k = 0; k < plan[i].strategies.size(); ++k) {
      const auto& entry = plan[i].strategies[k];
      liveStatus().phase = "preparing";
      liveStatus().stepsTimed = 0;
      observer.rowStarted(k, plan[i].strategies.size(), entry.strategy->id());
      RowResult result = row(c, buildError.empty() ? &data : nullptr, buildError, *entry.strategy);
      stopped = result.stop;
      if (result.record) {
        if (!goldenHow.empty()) result.record->details["golden"] = goldenHow;
        const Record& rec = *result.record;
        if (writer) writer->add(rec);
        if (rec.status == Status::kFail || rec.status == Status::kError) anyBad = true;
        observer.rowFinished(rec);
      }
      if (stopped) break;
    }
    if (writer) writer->flush();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    observer.caseFinished(i, plan.size(), c, secs);
  }

  observer.suiteFinished(stopped);
  if (!writer) return 0;  // rank 0 carries the verdict and the exit code
  writer->commit();
  if (golden && options.writeGolden && !stopped) {
    const size_t written = golden->cases.size();
    size_t kept = 0;
    for (auto& [name, steps] : keptGolden) kept += golden->cases.emplace(name, steps).second;
    size_t failedKept = 0;
    for (auto& [name, steps] : fallbackGolden) {
      failedKept += golden->cases.emplace(name, steps).second;
    }
    replaceResultFile(suite.golden, goldenText(*golden));
    observer.note(
        "golden losses of " + std::to_string(written) + " training case(s) written to " +
        suite.golden +
        (kept ? " (" + std::to_string(kept) + " not run kept as the file had them)" : "") +
        (failedKept ? " (" + std::to_string(failedKept) +
                          " whose reference failed kept as the file had them)"
                    : ""));
  }
  observer.resultsWritten(writer->csvPath(), writer->jsonPath(),
                          std::chrono::duration<double>(Clock::now() - runStart).count());
  return anyBad || stopped ? 1 : 0;
}

namespace {

// SB_MEMORY_TRACE naming a rank no row had (3 on meshes of two) traces nothing: said at the end
// rather than leaving the user an empty trace to read.
void noteUntracedRank(RunObserver& observer) {
  const MemoryTracker& tracker = MemoryTracker::instance();
  if (tracker.tracedRank() < 0 || tracker.tracedAny()) return;
  observer.note("SB_MEMORY_TRACE=" + std::to_string(tracker.tracedRank()) +
                " traced nothing: no row of this run ran a rank " +
                std::to_string(tracker.tracedRank()) + " on this process");
}

// OMP_NUM_THREADS far above the cores (64 on 2) makes every kernel's threads wait on each other:
// a run of seconds took minutes, and its times measure the contention. Said before the first row.
void warnOversubscribed(RunObserver& observer) {
  const char* given = std::getenv("OMP_NUM_THREADS");
  if (given == nullptr) return;
  // OpenMP and LibTorch read a count of digits (99999999999 only made LibTorch's own "stoi"
  // warning, and its default was used): said in the run's words.
  // (OpenMP's list of counts per nesting level, "4,2", names the outer level first.)
  const std::string text = given;
  const std::string outer = text.substr(0, text.find(','));
  if (outer.empty() || outer.size() > 6 ||
      text.find_first_not_of("0123456789,") != std::string::npos || std::stoi(outer) < 1) {
    observer.note("warning: OMP_NUM_THREADS='" + escapeHidden(text.substr(0, 40), TextKind::kLine) +
                  "' is not a thread count from 1 to 999999: LibTorch uses its default (" +
                  std::to_string(at::get_num_threads()) + " intra-op threads)");
    return;
  }
  // The threads LibTorch took from it: PyTorch 2.13 caps the count at the cores itself (64 on 2
  // cores gives 2), LibTorch 1.13 takes what it is given.
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores == 0 || at::get_num_threads() <= static_cast<int>(cores)) return;
  observer.note("warning: OMP_NUM_THREADS=" + std::to_string(at::get_num_threads()) +
                " asks for more intra-op threads than this machine's " + std::to_string(cores) +
                " cores: the ranks' kernels contend for them, so the rows run slower and their "
                "times measure the contention (set it to at most " +
                std::to_string(cores) + ", or unset it)");
}

}  // namespace

int runPlanned(const Suite& suite, const std::vector<PlannedCase>& plan, const RunOptions& options,
               std::ostream& out) {
  // The live progress line only where someone watches: stderr a terminal (not a log, not CI).
  const char* term = std::getenv("TERM");
  ConsoleObserver console(out,
                          ::isatty(STDERR_FILENO) == 1 && !(term && std::string(term) == "dumb"));
  return runPlanned(suite, plan, options, console);
}

int runPlanned(const Suite& suite, const std::vector<PlannedCase>& plan, const RunOptions& options,
               RunObserver& observer) {
  if (options.backend == "threads") {
    // Launcher variables saying this process is one of several started together (torchrun,
    // srun, mpirun without `stratbench launch`, which refuses this itself): each process would
    // run every rank of every mesh on its own threads, the whole suite once per process into
    // one folder.
    if (const auto [world, variable] = launchedWorld(); world > 1) {
      throw InputError(variable + "=" + std::to_string(world) + " says this process is one of " +
                       std::to_string(world) +
                       " started together, but --backend threads runs every rank of a mesh as a "
                       "thread of one process: each process would run the whole suite. Use "
                       "--backend gloo (or nccl) under the launcher, or run one process without "
                       "it");
    }
    warnOversubscribed(observer);
    const Provenance prov = Provenance::collect();
    const int rc = runLoop(suite, plan, options, prov, observer, true,
                           [&](const CaseSpec& c, const reference::WorkloadData* data,
                               const std::string& buildError, const Strategy& s) -> RowResult {
                             if (!data) {
                               Record rec = baseRecord(c, s, prov, options.backend);
                               rec.status = Status::kError;
                               rec.message = buildError;
                               return {rec, false};
                             }
                             return {runStrategy(c, *data, s, prov, options), false};
                           });
    noteUntracedRank(observer);
    return rc;
  }
  return runDistributed(suite, plan, options, observer);
}

}  // namespace sb::harness
