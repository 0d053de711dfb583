#include "cli/solve_pipeline.h"
#include "harness/in_file.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/exit_codes.h"
#include "cli/numbers.h"
#include "harness/error.h"
#include "harness/out_file.h"
#include "strategies/checkpointing/chain.h"
#include "strategies/pipeline/schedule.h"

namespace sb::cli {
namespace {

constexpr int kExitBadInput = 2;
constexpr const char* kWho = "stratbench solve pipeline: ";

// A file named on the command line, read whole (at most 64 MiB); nullopt, having said why.
std::optional<std::string> readFile(const std::string& path, const char* option) {
  // A regular file only: a folder read as an empty schedule ("no ranks"), and opening a FIFO
  // waits for a writer that may never come.
  if (const auto why = harness::notARegularFile(path); !why.empty()) {
    std::cerr << kWho << option << " " << path << ": " << why << "\n";
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << kWho << option << " " << path << ": cannot read it\n";
    return std::nullopt;
  }
  // At most 64 MiB and one byte read: a device that never ends (/dev/zero) is refused too.
  constexpr size_t kMax = size_t{64} << 20;
  std::string text(kMax + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMax) {
    std::cerr << kWho << option << " " << path << ": over 64 MiB\n";
    return std::nullopt;
  }
  return text;
}

}  // namespace

void addPipelineOptions(CLI::App* app, PipelineArgs& a) {
  namespace pp = sb::strategies::pipeline;
  app->add_option("--schedule", a.schedule, "gpipe, 1f1b (the default), interleaved-1f1b or zb-h1")
      ->check(CLI::IsMember(pp::scheduleKinds()));
  app->add_option("--csv", a.csv,
                  "A schedule to run instead: torch.distributed.pipelining's CSV (a row of "
                  "actions per rank: 1F0, 0B3, 2I1, 2W1)")
      ->check(sb::cli::pathName());
  app->add_option("--stages", a.stages, "Pipeline ranks (stages, times --virtual-stages)")
      ->check(wholeNumber(1, 4096, "stages"));
  app->add_option("--microbatches", a.microbatches, "Micro-batches per step")
      ->check(wholeNumber(1, 100000, "micro-batches"));
  app->add_option("--virtual-stages", a.virtualStages,
                  "interleaved-1f1b: stages per rank (stage s on rank s mod --stages)")
      ->capture_default_str()
      ->check(wholeNumber(1, 64, "virtual stages"));
  app->add_option("--profile", a.profile,
                  "Per-stage costs, JSON: {\"stages\": [{\"forward_us\", \"backward_us\", "
                  "\"backward_input_us\", \"backward_weight_us\", \"activation_bytes\", "
                  "\"weight_grad_bytes\"}], \"p2p_us\"} (default: F 1, B 2, one unit each)")
      ->check(sb::cli::pathName());
  app->add_option("--chain", a.chain,
                  "Per-layer costs instead of --profile: a chain in rotor's notation (as `solve "
                  "checkpoint` reads: ftime, btime, xbar, ...), cut into the stages")
      ->check(sb::cli::pathName());
  app->add_option("--cut", a.cut,
                  "With --chain: balanced (the cut that minimises the slowest stage's forward "
                  "and backward) or layers (by layer count)")
      ->capture_default_str()
      ->check(CLI::IsMember({"balanced", "layers"}));
  app->add_option("--out", a.out, "Write the run (JSON) here (default: stdout)")
      ->check(sb::cli::pathName());
  app->add_option("--trace", a.trace, "Write a Chrome trace of the run here (Perfetto opens it)")
      ->check(sb::cli::pathName());
  app->add_option("--write-csv", a.writeCsv, "Write the schedule here, in the CSV format")
      ->check(sb::cli::pathName());
}

int solvePipeline(const PipelineArgs& a) {
  namespace pp = sb::strategies::pipeline;
  pp::Schedule schedule;
  const harness::InputFiles inputs = {
      {"--csv", a.csv}, {"--profile", a.profile}, {"--chain", a.chain}};
  try {
    for (const auto* path : {&a.out, &a.trace, &a.writeCsv}) {
      if (!path->empty()) harness::checkResultPath(*path, inputs);  // refused before any work
    }
    // Two outputs into one file: the second would overwrite the first.
    const std::vector<std::pair<const char*, const std::string*>> outs = {
        {"--out", &a.out}, {"--trace", &a.trace}, {"--write-csv", &a.writeCsv}};
    for (size_t i = 0; i < outs.size(); ++i) {
      for (size_t j = i + 1; j < outs.size(); ++j) {
        std::error_code ec;
        const bool same = !outs[i].second->empty() && !outs[j].second->empty() &&
                          (*outs[i].second == *outs[j].second ||
                           std::filesystem::weakly_canonical(*outs[i].second, ec) ==
                               std::filesystem::weakly_canonical(*outs[j].second, ec));
        if (same) {
          std::cerr << kWho << outs[i].first << " and " << outs[j].first << " name the same file '"
                    << *outs[i].second << "': give each its own\n";
          return kExitBadInput;
        }
      }
    }
    if (!a.csv.empty()) {
      if (a.stages || a.microbatches || a.virtualStages != 1 || !a.schedule.empty()) {
        std::cerr << kWho
                  << "--csv is the schedule, with its stages and micro-batches: drop --schedule, "
                     "--stages, --microbatches and --virtual-stages\n";
        return kExitBadInput;
      }
      const auto text = readFile(a.csv, "--csv");
      if (!text) return kExitBadInput;
      schedule = pp::readScheduleCsv(*text, a.csv);
    } else {
      if (!a.stages || !a.microbatches) {
        std::cerr << kWho << "--stages and --microbatches are needed (or --csv FILE)\n";
        return kExitBadInput;
      }
      schedule = pp::makeSchedule(a.schedule.empty() ? "1f1b" : a.schedule, a.stages,
                                  a.microbatches, a.virtualStages);
    }
    pp::Costs costs;
    costs.stages = {pp::StageCost{}};
    if (!a.chain.empty() && !a.profile.empty()) {
      std::cerr << kWho << "--chain and --profile both give the costs: one of them\n";
      return kExitBadInput;
    }
    if (!a.chain.empty()) {
      const auto text = readFile(a.chain, "--chain");
      if (!text) return kExitBadInput;
      namespace ck = sb::strategies::checkpointing;
      ck::Chain chain;
      try {
        chain = ck::Chain::fromJson(nlohmann::json::parse(*text), a.chain);
      } catch (const nlohmann::json::exception& e) {
        std::cerr << kWho << "--chain " << a.chain << ": not valid JSON: " << e.what() << "\n";
        return kExitBadInput;
      } catch (const ck::ChainError& e) {
        std::cerr << kWho << "--chain: " << e.what() << "\n";
        return kExitBadInput;
      }
      // A stage: its layers' forwards and backwards (the last stage the loss's too: btime[L]),
      // and their tapes (xbar[i + 1]: what layer i leaves for its backward, its output
      // included) held per micro-batch in flight.
      std::vector<double> cost;
      for (int i = 0; i < chain.length(); ++i) cost.push_back(chain.ftime[i] + chain.btime[i]);
      cost.back() += chain.btime[chain.length()];
      schedule.stageFirstLayer = a.cut == "layers" ? pp::evenStages(chain.length(), schedule.stages)
                                                   : pp::balanceStages(cost, schedule.stages);
      costs.stages.clear();
      for (int st = 0; st < schedule.stages; ++st) {
        pp::StageCost sc;  // summed from zero below (its defaults are one unit each)
        sc.forwardUs = sc.backwardUs = sc.backwardInputUs = sc.backwardWeightUs = 0;
        sc.activationBytes = sc.weightGradBytes = 0;
        for (int i = schedule.stageFirstLayer[st]; i < schedule.stageFirstLayer[st + 1]; ++i) {
          sc.forwardUs += chain.ftime[i];
          sc.backwardUs += chain.btime[i];
          sc.activationBytes += chain.xbar[i + 1];
        }
        if (st + 1 == schedule.stages) sc.backwardUs += chain.btime[chain.length()];
        sc.backwardInputUs = sc.backwardWeightUs = sc.backwardUs / 2;
        costs.stages.push_back(sc);
      }
    }
    if (!a.profile.empty()) {
      const auto text = readFile(a.profile, "--profile");
      if (!text) return kExitBadInput;
      costs = pp::Costs::fromJson(*text, a.profile, schedule.stages);
    }
    const pp::Simulation sim = pp::simulate(schedule, costs);
    // Costs near the double's limit sum past it: a step time of infinity is no answer.
    if (sim.deadlock.empty() && !std::isfinite(sim.stepUs)) {
      std::cerr << kWho << "the costs sum past what a double holds (step time " << sim.stepUs
                << " us): give the stages' times in microseconds, below 1e15\n";
      return kExitBadInput;
    }
    if (!a.writeCsv.empty())
      harness::replaceResultFile(a.writeCsv, pp::scheduleCsv(schedule), inputs);
    if (!a.trace.empty())
      harness::replaceResultFile(a.trace, pp::chromeTrace(schedule, sim), inputs);
    const std::string json = pp::simulationJson(schedule, sim);
    if (a.out.empty()) {
      std::cout << json;
    } else {
      harness::replaceResultFile(a.out, json, inputs);
    }
    if (!sim.deadlock.empty()) {
      std::cerr << kWho << schedule.name << " cannot finish: " << sim.deadlock << "\n";
      return 1;
    }
    if (!a.out.empty()) {
      std::cerr << kWho << schedule.name << ", " << schedule.ranks << " ranks, " << schedule.stages
                << " stages, " << schedule.microbatches << " micro-batches: step " << sim.stepUs
                << " us, bubble " << sim.bubbleFraction << " -> " << a.out << "\n";
    }
    return 0;
  } catch (const pp::ScheduleError& e) {
    std::cerr << kWho << e.what() << "\n";
    return kExitBadInput;
  } catch (const harness::InputError& e) {
    std::cerr << kWho << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {  // out of memory on a schedule within the bounds
    std::cerr << kWho << e.what() << "\n";
    return kExitBadInput;
  }
}

int solvePipelineMain(int argc, char** argv) {
  CLI::App app{"A pipeline schedule's dry run: deadlocks, bubble, step time, activations held",
               "stratbench solve pipeline"};
  PipelineArgs args;
  addPipelineOptions(&app, args);
  app.footer(kExitCodesText);
  try {
    app.parse(argc - 2, argv + 2);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  }
  return solvePipeline(args);
}

}  // namespace sb::cli
