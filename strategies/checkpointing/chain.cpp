#include "strategies/checkpointing/chain.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace sb::strategies::checkpointing {
namespace {

struct Field {
  const char* key;
  std::vector<double> Chain::*member;
  int extra;              // length is L + extra
  bool optional = false;  // may be absent (empty)
};

const Field kFields[] = {
    {"ftime", &Chain::ftime, 0},      {"btime", &Chain::btime, 1}, {"x", &Chain::x, 1},
    {"xbar", &Chain::xbar, 1},        {"ftmp", &Chain::ftmp, 0},   {"btmp", &Chain::btmp, 1},
    {"fetmp", &Chain::fetmp, 0, true}};
// The step's terms besides the lists (chain.h).
const char* const kStepKeys[] = {"output_kept", "loss_bytes", "loss_grad_kept"};

}  // namespace

void Chain::validate(const std::string& where) const {
  const int L = length();
  if (L < 1) throw ChainError(where + ": key 'ftime': a chain needs at least one stage");
  for (const auto& f : kFields) {
    const auto& v = this->*f.member;
    if (f.optional && v.empty()) continue;
    if (static_cast<int>(v.size()) != L + f.extra) {
      throw ChainError(where + ": key '" + f.key + "' must have " + (f.extra ? "L+1 = " : "L = ") +
                       std::to_string(L + f.extra) + " values (ftime has L = " + std::to_string(L) +
                       "), found " + std::to_string(v.size()));
    }
    for (size_t i = 0; i < v.size(); ++i) {
      if (!std::isfinite(v[i]) || v[i] < 0) {
        throw ChainError(where + ": key '" + f.key + "'[" + std::to_string(i) +
                         "]: expected a non-negative number, found " + std::to_string(v[i]));
      }
    }
  }
  if (!std::isfinite(lossBytes) || lossBytes < 0) {
    throw ChainError(where + ": key 'loss_bytes': expected a non-negative number, found " +
                     std::to_string(lossBytes));
  }
  // A schedule's time adds every stage's times, a forward up to L + 1 times over: each finite
  // value can still sum past a double (1e308 twice), and the solvers then compared infinities
  // and blamed the budget.
  double total = 0;
  for (double t : ftime) total += t;
  for (double t : btime) total += t;
  if (!std::isfinite(total * (L + 1))) {
    throw ChainError(where +
                     ": keys 'ftime' and 'btime': the times sum past what a double holds "
                     "over a schedule (up to " +
                     std::to_string(L + 1) +
                     " forwards of each stage); give them in a smaller unit");
  }
  for (int i = 1; i <= L; ++i) {
    if (xbar[i] < x[i]) {
      throw ChainError(where + ": key 'xbar'[" + std::to_string(i) + "] = " +
                       std::to_string(xbar[i]) + " is smaller than x[" + std::to_string(i) +
                       "] = " + std::to_string(x[i]) + ", but it includes the stage's output");
    }
  }
}

nlohmann::json Chain::toJson() const {
  nlohmann::json j;
  for (const auto& f : kFields) {
    if (!(f.optional && (this->*f.member).empty())) j[f.key] = this->*f.member;
  }
  if (outputKept) {
    j["output_kept"] = true;
    j["loss_bytes"] = lossBytes;
  }
  if (lossGradKept) j["loss_grad_kept"] = true;
  return j;
}

