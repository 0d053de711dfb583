// The dry run of a pipeline schedule, and the run as JSON and as a Chrome trace (see
// schedule.h). Its own file: the schedules and their reading stay in schedule.cpp.

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/in_file.h"
#include "strategies/pipeline/schedule.h"

namespace sb::strategies::pipeline {
namespace {

Action act(int stage, Op op, int mb) { return Action{stage, op, mb}; }

// What an action waits for: {stage, micro-batch, which end} (kForward: its F; kBackwardInput:
// its B or I), from its own rank or, where the stage is another's, sent.
struct Dep {
  int stage, microbatch;
  Op op;
};
// At most two, in a fixed array: the dry run asks for them once per action and wake-up.
struct Deps {
  std::array<Dep, 2> d;
  int n = 0;
  const Dep* begin() const { return d.data(); }
  const Dep* end() const { return d.data() + n; }
};
Deps depsOf(const Action& a, int stages) {
  Deps d;
  if (a.op == Op::kForward) {
    if (a.stage > 0) d.d[d.n++] = {a.stage - 1, a.microbatch, Op::kForward};
  } else if (a.op == Op::kBackwardWeight) {
    d.d[d.n++] = {a.stage, a.microbatch, Op::kBackwardInput};
  } else {
    d.d[d.n++] = {a.stage, a.microbatch, Op::kForward};
    if (a.stage < stages - 1) d.d[d.n++] = {a.stage + 1, a.microbatch, Op::kBackwardInput};
  }
  return d;
}

double costUs(const StageCost& sc, Op op) {
  return op == Op::kForward         ? sc.forwardUs
         : op == Op::kBackward      ? sc.backwardUs
         : op == Op::kBackwardInput ? sc.backwardInputUs
                                    : sc.backwardWeightUs;
}

// The step (the last action's end) and the bubble (idle rank time over ranks x step) of the
// ranks' timelines.
void stepAndBubble(Simulation& sim) {
  double busy = 0;
  sim.stepUs = 0;
  for (const auto& t : sim.ranks) {
    for (const auto& ta : t.actions) sim.stepUs = std::max(sim.stepUs, ta.endUs);
    busy += t.busyUs;
  }
  const double R = static_cast<double>(sim.ranks.size());
  sim.bubbleFraction = sim.stepUs > 0 ? 1.0 - busy / (R * sim.stepUs) : 0.0;
}

// Whether some host has more of its ranks' threads than cores: then ranks slow each other.
bool oversubscribed(const Costs::Sharing& sh, int ranks) {
  if (sh.cores <= 0) return false;
  if (!sh.hostOf.empty() && sh.hostOf.size() != static_cast<size_t>(ranks)) {
    throw ScheduleError("costs: 'host_of' has " + std::to_string(sh.hostOf.size()) +
                        " entries; the schedule has " + std::to_string(ranks) +
                        " ranks (one host id per rank)");
  }
  std::map<int, int> perHost;
  for (int r = 0; r < ranks; ++r) {
    ++perHost[sh.hostOf.empty() ? 0 : sh.hostOf.at(static_cast<size_t>(r))];
  }
  for (const auto& [host, n] : perHost) {
    if (n * std::max(1, sh.threads) > sh.cores) return true;
  }
  return false;
}

// The timeline of a schedule that finishes, in time order with a host's cores as servers: every
// rank's actions in its order, each ready when its dependencies' ends (and a hop, from another
// rank) allow and its rank is free, and started when one of its host's cores is: a core runs
// one rank's action to its end at the rank's speed alone (an operating system's time slice is
// longer than a pipeline action on a CPU), the ranks waiting for a core take them in the order
// they became ready, and waiting for a core is idle time (the rank sits woken in its receive).
// The dry run in dependency order (simulate) has the same order and bytes; this replaces its
// times.
void shareCores(const Schedule& s, const Costs& c, Simulation& sim) {
  const int S = s.stages, M = s.microbatches, R = s.ranks;
  const Costs::Sharing& sh = c.sharing;
  const auto host = [&](int r) {
    return sh.hostOf.empty() ? 0 : sh.hostOf[static_cast<size_t>(r)];
  };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> fEnd(static_cast<size_t>(S) * M, inf), iEnd = fEnd;
  const auto at = [M](int st, int m) { return static_cast<size_t>(st) * M + m; };
  // When the rank's next action may start (its dependencies made and sent, the rank free), or
  // infinity while one is not made.
  std::vector<size_t> next(R, 0);
  std::vector<double> free(R, 0), ends(R, 0), started(R, 0);
  std::vector<bool> running(R, false);
  const auto readyAt = [&](int r) {
    double t = free[r];
    for (const Dep& d : depsOf(s.perRank[r][next[r]], S)) {
      const double end = (d.op == Op::kForward ? fEnd : iEnd)[at(d.stage, d.microbatch)];
      t = std::max(t, end + (s.stageRank[d.stage] != r ? c.p2pUs : 0.0));
    }
    return t;
  };
  for (auto& t : sim.ranks) {
    t.actions.clear();
    t.busyUs = 0;
  }
  // How many ranks' kernels a host's cores run at once.
  const int slots = std::max(1, static_cast<int>(sh.cores / std::max(1, sh.threads)));
  double now = 0;
  size_t left = 0;
  for (const auto& row : s.perRank) left += row.size();
  while (left > 0) {
    // The ranks whose next action is ready, in the order they became ready, each given a core
    // of its host while one is free.
    double nextStart = inf;
    std::vector<std::pair<double, int>> due;
    std::map<int, int> taken;
    for (int r = 0; r < R; ++r) {
      taken[host(r)] += running[r];
      if (running[r] || next[r] >= s.perRank[r].size()) continue;
      const double t = readyAt(r);
      if (t <= now) {
        due.emplace_back(t, r);
      } else {
        nextStart = std::min(nextStart, t);
      }
    }
    std::sort(due.begin(), due.end());
    for (const auto& [since, r] : due) {
      if (taken[host(r)] >= slots) continue;  // waits for a core
      ++taken[host(r)];
      running[r] = true;
      started[r] = now;
      const Action& a = s.perRank[r][next[r]];
      ends[r] = now + costUs(c.of(a.stage), a.op);
    }
    double t = nextStart;
    for (int r = 0; r < R; ++r) {
      if (running[r]) t = std::min(t, ends[r]);
    }
    if (!(t < inf)) {  // our bug: the dependency-order run finished this schedule
      throw std::logic_error("pipeline dry run: no rank can go on under shared cores");
    }
    for (int r = 0; r < R; ++r) {
      if (!running[r] || ends[r] > t) continue;
      const Action& a = s.perRank[r][next[r]];
      RankTimeline& tl = sim.ranks[r];
      tl.actions.push_back({a, started[r], t});
      tl.busyUs += t - started[r];
      if (a.op == Op::kForward) fEnd[at(a.stage, a.microbatch)] = t;
      if (a.op == Op::kBackward || a.op == Op::kBackwardInput) iEnd[at(a.stage, a.microbatch)] = t;
      running[r] = false;
      free[r] = t;
      ++next[r];
      --left;
    }
    now = t;
  }
  stepAndBubble(sim);
}

}  // namespace

Simulation simulate(const Schedule& s, const Costs& c) {
  const int S = s.stages, M = s.microbatches, R = s.ranks;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // End times: forward, input gradient (B or I), weight gradient (B or W).
  std::vector<double> fEnd(static_cast<size_t>(S) * M, nan), iEnd = fEnd, wEnd = fEnd;
  const auto at = [M](int st, int m) { return static_cast<size_t>(st) * M + m; };
  const auto deps = [S](const Action& a) { return depsOf(a, S); };
  const auto endOf = [&](const Dep& d) {
    return d.op == Op::kForward ? fEnd[at(d.stage, d.microbatch)] : iEnd[at(d.stage, d.microbatch)];
  };
  const auto depName = [&](const Dep& d, const Action& waiter) {
    if (d.op == Op::kForward) return act(d.stage, Op::kForward, d.microbatch).name();
    if (waiter.op == Op::kBackwardWeight) {
      return act(d.stage, Op::kBackwardInput, d.microbatch).name();
    }
    return act(d.stage, Op::kBackward, d.microbatch).name() + " (or " +
           act(d.stage, Op::kBackwardInput, d.microbatch).name() + ")";
  };
  Simulation sim;
  sim.ranks.assign(R, {});
  std::vector<size_t> next(R, 0);
  std::vector<double> clock(R, 0), live(R, 0);
  std::vector<int> inFlight(R, 0);
  std::vector<double> bytes(R, 0.0);  // live above the step's start, from the actions' Bytes
  size_t remaining = 0;
  for (const auto& row : s.perRank) remaining += row.size();
  // Event-driven: a rank blocked at an action waits on the end it misses and is woken when
  // that end is made, so every action is looked at a bounded number of times.
  std::vector<std::vector<int>> waitF(static_cast<size_t>(S) * M), waitI(waitF.size());
  std::deque<int> ready;
  for (int r = 0; r < R; ++r) ready.push_back(r);
  const auto wake = [&](std::vector<int>& waiters) {
    for (int w : waiters) ready.push_back(w);
    waiters.clear();
  };
  while (!ready.empty()) {
    const int r = ready.front();
    ready.pop_front();
    {
      while (next[r] < s.perRank[r].size()) {
        const Action& a = s.perRank[r][next[r]];
        double start = clock[r];
        const Deps needs = deps(a);  // kept: `missing` points into it
        const Dep* missing = nullptr;
        for (const Dep& d : needs) {
          const double end = endOf(d);
          if (std::isnan(end)) {
            missing = &d;
            break;
          }
          start = std::max(start, end + (s.stageRank[d.stage] != r ? c.p2pUs : 0.0));
        }
        if (missing) {
          (missing->op == Op::kForward ? waitF : waitI)[at(missing->stage, missing->microbatch)]
              .push_back(r);
          break;
        }
        const StageCost& sc = c.of(a.stage);
        const double cost = costUs(sc, a.op);
        RankTimeline& t = sim.ranks[r];
        const StageCost::Bytes& mem = a.op == Op::kForward         ? sc.forwardBytes
                                      : a.op == Op::kBackward      ? sc.backwardBytes
                                      : a.op == Op::kBackwardInput ? sc.backwardInputBytes
                                                                   : sc.backwardWeightBytes;
        t.peakBytes = std::max(t.peakBytes, bytes[r] + mem.peak);
        bytes[r] += mem.net;
        switch (a.op) {
          case Op::kForward:
            fEnd[at(a.stage, a.microbatch)] = start + cost;
            wake(waitF[at(a.stage, a.microbatch)]);
            live[r] += sc.activationBytes;
            ++inFlight[r];
            break;
          case Op::kBackward:
            iEnd[at(a.stage, a.microbatch)] = wEnd[at(a.stage, a.microbatch)] = start + cost;
            wake(waitI[at(a.stage, a.microbatch)]);
            live[r] -= sc.activationBytes;
            --inFlight[r];
            break;
          case Op::kBackwardInput:
            iEnd[at(a.stage, a.microbatch)] = start + cost;
            wake(waitI[at(a.stage, a.microbatch)]);
            live[r] -= sc.activationBytes - sc.weightGradBytes;
            --inFlight[r];
            break;
          case Op::kBackwardWeight:
            wEnd[at(a.stage, a.microbatch)] = start + cost;
            live[r] -= sc.weightGradBytes;
            break;
        }
        t.peakActivationBytes = std::max(t.peakActivationBytes, live[r]);
        t.peakMicrobatchesInFlight = std::max(t.peakMicrobatchesInFlight, inFlight[r]);
        t.actions.push_back({a, start, start + cost});
        t.busyUs += cost;
        clock[r] = start + cost;
        ++next[r];
        --remaining;
      }
    }
  }
  if (remaining > 0) {
    // Nothing can run: say who waits for what.
    for (int r = 0; r < R; ++r) {
      if (next[r] >= s.perRank[r].size()) continue;
      const Action& a = s.perRank[r][next[r]];
      for (const Dep& d : deps(a)) {
        if (!std::isnan(endOf(d))) continue;
        const int holder = s.stageRank[d.stage];
        std::string why =
            "rank " + std::to_string(r) + " waits at " + a.name() + " for " + depName(d, a) + ", ";
        if (holder == r) {
          why += "which it runs itself later (used before it is made)";
        } else if (next[holder] < s.perRank[holder].size()) {
          why += "which rank " + std::to_string(holder) + " has not run: it waits at " +
                 s.perRank[holder][next[holder]].name();
        } else {
          why += "which rank " + std::to_string(holder) + " never runs";
        }
        sim.waiting.push_back(why);
        break;
      }
    }
    // The root of it first: an action that waits for one its own rank runs later.
    sim.deadlock = sim.waiting.empty() ? "no rank can run its next action" : sim.waiting.front();
    for (const auto& w : sim.waiting) {
      if (w.find("runs itself later") != std::string::npos) {
        sim.deadlock = w;
        break;
      }
    }
    return sim;
  }
  stepAndBubble(sim);
  if (oversubscribed(c.sharing, R)) {
    shareCores(s, c, sim);
    sim.coresShared = true;
    sim.sharing = c.sharing;
  }
  return sim;
}

nlohmann::json simulationValue(const Schedule& s, const Simulation& sim) {
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < sim.ranks.size(); ++r) {
    const auto& t = sim.ranks[r];
    nlohmann::json actions = nlohmann::json::array();
    for (const auto& ta : t.actions) {
      actions.push_back(
          {{"action", ta.action.name()}, {"start_us", ta.startUs}, {"end_us", ta.endUs}});
    }
    std::vector<int> held;
    for (int st = 0; st < s.stages; ++st) {
      if (s.stageRank[st] == static_cast<int>(r)) held.push_back(st);
    }
    ranks.push_back({{"rank", r},
                     {"stages", held},
                     {"busy_us", t.busyUs},
                     {"idle_us", sim.stepUs - t.busyUs},
                     {"bubble_fraction", sim.stepUs > 0 ? 1.0 - t.busyUs / sim.stepUs : 0.0},
                     {"peak_activation_bytes", t.peakActivationBytes},
                     {"peak_bytes", t.peakBytes},
                     {"peak_microbatches_in_flight", t.peakMicrobatchesInFlight},
                     {"actions", actions}});
  }
  nlohmann::json layers = nlohmann::json::array();
  for (size_t st = 0; st + 1 < s.stageFirstLayer.size(); ++st) {
    layers.push_back({s.stageFirstLayer[st], s.stageFirstLayer[st + 1]});
  }
  nlohmann::json j = {{"schedule", s.name},
                      {"ranks", s.ranks},
                      {"stages", s.stages},
                      {"microbatches", s.microbatches},
                      {"split_backward", s.splitBackward}};
  if (!layers.empty()) j["stage_layers"] = layers;  // [first, end) of each stage
  if (!sim.deadlock.empty()) {
    j["deadlock"] = sim.deadlock;
    j["waiting"] = sim.waiting;
  } else {
    j["step_time_us"] = sim.stepUs;
    j["bubble_fraction"] = sim.bubbleFraction;
  }
  if (sim.coresShared) {  // the times are those of ranks sharing their hosts' cores
    j["shared_cores"] = {{"cores", sim.sharing.cores},
                         {"threads", sim.sharing.threads},
                         {"host_of", sim.sharing.hostOf}};
  }
  j["per_rank"] = ranks;
  return j;
}

