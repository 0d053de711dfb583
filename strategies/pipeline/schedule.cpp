// Pipeline schedules: the built-in ones, their CSV, their validation and stage cuts, costs
// (see schedule.h); the dry run is simulate.cpp.

#include "strategies/pipeline/schedule.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "reference/json_strict.h"

namespace sb::strategies::pipeline {
namespace {

// Bounds on what a schedule may hold, so that a hostile size or file is refused before it is
// built: ranks, stages and micro-batches, and actions in all.
constexpr int kMaxRanks = 4096;
constexpr int kMaxVirtual = 64;
constexpr int kMaxMicrobatches = 100000;
constexpr int64_t kMaxActions = 1000000;

char letter(Op op) {
  switch (op) {
    case Op::kForward:
      return 'F';
    case Op::kBackward:
      return 'B';
    case Op::kBackwardInput:
      return 'I';
    case Op::kBackwardWeight:
      return 'W';
  }
  return '?';
}

Action act(int stage, Op op, int mb) { return Action{stage, op, mb}; }

std::string str(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

std::string Action::name() const {
  return std::to_string(stage) + letter(op) + std::to_string(microbatch);
}

std::optional<Action> parseAction(const std::string& text) {
  size_t i = 0;
  const auto number = [&](int& out) {
    const size_t begin = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    if (i == begin || i - begin > 9) return false;
    out = std::stoi(text.substr(begin, i - begin));
    return true;
  };
  Action a;
  if (!number(a.stage) || i >= text.size()) return std::nullopt;
  switch (text[i++]) {
    case 'F':
      a.op = Op::kForward;
      break;
    case 'B':
      a.op = Op::kBackward;
      break;
    case 'I':
      a.op = Op::kBackwardInput;
      break;
    case 'W':
      a.op = Op::kBackwardWeight;
      break;
    default:
      return std::nullopt;
  }
  if (!number(a.microbatch) || i != text.size()) return std::nullopt;
  return a;
}

std::vector<std::string> scheduleKinds() { return {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"}; }

Schedule makeSchedule(const std::string& kind, int ranks, int microbatches, int virtualStages) {
  const auto kinds = scheduleKinds();
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
    throw ScheduleError("unknown schedule '" + kind +
                        "' (expected gpipe, 1f1b, interleaved-1f1b or zb-h1)");
  }
  if (ranks < 1 || ranks > kMaxRanks) {
    throw ScheduleError("stages must be 1 to " + std::to_string(kMaxRanks) + ", got " +
                        std::to_string(ranks));
  }
  if (microbatches < 1 || microbatches > kMaxMicrobatches) {
    throw ScheduleError("microbatches must be 1 to " + std::to_string(kMaxMicrobatches) + ", got " +
                        std::to_string(microbatches));
  }
  if (virtualStages < 1 || virtualStages > kMaxVirtual) {
    throw ScheduleError("virtual stages must be 1 to " + std::to_string(kMaxVirtual) + ", got " +
                        std::to_string(virtualStages));
  }
  if (virtualStages > 1 && kind != "interleaved-1f1b") {
    throw ScheduleError(kind + " runs one stage per rank; virtual stages are interleaved-1f1b's");
  }
  if (static_cast<int64_t>(ranks) * virtualStages * microbatches * 3 > kMaxActions) {
    throw ScheduleError("stages x virtual stages x microbatches " + std::to_string(ranks) + " x " +
                        std::to_string(virtualStages) + " x " + std::to_string(microbatches) +
                        " is over the " + std::to_string(kMaxActions / 3) +
                        " stage-micro-batches a schedule may have");
  }
  Schedule s;
  s.name = kind;
  s.ranks = ranks;
  s.microbatches = microbatches;
  s.stages = ranks * virtualStages;
  s.perRank.assign(ranks, {});
  s.splitBackward = kind == "zb-h1";
  for (int st = 0; st < s.stages; ++st) s.stageRank.push_back(st % ranks);
  const int S = s.stages, M = microbatches;
  for (int r = 0; r < ranks; ++r) {
    auto& out = s.perRank[r];
    if (kind == "gpipe") {
      for (int m = 0; m < M; ++m) out.push_back(act(r, Op::kForward, m));
      for (int m = 0; m < M; ++m) out.push_back(act(r, Op::kBackward, m));
    } else if (kind == "1f1b" || kind == "zb-h1" ||
               (kind == "interleaved-1f1b" && virtualStages == 1)) {
      // Megatron's 1F1B: S - 1 - r forwards in flight before the first backward.
      const int w = std::min(M, S - 1 - r);
      const bool split = kind == "zb-h1";
      // zb-h1 (Qi et al., 2023): stage r runs each weight gradient r input gradients after its
      // own, so that the input gradients, which the earlier stages wait for, go first; the
      // weight gradients fill the waits. Its bubble is (S - 1)(F + I - W), 1F1B's
      // (S - 1)(F + B), at the same micro-batches in flight (and up to r micro-batches' W
      // inputs held besides).
      const int delay = split ? r : 0;
      int nextW = 0;
      const auto backward = [&](int m) {
        if (!split) {
          out.push_back(act(r, Op::kBackward, m));
          return;
        }
        out.push_back(act(r, Op::kBackwardInput, m));
        while (nextW <= m - delay) out.push_back(act(r, Op::kBackwardWeight, nextW++));
      };
      for (int m = 0; m < w; ++m) out.push_back(act(r, Op::kForward, m));
      for (int i = 0; i < M - w; ++i) {
        out.push_back(act(r, Op::kForward, w + i));
        backward(i);
      }
      for (int m = M - w; m < M; ++m) backward(m);
      while (split && nextW < M) out.push_back(act(r, Op::kBackwardWeight, nextW++));
    } else {  // interleaved-1f1b, virtualStages > 1
      if (M % ranks != 0) {
        throw ScheduleError(
            "interleaved-1f1b takes micro-batches in groups of the stages: " + std::to_string(M) +
            " micro-batches over " + std::to_string(ranks) + " stages");
      }
      const int v = virtualStages, R = ranks, total = M * v;
      const auto id = [&](int k, bool backward) {
        const int group = k / (R * v), in = k % (R * v);
        int chunk = in / R;
        if (backward) chunk = v - 1 - chunk;
        return std::pair<int, int>{chunk * R + r, group * R + in % R};
      };
      // Megatron's warm-up; with one group of micro-batches, every forward first.
      const int w = M == R ? total : std::min(total, (R - r - 1) * 2 + (v - 1) * R);
      const auto fwd = [&](int k) {
        const auto [st, m] = id(k, false);
        out.push_back(act(st, Op::kForward, m));
      };
      const auto bwd = [&](int k) {
        const auto [st, m] = id(k, true);
        out.push_back(act(st, Op::kBackward, m));
      };
      for (int k = 0; k < w; ++k) fwd(k);
      for (int i = 0; i < total - w; ++i) {
        fwd(w + i);
        bwd(i);
      }
      for (int k = total - w; k < total; ++k) bwd(k);
    }
  }
  validate(s);
  return s;
}

void validate(const Schedule& s) {
  const int S = s.stages, M = s.microbatches;
  // A complete schedule has two actions (F and B) or three (F, I, W) per stage and
  // micro-batch: fewer, and some are missing; counted before anything of size S x M is made.
  int64_t actions = 0;
  for (const auto& row : s.perRank) actions += static_cast<int64_t>(row.size());
  if (static_cast<int64_t>(S) * M * 2 > actions) {
    throw ScheduleError("its actions name " + std::to_string(S) + " stages and " +
                        std::to_string(M) + " micro-batches, which take at least " +
                        std::to_string(static_cast<int64_t>(S) * M * 2) + " actions; it has " +
                        std::to_string(actions));
  }
  // Per stage and micro-batch: the ranks that run each of F, B, I, W there.
  std::vector<std::array<int, 4>> seen(static_cast<size_t>(S) * M, {0, 0, 0, 0});
  for (int r = 0; r < s.ranks; ++r) {
    for (const Action& a : s.perRank[r]) {
      if (a.stage >= S || a.microbatch >= M) {
        throw ScheduleError("rank " + std::to_string(r) + ": " + a.name() + " is outside the " +
                            std::to_string(S) + " stages and " + std::to_string(M) +
                            " micro-batches");
      }
      if (s.stageRank[a.stage] != r) {
        throw ScheduleError("rank " + std::to_string(r) + ": " + a.name() + " belongs to stage " +
                            std::to_string(a.stage) + ", which rank " +
                            std::to_string(s.stageRank[a.stage]) + " holds");
      }
      int& n = seen[static_cast<size_t>(a.stage) * M + a.microbatch][static_cast<int>(a.op)];
      if (++n > 1) {
        throw ScheduleError("rank " + std::to_string(r) + ": " + a.name() + " is repeated");
      }
    }
  }
  for (int st = 0; st < S; ++st) {
    for (int m = 0; m < M; ++m) {
      const auto& n = seen[static_cast<size_t>(st) * M + m];
      const std::string at = " (rank " + std::to_string(s.stageRank[st]) + ")";
      if (n[0] == 0) throw ScheduleError("no " + act(st, Op::kForward, m).name() + at);
      const bool full = n[1] == 1, split = n[2] == 1 || n[3] == 1;
      if (full && split) {
        throw ScheduleError(act(st, Op::kBackward, m).name() + " and " +
                            act(st, n[2] ? Op::kBackwardInput : Op::kBackwardWeight, m).name() +
                            at + ": a micro-batch's backward is B, or I and W, not both");
      }
      if (!full && !split) {
        throw ScheduleError("no backward of stage " + std::to_string(st) + ", micro-batch " +
                            std::to_string(m) + at + ": " + act(st, Op::kBackward, m).name() +
                            ", or " + act(st, Op::kBackwardInput, m).name() + " and " +
                            act(st, Op::kBackwardWeight, m).name());
      }
      if (split && (n[2] == 0 || n[3] == 0)) {
        throw ScheduleError("no " +
                            act(st, n[2] ? Op::kBackwardWeight : Op::kBackwardInput, m).name() +
                            at + ": a split backward needs both I and W");
      }
    }
  }
}

Schedule readScheduleCsv(const std::string& text, const std::string& file) {
  Schedule s;
  s.name = file;
  std::vector<std::string> lines;
  {
    std::string line;
    std::istringstream in(text);
    size_t lastFull = 0;  // lines up to the last one with an action, past which blanks trail
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(line);
      if (line.find_first_not_of(" \t,") != std::string::npos) lastFull = lines.size();
      if (lastFull > static_cast<size_t>(kMaxRanks) || lines.size() > (size_t{1} << 20)) {
        throw ScheduleError(file + ": more than " + std::to_string(kMaxRanks) + " ranks (lines)");
      }
    }
    while (!lines.empty() && lines.back().find_first_not_of(" \t,") == std::string::npos) {
      lines.pop_back();  // trailing blank lines
    }
  }
  if (lines.empty())
    throw ScheduleError(file + ": no ranks (expected one line of actions per rank)");
  if (lines.size() > static_cast<size_t>(kMaxRanks)) {
    throw ScheduleError(file + ": " + std::to_string(lines.size()) + " ranks, over " +
                        std::to_string(kMaxRanks));
  }
  s.ranks = static_cast<int>(lines.size());
  s.perRank.assign(s.ranks, {});
  std::map<int, int> rankOf;  // stage -> rank
  int64_t actions = 0;
  int maxStage = -1, maxMb = -1;
  for (size_t r = 0; r < lines.size(); ++r) {
    std::istringstream row(lines[r]);
    std::string cell;
    int k = 0;
    while (std::getline(row, cell, ',')) {
      ++k;
      const size_t b = cell.find_first_not_of(" \t"), e = cell.find_last_not_of(" \t");
      if (b == std::string::npos) continue;  // an idle slot
      cell = cell.substr(b, e - b + 1);
      const std::string where = file + ":" + std::to_string(r + 1) + ": cell " + std::to_string(k);
      const auto a = parseAction(cell);
      if (!a) {
        const bool comm = cell.find("SEND") != std::string::npos ||
                          cell.find("RECV") != std::string::npos ||
                          cell.find("SHARD") != std::string::npos;
        throw ScheduleError(
            where + ": '" + cell.substr(0, 40) + "' is not an action (expected STAGE TYPE " +
            "MICROBATCH, e.g. 1F0, TYPE one of F, B, I, W" +
            (comm ? "; communication is implied by the compute actions: the compute_only format"
                  : "") +
            ")");
      }
      if (a->stage >= kMaxRanks * kMaxVirtual || a->microbatch >= kMaxMicrobatches) {
        throw ScheduleError(where + ": " + cell + " is past " +
                            std::to_string(kMaxRanks * kMaxVirtual) + " stages or " +
                            std::to_string(kMaxMicrobatches) + " micro-batches");
      }
      if (++actions > kMaxActions) {
        throw ScheduleError(file + ": over " + std::to_string(kMaxActions) + " actions");
      }
      const auto [it, fresh] = rankOf.emplace(a->stage, static_cast<int>(r));
      if (!fresh && it->second != static_cast<int>(r)) {
        throw ScheduleError(where + ": " + cell + ": stage " + std::to_string(a->stage) +
                            " is on rank " + std::to_string(it->second) + " (line " +
                            std::to_string(it->second + 1) + ") and on rank " + std::to_string(r));
      }
      maxStage = std::max(maxStage, a->stage);
      maxMb = std::max(maxMb, a->microbatch);
      if (a->op != Op::kForward && a->op != Op::kBackward) s.splitBackward = true;
      s.perRank[r].push_back(*a);
    }
  }
  if (maxStage < 0) throw ScheduleError(file + ": no actions");
  s.stages = maxStage + 1;
  s.microbatches = maxMb + 1;
  for (int st = 0; st < s.stages; ++st) {
    const auto it = rankOf.find(st);
    if (it == rankOf.end()) {
      throw ScheduleError(file + ": stage " + std::to_string(st) +
                          " runs on no rank (stages 0 to " + std::to_string(maxStage) +
                          " are named)");
    }
    s.stageRank.push_back(it->second);
  }
  try {
    validate(s);
  } catch (const ScheduleError& e) {
    throw ScheduleError(file + ": " + e.what());
  }
  return s;
}

std::string scheduleCsv(const Schedule& s) {
  std::string out;
  for (const auto& row : s.perRank) {
    for (size_t i = 0; i < row.size(); ++i) out += (i ? "," : "") + row[i].name();
    out += "\n";
  }
  return out;
}

std::vector<int> evenStages(int layers, int stages) {
  if (stages < 1 || layers < stages || layers > 4096) {
    throw ScheduleError("cannot cut " + std::to_string(layers) + " layers into " +
                        std::to_string(stages) +
                        " stages (1 to 4096 layers, at least one a stage)");
  }
  std::vector<int> cut = {0};
  for (int st = 0; st < stages; ++st) {
    cut.push_back(cut.back() + layers / stages + (st < layers % stages ? 1 : 0));
  }
  return cut;
}

std::vector<int> balanceStages(const std::vector<double>& layerCost, int stages) {
  const int L = static_cast<int>(layerCost.size());
  evenStages(L, stages);  // the same bounds
  std::vector<double> prefix(L + 1, 0);
  for (int i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + layerCost[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: the least slowest stage of the first i layers in s stages; from[s][i]: the
  // first layer of the last of them.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> from(stages + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0;
  for (int st = 1; st <= stages; ++st) {
    for (int i = st; i <= L - (stages - st); ++i) {
      for (int j = st - 1; j < i; ++j) {
        const double v = std::max(best[st - 1][j], prefix[i] - prefix[j]);
        if (v < best[st][i]) {
          best[st][i] = v;
          from[st][i] = j;
        }
      }
    }
  }
  std::vector<int> cut(stages + 1, L);
  for (int st = stages, i = L; st > 0; --st) {
    cut[st - 1] = from[st][i];
    i = from[st][i];
  }
  return cut;
}

Costs Costs::fromJson(const std::string& text, const std::string& file, int stages) {
  nlohmann::json j;
  try {
    j = reference::parseJsonNoDuplicates(text);
  } catch (const std::exception& e) {
    throw ScheduleError(file + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw ScheduleError(file + ": expected a JSON object with key 'stages'");
  const auto number = [&](const nlohmann::json& v, const std::string& key, double hi) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0 ||
        v.get<double>() > hi) {
      throw ScheduleError(file + ": '" + key + "' must be a number from 0 to " + str(hi) +
                          ", got " + v.dump());
    }
    return v.get<double>();
  };
  // The per-action bytes' keys: <kind>_net_bytes (true) and <kind>_peak_bytes (false).
  std::map<std::string, std::pair<StageCost::Bytes StageCost::*, bool>> bytesFields;
  for (const auto& [kind, field] :
       {std::pair<const char*, StageCost::Bytes StageCost::*>{"forward", &StageCost::forwardBytes},
        {"backward", &StageCost::backwardBytes},
        {"backward_input", &StageCost::backwardInputBytes},
        {"backward_weight", &StageCost::backwardWeightBytes}}) {
    bytesFields[std::string(kind) + "_net_bytes"] = {field, true};
    bytesFields[std::string(kind) + "_peak_bytes"] = {field, false};
  }
  const auto count = [&](const nlohmann::json& v, const std::string& key, int lo) {
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > 4096) {
      throw ScheduleError(file + ": '" + key + "' must be an integer from " + str(lo) +
                          " to 4096, got " + v.dump());
    }
    return static_cast<int>(v.get<int64_t>());
  };
  Costs c;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "p2p_us") {
      c.p2pUs = number(it.value(), "p2p_us", 1e12);
    } else if (it.key() == "cores") {
      c.sharing.cores = number(it.value(), "cores", 4096);
    } else if (it.key() == "threads") {
      c.sharing.threads = count(it.value(), "threads", 1);
    } else if (it.key() == "host_of") {
      if (!it.value().is_array()) {
        throw ScheduleError(file + ": 'host_of' must be a list of one host id per rank, got " +
                            it.value().dump());
      }
      for (size_t r = 0; r < it.value().size(); ++r) {
        c.sharing.hostOf.push_back(count(it.value()[r], "host_of[" + std::to_string(r) + "]", 0));
      }
    } else if (it.key() != "stages") {
      throw ScheduleError(file + ": unknown key '" + it.key() +
                          "' (expected stages, p2p_us, cores, threads, host_of)");
    }
  }
  if (!j.contains("stages") || !j["stages"].is_array() || j["stages"].empty()) {
    throw ScheduleError(file + ": 'stages' must be a list of one cost for every stage, or of " +
                        std::to_string(stages) + " (one per stage)");
  }
  const auto& list = j["stages"];
  if (list.size() != 1 && list.size() != static_cast<size_t>(stages)) {
    throw ScheduleError(file + ": 'stages' has " + std::to_string(list.size()) +
                        " entries; the schedule has " + std::to_string(stages) +
                        " stages (one entry for all, or one per stage)");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& e = list[i];
    const std::string at = "stages[" + std::to_string(i) + "].";
    if (!e.is_object()) throw ScheduleError(file + ": " + at + " must be an object");
    StageCost sc;
    bool input = false, weight = false;
    for (auto it = e.begin(); it != e.end(); ++it) {
      const std::string& k = it.key();
      if (k == "forward_us") {
        sc.forwardUs = number(it.value(), at + k, 1e12);
      } else if (k == "backward_us") {
        sc.backwardUs = number(it.value(), at + k, 1e12);
      } else if (k == "backward_input_us") {
        sc.backwardInputUs = number(it.value(), at + k, 1e12);
        input = true;
      } else if (k == "backward_weight_us") {
        sc.backwardWeightUs = number(it.value(), at + k, 1e12);
        weight = true;
      } else if (k == "activation_bytes") {
        sc.activationBytes = number(it.value(), at + k, 1e18);
      } else if (k == "weight_grad_bytes") {
        sc.weightGradBytes = number(it.value(), at + k, 1e18);
      } else if (const auto f = bytesFields.find(k); f != bytesFields.end()) {
        StageCost::Bytes& b = sc.*(f->second.first);
        if (f->second.second) {
          // What an action leaves allocated: a backward's is negative.
          const auto& v = it.value();
          if (!v.is_number() || !std::isfinite(v.get<double>()) ||
              std::abs(v.get<double>()) > 1e18) {
            throw ScheduleError(file + ": '" + at + k +
                                "' must be a number from -1e18 to 1e18, got " + v.dump());
          }
          b.net = v.get<double>();
        } else {
          b.peak = number(it.value(), at + k, 1e18);
        }
      } else {
        throw ScheduleError(file + ": unknown key '" + at + k +
                            "' (expected forward_us, backward_us, backward_input_us, "
                            "backward_weight_us, activation_bytes, weight_grad_bytes, or "
                            "<forward|backward|backward_input|backward_weight>_<net|peak>_bytes)");
      }
    }
    // A split backward's halves: both given, or one (the other is the rest of B), or neither
    // (B split evenly).
    if (input != weight) {
      const double given = input ? sc.backwardInputUs : sc.backwardWeightUs;
      if (given > sc.backwardUs) {
        throw ScheduleError(file + ": " + at +
                            (input ? "backward_input_us " : "backward_weight_us ") + str(given) +
                            " is more than its backward_us " + str(sc.backwardUs) +
                            " (the other half is the rest of it; give both to set them apart)");
      }
      (input ? sc.backwardWeightUs : sc.backwardInputUs) = sc.backwardUs - given;
    } else if (!input) {
      sc.backwardInputUs = sc.backwardWeightUs = sc.backwardUs / 2;
    }
    if (sc.weightGradBytes > sc.activationBytes) {
      throw ScheduleError(file + ": " + at + "weight_grad_bytes " + str(sc.weightGradBytes) +
                          " is more than its activation_bytes " + str(sc.activationBytes) +
                          " (what W keeps is part of what F made)");
    }
    c.stages.push_back(sc);
  }
  return c;
}

}  // namespace sb::strategies::pipeline