Chain Chain::fromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw ChainError(where + ": expected a JSON object with the chain's keys");
  Chain c;
  for (const auto& f : kFields) {
    if (f.optional && !j.contains(f.key)) continue;
    if (!j.contains(f.key)) throw ChainError(where + ": missing key '" + f.key + "'");
    const auto& a = j.at(f.key);
    if (!a.is_array()) {
      throw ChainError(where + ": key '" + f.key + "': expected a list of numbers, found " +
                       a.dump());
    }
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_number()) {
        throw ChainError(where + ": key '" + f.key + "'[" + std::to_string(i) +
                         "]: expected a number, found " + a[i].dump());
      }
      (c.*f.member).push_back(a[i].get<double>());
    }
  }
  const auto flag = [&](const char* key) {
    if (!j.contains(key)) return false;
    if (!j.at(key).is_boolean()) {
      throw ChainError(where + ": key '" + key + "': expected true or false, found " +
                       j.at(key).dump());
    }
    return j.at(key).get<bool>();
  };
  c.outputKept = flag("output_kept");
  c.lossGradKept = flag("loss_grad_kept");
  if (j.contains("loss_bytes")) {
    if (!j.at("loss_bytes").is_number()) {
      throw ChainError(where + ": key 'loss_bytes': expected a number, found " +
                       j.at("loss_bytes").dump());
    }
    c.lossBytes = j.at("loss_bytes").get<double>();
    if (!c.outputKept) {
      throw ChainError(where +
                       ": key 'loss_bytes': only with \"output_kept\": true (the loss is "
                       "held only where the step keeps its output)");
    }
  }
  for (const auto& item : j.items()) {
    const std::string& k = item.key();
    std::string expected;
    bool known = false;
    for (const auto& f : kFields) {
      known |= k == f.key;
      expected += (expected.empty() ? "" : ", ") + std::string(f.key);
    }
    for (const char* s : kStepKeys) {
      known |= k == s;
      expected += std::string(", ") + s;
    }
    if (!known) throw ChainError(where + ": unknown key '" + k + "' (expected " + expected + ")");
  }
  c.validate(where);
  return c;
}

std::string Op::name() const {
  switch (kind) {
    case Kind::kForwardCheck:
      return "CF_" + std::to_string(stage);
    case Kind::kForwardNoGrad:
      return "Fn_" + std::to_string(stage);
    case Kind::kForwardEnable:
      return "Fe_" + std::to_string(stage);
    case Kind::kLoss:
      return "L";
    case Kind::kBackward:
      return "B_" + std::to_string(stage);
  }
  return "?";
}

Op Op::parse(const std::string& s) {
  if (s == "L") return {Kind::kLoss, 0};
  const auto us = s.find('_');
  if (us == std::string::npos)
    throw ChainError("operation '" + s + "': expected CF_i, Fn_i, Fe_i, L or B_i");
  const std::string k = s.substr(0, us);
  int stage = -1;
  try {
    size_t used = 0;
    stage = std::stoi(s.substr(us + 1), &used);
    if (used != s.size() - us - 1) stage = -1;
  } catch (const std::exception&) {
  }
  if (stage < 0) throw ChainError("operation '" + s + "': the stage must be a number >= 0");
  if (k == "CF") return {Kind::kForwardCheck, stage};
  if (k == "Fn") return {Kind::kForwardNoGrad, stage};
  if (k == "Fe") return {Kind::kForwardEnable, stage};
  if (k == "B") return {Kind::kBackward, stage};
  throw ChainError("operation '" + s + "': expected CF_i, Fn_i, Fe_i, L or B_i");
}