std::string simulationJson(const Schedule& s, const Simulation& sim) {
  return simulationValue(s, sim).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

std::string chromeTrace(const Schedule& s, const Simulation& sim) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < sim.ranks.size(); ++r) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"name", "rank " + std::to_string(r)}}}});
    for (const auto& ta : sim.ranks[r].actions) {
      const char type = ta.action.name()[std::to_string(ta.action.stage).size()];
      events.push_back(
          {{"name", ta.action.name()},
           {"cat", std::string(1, type)},
           {"ph", "X"},
           {"pid", 0},
           {"tid", r},
           {"ts", ta.startUs},
           {"dur", ta.endUs - ta.startUs},
           {"args", {{"stage", ta.action.stage}, {"microbatch", ta.action.microbatch}}}});
    }
  }
  return nlohmann::json({{"traceEvents", events},
                         {"displayTimeUnit", "ms"},
                         {"otherData", {{"schedule", s.name}}}})
             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

Schedule readScheduleFile(const std::string& file) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) throw ScheduleError("cannot read " + file);
  const std::string why = harness::notARegularFile(file);
  if (!why.empty()) throw ScheduleError(file + ": " + why);
  if (std::filesystem::file_size(file, ec) > (16u << 20)) {
    throw ScheduleError(file + " is over 16 MiB");
  }
  std::ifstream in(file);
  if (!in) throw ScheduleError("cannot read " + file);
  std::stringstream text;
  text << in.rdbuf();
  Schedule schedule = readScheduleCsv(text.str(), file);
  Costs unit;
  unit.stages = {StageCost{}};
  const std::string deadlock = simulate(schedule, unit).deadlock;
  if (!deadlock.empty()) {
    throw ScheduleError(file + ": the schedule cannot finish: " + deadlock +
                        " (`stratbench solve pipeline --csv " + file + "` shows the dry run)");
  }
  return schedule;
}

}  // namespace sb::strategies::pipeline