Simulation simulate(const Chain& chain, const std::vector<Op>& ops) {
  const int L = chain.length();
  Simulation sim;
  // What is held, by name: "x3" (an input held on its own), "xbar3", "d3" (a gradient).
  std::map<std::string, double> held;
  double current = 0;
  const auto hold = [&](const std::string& name, double size) {
    held[name] = size;
    current += size;
  };
  const auto release = [&](const std::string& name) {
    auto it = held.find(name);
    if (it == held.end()) return;
    current -= it->second;
    held.erase(it);
  };
  const auto has = [&](const std::string& name) { return held.count(name) > 0; };
  // x[i] can be read where it is held on its own or inside xbar[i].
  const auto haveX = [&](int i) {
    return has("x" + std::to_string(i)) || (i > 0 && has("xbar" + std::to_string(i)));
  };
  const auto fail = [&](size_t at, const std::string& why) {
    sim.valid = false;
    sim.problem = "operation " + std::to_string(at) + " (" + ops[at].name() + "): " + why;
    return sim;
  };

  hold("x0", chain.x[0]);
  sim.peak = current;
  bool lossDone = false;
  int forwards = 0;
  std::vector<bool> backwardDone(L, false);
  for (size_t k = 0; k < ops.size(); ++k) {
    const Op& op = ops[k];
    const int i = op.stage;
    const std::string si = std::to_string(i), sn = std::to_string(i + 1);
    if (op.isForward()) {
      if (i >= L)
        return fail(k, "there is no stage " + si + " (the chain has " + std::to_string(L) + ")");
      if (!haveX(i)) return fail(k, "its input x[" + si + "] is not held");
      ++forwards;
      sim.time += chain.ftime[i];
      if (op.kind == Op::Kind::kForwardEnable) {
        if (has("xbar" + sn)) return fail(k, "xbar[" + sn + "] is already held");
        sim.peak = std::max(sim.peak, current + chain.xbar[i + 1] + chain.taped(i));
        hold("xbar" + sn, chain.xbar[i + 1]);
      } else {
        if (has("x" + sn)) return fail(k, "x[" + sn + "] is already held");
        sim.peak = std::max(sim.peak, current + chain.x[i + 1] + chain.ftmp[i]);
        if (op.kind == Op::Kind::kForwardNoGrad) release("x" + si);
        hold("x" + sn, chain.x[i + 1]);
      }
    } else if (op.kind == Op::Kind::kLoss) {
      if (lossDone) return fail(k, "the loss already ran");
      if (!haveX(L)) return fail(k, "its input x[" + std::to_string(L) + "] is not held");
      lossDone = true;
      sim.time += chain.btime[L];
      sim.peak = std::max(sim.peak, current + chain.x[L] + chain.btmp[L]);
      if (chain.outputKept) {
        // x[L] stays, as "y" where it is held on its own, or later, when B_{L-1} frees xbar[L].
        if (has("x" + std::to_string(L))) {
          release("x" + std::to_string(L));
          hold("y", chain.x[L]);
        }
        hold("loss", chain.lossBytes);
      } else {
        release("x" + std::to_string(L));
      }
      hold("d" + std::to_string(L), chain.x[L]);
      sim.peak = std::max(sim.peak, current);
    } else {
      if (i >= L) return fail(k, "there is no stage " + si);
      if (backwardDone[i]) return fail(k, "the backward of stage " + si + " already ran");
      backwardDone[i] = true;
      if (!has("d" + sn)) return fail(k, "the gradient d[" + sn + "] is not held");
      if (!has("xbar" + sn)) return fail(k, "xbar[" + sn + "] is not held");
      if (!haveX(i)) return fail(k, "its input x[" + si + "] is not held");
      sim.time += chain.btime[i];
      sim.peak = std::max(sim.peak, current + chain.x[i] + chain.btmp[i]);
      if (!(chain.lossGradKept && i + 1 == L)) release("d" + sn);
      release("xbar" + sn);
      if (chain.outputKept && i + 1 == L && !has("y")) hold("y", chain.x[L]);
      release("x" + si);
      hold("d" + si, chain.x[i]);
    }
    sim.heldAfter.push_back(current - (has("x0") ? chain.x[0] : 0));
  }
  if (!has("d0")) {
    sim.valid = false;
    sim.problem = "the schedule ends before the backward of stage 0 produced d[0]";
    return sim;
  }
  // What the step keeps to its end (output_kept, loss_grad_kept) is not left over.
  for (const char* kept : {"y", "loss"}) held.erase(kept);
  if (chain.lossGradKept) held.erase("d" + std::to_string(L));
  if (held.size() != 1) {
    std::string left;
    for (const auto& [name, size] : held) {
      if (name != "d0") left += (left.empty() ? "" : ", ") + name;
    }
    sim.valid = false;
    sim.problem = "the schedule ends with values still held: " + left;
    return sim;
  }
  sim.valid = true;
  sim.recomputedForwards = forwards - L;
  return sim;
}

}  // namespace sb::strategies::checkpointing
