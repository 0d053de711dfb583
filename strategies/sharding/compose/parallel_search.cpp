#include "strategies/sharding/compose/parallel_search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "strategies/pipeline/schedule.h"

namespace sb::strategies::compose {
namespace {

namespace pl = sb::strategies::pipeline;

// torchtitan's axis order, outermost first.
constexpr const char* kAxes[] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

std::vector<int> degreesOf(const ParallelConfig& c) {
  return {c.pp, c.dpReplicate, c.dpShard, c.cp, c.tp};
}

// Bytes a microsecond at `gbps` GB/s.
double perUs(double gbps) { return gbps * 1e3; }

// A collective's prices on one axis of the configuration.
struct AxisPrice {
  int size = 1;
  double latencyUs = 0, bytesPerUs = 1;
  // Ring collectives: all-reduce moves 2 (g - 1) / g of the buffer through each rank, all-gather
  // and reduce-scatter (g - 1) / g of the full buffer; a send the bytes once.
  double allReduce(double bytes) const {
    return size == 1 ? 0 : latencyUs + 2.0 * (size - 1) / size * bytes / bytesPerUs;
  }
  double gather(double fullBytes) const {
    return size == 1 ? 0 : latencyUs + 1.0 * (size - 1) / size * fullBytes / bytesPerUs;
  }
  double send(double bytes) const { return latencyUs + bytes / bytesPerUs; }
};

// Axis a's prices: inside a node when its group (its degree times every inner axis's) fits in
// a node's ranks.
AxisPrice axisPrice(const ParallelConfig& c, int axis, const Prices& p) {
  const auto d = degreesOf(c);
  int64_t span = 1;
  for (size_t i = static_cast<size_t>(axis); i < d.size(); ++i) span *= d[i];
  AxisPrice a;
  a.size = d[static_cast<size_t>(axis)];
  a.latencyUs = p.latencyUs;
  a.bytesPerUs = perUs(span <= p.ranksPerNode ? p.intraGBps : p.interGBps);
  return a;
}

// Stage k's units [first, last): the units in contiguous runs as even as torch.chunk makes
// them (the first units % stages stages one more), as torch/compose cuts them.
std::vector<int> stageBounds(int units, int stages) {
  std::vector<int> b{0};
  for (int k = 0; k < stages; ++k) b.push_back(b.back() + units / stages + (k < units % stages));
  return b;
}

struct StageCosts {
  pl::StageCost cost;
  double tpUs = 0, cpUs = 0, computeUs = 0;  // per micro-batch, forward and backward
  double actElems = 0;       // saved for the backward per micro-batch (this rank's)
  double fullActElems = 0;   // a checkpointed block's whole forward, recomputed (the largest)
  double params = 0;         // this rank's elements after tp
  double largestUnitParams = 0;
  double boundaryElems = 0;  // the last unit's output, per micro-batch, this rank's
};

StageCosts stageCosts(const ModelCosts& m, const ParallelConfig& c, int first, int last,
                      const Prices& p) {
  StageCosts s;
  // Its defaults are the uniform dry run's units.
  s.cost.forwardUs = s.cost.backwardUs = s.cost.activationBytes = 0;
  const double f = 1.0 / (static_cast<double>(c.dp()) * c.microbatches);
  const double tp = c.tp, stream = c.sp ? c.tp : 1, cp = c.cp;
  const double e = static_cast<double>(m.elementBytes);
  const AxisPrice tpAxis = axisPrice(c, 4, p), cpAxis = axisPrice(c, 3, p);
  const double actBytes = static_cast<double>(m.batch) * m.seq * m.dModel * f / cp * e;
  for (int i = first; i < last; ++i) {
    const UnitCosts& u = m.units[static_cast<size_t>(i)];
    const double mm = u.flops * f / (tp * cp) / (p.gflops * 1e3);
    const double traffic =
        (u.shardedTraffic / tp + u.streamTraffic / stream) * f / cp * e / perUs(p.copyGBps);
    const double launch = u.kernels * p.kernelUs;
    const double tpOne = u.tpCollectives * tpAxis.allReduce(actBytes);
    // Ring attention: cp - 1 passes of this rank's keys and values each way (the backward's
    // with their gradients: twice the bytes).
    const double kv = u.attentionKv * f / (tp * cp) * e;
    const double cpOne = c.cp > 1 ? (c.cp - 1) * cpAxis.send(kv) : 0;
    // Each phase's compute, tp and cp parts: the backward twice the forward's kernels (its cp
    // passes twice the bytes), a checkpointed block's recomputation on top (full: the whole
    // forward, its collectives included; selective: all but the matmuls).
    const bool checkpointed = u.block && c.ac != "none";
    const bool full = checkpointed && c.ac == "full";
    const double fwdCompute = mm + traffic + launch;
    const double bwdCompute = 2 * fwdCompute + (full           ? fwdCompute
                                                 : checkpointed ? traffic + launch
                                                                : 0);
    const double fwdTp = tpOne, bwdTp = tpOne + (full ? tpOne : 0);
    const double fwdCp = cpOne, bwdCp = 2 * cpOne + (full ? cpOne : 0);
    s.computeUs += fwdCompute + bwdCompute;
    s.tpUs += fwdTp + bwdTp;
    s.cpUs += fwdCp + bwdCp;
    s.cost.forwardUs += fwdCompute + fwdTp + fwdCp;
    s.cost.backwardUs += bwdCompute + bwdTp + bwdCp;
    const double all = (u.shardedActs / tp + u.streamActs / stream) * f / cp;
    const double kept =
        !checkpointed       ? all
        : c.ac == "full"    ? u.boundaryElems * f / cp / stream  // the block's input (its
                                                                 // predecessor's output)
                            : (u.shardedMatmulActs / tp + u.streamMatmulActs / stream) * f / cp +
                               u.boundaryElems * f / cp / stream;
    s.actElems += kept;
    if (checkpointed) s.fullActElems = std::max(s.fullActElems, all);
    const double params = u.tpParams / tp + u.replicatedParams;
    s.params += params;
    s.largestUnitParams = std::max(s.largestUnitParams, params);
    s.boundaryElems = u.boundaryElems * f / cp / stream;
  }
  s.cost.backwardInputUs = s.cost.backwardWeightUs = s.cost.backwardUs / 2;
  s.cost.activationBytes = s.actElems * e;
  return s;
}

int optimizerStates(const std::string& optimizer) {
  return optimizer == "adamw" ? 2 : optimizer == "sgd" ? 1 : 0;
}

}  // namespace

std::string ParallelConfig::label() const {
  std::string s;
  const auto add = [&s](const std::string& part) { s += (s.empty() ? "" : " x ") + part; };
  if (pp > 1) {
    add("pp" + std::to_string(pp) + " " + schedule +
        (virtualStages > 1 ? " v" + std::to_string(virtualStages) : "") + " M" +
        std::to_string(microbatches));
  }
  if (dpReplicate > 1) add("dp_replicate" + std::to_string(dpReplicate));
  if (dpShard > 1) add("dp_shard" + std::to_string(dpShard));
  if (cp > 1) add("cp" + std::to_string(cp));
  if (tp > 1) add("tp" + std::to_string(tp) + (sp ? "+sp" : ""));
  if (s.empty()) s = "one rank";
  return s + ", ac " + ac;
}

std::vector<int> ParallelConfig::mesh() const {
  std::vector<int> out;
  for (int d : degreesOf(*this)) {
    if (d > 1) out.push_back(d);
  }
  return out;
}

std::vector<std::string> ParallelConfig::axes() const {
  std::vector<std::string> out;
  const auto d = degreesOf(*this);
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] > 1) out.emplace_back(kAxes[i]);
  }
  return out;
}

nlohmann::json ParallelConfig::toJson() const {
  return {{"label", label()},
          {"pp", pp},
          {"dp_replicate", dpReplicate},
          {"dp_shard", dpShard},
          {"cp", cp},
          {"tp", tp},
          {"sp", sp},
          {"schedule", schedule},
          {"virtual_stages", virtualStages},
          {"microbatches", microbatches},
          {"ac", ac},
          {"mesh", mesh()},
          {"axes", axes()}};
}

nlohmann::json ModelCosts::toJson() const {
  nlohmann::json units_ = nlohmann::json::array();
  for (const auto& u : units) {
    units_.push_back({{"name", u.name},
                      {"block", u.block},
                      {"flops", u.flops},
                      {"tp_params", u.tpParams},
                      {"replicated_params", u.replicatedParams},
                      {"sharded_acts", u.shardedActs},
                      {"stream_acts", u.streamActs},
                      {"sharded_matmul_acts", u.shardedMatmulActs},
                      {"stream_matmul_acts", u.streamMatmulActs},
                      {"tp_collectives", u.tpCollectives},
                      {"attention_kv", u.attentionKv},
                      {"boundary", u.boundaryElems}});
  }
  return {{"workload", workload}, {"batch", batch}, {"seq", seq},     {"d_model", dModel},
          {"heads", heads},       {"kv_heads", kvHeads}, {"ffn", ffn}, {"vocab", vocab},
          {"element_bytes", elementBytes}, {"units", units_}};
}

nlohmann::json Prediction::toJson() const {
  return {{"config", config.toJson()},
          {"step_us", stepUs},
          {"pipeline_us", pipelineUs},
          {"compute_us", computeUs},
          {"tp_us", tpUs},
          {"cp_us", cpUs},
          {"pp_us", ppUs},
          {"dp_us", dpUs},
          {"optimizer_us", optimizerUs},
          {"bubble_fraction", bubbleFraction},
          {"peak_bytes", peakBytes},
          {"peak_pp_rank", peakRank},
          {"memory",
           {{"params", paramBytes},
            {"grads", gradBytes},
            {"optimizer", optimizerBytes},
            {"gathered", gatheredBytes},
            {"activations", activationBytes},
            {"transient", transientBytes}}},
          {"comm_bytes", commBytes},
          {"fits", fits}};
}

nlohmann::json SearchResult::toJson() const {
  nlohmann::json r = nlohmann::json::array();
  for (const auto& p : ranked) r.push_back(p.toJson());
  nlohmann::json j = {{"degree_assignments", degreeAssignments},
                      {"configurations", configurations},
                      {"fitting", fitting},
                      {"over_memory", overMemory},
                      {"refused", refused},
                      {"seconds", seconds},
                      {"ranked", r}};
  if (anyValid) j["least_memory"] = leastMemory.toJson();
  return j;
}

std::string invalidReason(const ModelCosts& m, const ParallelConfig& c) {
  const auto divides = [](int64_t d, int64_t n) { return d >= 1 && n % d == 0; };
  for (int d : degreesOf(c)) {
    if (d < 1) return "a degree below 1";
  }
  if (!divides(c.tp, m.heads) || !divides(c.tp, m.kvHeads))
    return "tp does not divide the heads and kv heads";
  if (!divides(c.tp, m.ffn) || !divides(c.tp, m.vocab) || !divides(c.tp, m.dModel))
    return "tp does not divide d_model, ffn and vocab";
  if (c.cp > 1 && !divides(2 * c.cp, m.seq))
    return "cp's causal load balancing needs 2 cp chunks of the sequence";
  if (c.sp && (c.tp == 1 || !divides(c.tp, m.seq / c.cp)))
    return "sp needs tp > 1 dividing the sequence";
  if (c.dpReplicate > 1 && c.dpShard == 1) return "HSDP needs a dp_shard axis beside dp_replicate";
  if (!divides(c.dp(), m.batch)) return "the data-parallel ranks do not divide the batch";
  if (!divides(c.microbatches, m.batch / c.dp()))
    return "the micro-batches do not divide a replica's rows";
  if (c.pp == 1 && (c.microbatches != 1 || !c.schedule.empty() || c.virtualStages != 1))
    return "micro-batches and schedules are a pipeline's";
  if (c.pp > 1) {
    const int stages = c.pp * c.virtualStages;
    if (static_cast<int>(m.units.size()) < stages) return "fewer units than pipeline stages";
  }
  if (c.ac != "none" && c.ac != "full" && c.ac != "selective") return "ac is none, full or selective";
  return "";
}

Prediction predict(const ModelCosts& m, const ParallelConfig& c, const SearchOptions& o) {
  const std::string why = invalidReason(m, c);
  if (!why.empty()) throw std::invalid_argument(c.label() + ": " + why);
  const Prices& p = o.prices;
  const double e = static_cast<double>(m.elementBytes);
  Prediction out;
  out.config = c;
  const int units = static_cast<int>(m.units.size());
  const int stages = c.pp * c.virtualStages;
  const std::vector<int> bounds = stageBounds(units, stages);
  std::vector<StageCosts> perStage;
  for (int k = 0; k < stages; ++k) perStage.push_back(stageCosts(m, c, bounds[k], bounds[k + 1], p));

  // The pipeline's dry run (one stage: its forward and backward).
  std::vector<double> peakActs(static_cast<size_t>(c.pp), 0.0);
  const AxisPrice ppAxis = axisPrice(c, 0, p);
  if (c.pp == 1) {
    out.pipelineUs = perStage[0].cost.forwardUs + perStage[0].cost.backwardUs;
    peakActs[0] = perStage[0].cost.activationBytes;
  } else {
    const pl::Schedule s = pl::makeSchedule(c.schedule, c.pp, c.microbatches, c.virtualStages);
    pl::Costs costs;
    for (const auto& st : perStage) costs.stages.push_back(st.cost);
    // A send of a stage's output (or its gradient) to the next rank: every stage's but the
    // last's (the head's logits are never sent).
    double boundary = 0;
    for (size_t k = 0; k + 1 < perStage.size(); ++k) {
      boundary = std::max(boundary, perStage[k].boundaryElems);
    }
    costs.p2pUs = ppAxis.send(boundary * e);
    if (p.hostCores > 0) {
      costs.sharing.cores = p.hostCores / (static_cast<double>(c.ranks()) / c.pp);
    }
    const pl::Simulation sim = pl::simulate(s, costs);
    if (!sim.deadlock.empty()) throw std::invalid_argument(c.label() + ": " + sim.deadlock);
    out.pipelineUs = sim.stepUs;
    out.bubbleFraction = sim.bubbleFraction;
    for (int r = 0; r < c.pp; ++r) peakActs[static_cast<size_t>(r)] = sim.ranks[r].peakActivationBytes;
    out.ppUs = 2.0 * c.microbatches * costs.p2pUs;  // each boundary's sends, per rank
    out.commBytes["pp"] = 2.0 * c.microbatches * boundary * e;
  }
  // Where ranks share a host's cores without a pipeline, every rank's compute is stretched by
  // the oversubscription (the dry run does it with one).
  if (c.pp == 1 && p.hostCores > 0 && c.ranks() > p.hostCores) {
    out.pipelineUs *= c.ranks() / p.hostCores;
  }

  // Per pipeline rank: its stages' memory and data-parallel traffic; the step's slowest rank.
  const int nStates = optimizerStates(o.optimizer);
  const AxisPrice shard = axisPrice(c, 2, p), replicate = axisPrice(c, 1, p);
  const bool fsdp = c.dpShard > 1;
  double dpUs = 0, optUs = 0;
  out.peakBytes = -1;
  for (int r = 0; r < c.pp; ++r) {
    double params = 0, largest = 0, fullAct = 0, compute = 0, tpUs = 0, cpUs = 0;
    for (int k = r; k < stages; k += c.pp) {
      const StageCosts& st = perStage[static_cast<size_t>(k)];
      params += st.params;
      largest = std::max(largest, st.largestUnitParams);
      fullAct = std::max(fullAct, st.fullActElems);
      compute += st.computeUs * c.microbatches;
      tpUs += st.tpUs * c.microbatches;
      cpUs += st.cpUs * c.microbatches;
    }
    const double sharded = params / c.dpShard * e;
    // FSDP: under a pipeline the stages stay gathered for the step, their unsharded gradients
    // accumulating over the micro-batches; without one a unit is gathered at a time, the next
    // prefetched, its unsharded gradient reduce-scattered.
    const double gathered = !fsdp ? 0 : c.pp > 1 ? 2 * params * e : 3 * largest * e;
    const double transient = fullAct * e;
    const double peak =
        sharded * (2 + nStates) + gathered + peakActs[static_cast<size_t>(r)] + transient;
    if (peak > out.peakBytes) {
      out.peakBytes = peak;
      out.peakRank = r;
      out.paramBytes = sharded;
      out.gradBytes = sharded;
      out.optimizerBytes = sharded * nStates;
      out.gatheredBytes = gathered;
      out.activationBytes = peakActs[static_cast<size_t>(r)];
      out.transientBytes = transient;
    }
    // FSDP gathers the parameters for the forward (and again for the backward without a
    // pipeline) and reduce-scatters the gradients; HSDP all-reduces the shards.
    double rankDp = 0;
    if (fsdp) rankDp += (c.pp > 1 ? 2 : 3) * shard.gather(params * e);
    rankDp += replicate.allReduce(sharded);
    // The optimizer reads and writes the parameter, its gradient and states.
    const double rankOpt = (2.0 + 2.0 * nStates) * sharded / perUs(p.copyGBps);
    if (rankDp + rankOpt > dpUs + optUs) {
      dpUs = rankDp;
      optUs = rankOpt;
    }
    if (r == out.peakRank) {
      out.computeUs = compute;
      out.tpUs = tpUs;
      out.cpUs = cpUs;
      if (fsdp) out.commBytes["dp_shard"] = (c.pp > 1 ? 2 : 3) * params * e;
      if (c.dpReplicate > 1) out.commBytes["dp_replicate"] = 2 * sharded;
    }
  }
  const double actBytes = static_cast<double>(m.batch) * m.seq * m.dModel / c.dp() / c.cp * e;
  if (c.tp > 1) {
    int collectives = 0;
    for (const auto& u : m.units) collectives += u.tpCollectives;
    out.commBytes["tp"] = 2.0 * collectives / c.pp * 2.0 * actBytes;
  }
  if (c.cp > 1) {
    double kv = 0;
    for (const auto& u : m.units) kv += u.attentionKv;
    out.commBytes["cp"] = 3.0 * (c.cp - 1) * kv / c.dp() / (c.tp * c.cp) / c.pp * e;
  }
  out.dpUs = dpUs;
  out.optimizerUs = optUs;
  out.stepUs = out.pipelineUs + dpUs + optUs;
  out.fits = o.memoryLimit <= 0 || out.peakBytes <= o.memoryLimit;
  return out;
}

SearchResult search(const ModelCosts& m, const SearchOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  SearchResult res;
  if (o.ranks < 1) throw std::invalid_argument("ranks must be at least 1");
  std::vector<int> divisors;
  for (int d = 1; d <= o.ranks; ++d) {
    if (o.ranks % d == 0) divisors.push_back(d);
  }
  std::vector<Prediction> fitting;
  for (int pp : divisors) {
    if (!o.pp && pp > 1) continue;
    for (int dr : divisors) {
      if ((o.ranks / pp) % dr) continue;
      for (int ds : divisors) {
        if ((o.ranks / pp / dr) % ds) continue;
        for (int cp : divisors) {
          if ((o.ranks / pp / dr / ds) % cp) continue;
          if (!o.cp && cp > 1) continue;
          const int tp = o.ranks / pp / dr / ds / cp;
          ++res.degreeAssignments;
          ParallelConfig base;
          base.pp = pp;
          base.dpReplicate = dr;
          base.dpShard = ds;
          base.cp = cp;
          base.tp = tp;
          std::vector<ParallelConfig> configs;
          std::vector<std::pair<std::string, int>> schedules;
          std::vector<int> mbs;
          if (pp == 1) {
            schedules.push_back({"", 1});
            mbs.push_back(1);
          } else {
            for (const auto& s : o.schedules) {
              schedules.push_back({s, s == "interleaved-1f1b" ? o.virtualStages : 1});
            }
            if (!o.microbatches.empty()) {
              mbs = o.microbatches;
            } else {
              for (int k : {1, 2, 4, 8}) mbs.push_back(k * pp);
            }
          }
          for (const auto& [sched, v] : schedules) {
            for (int mb : mbs) {
              for (bool sp : tp > 1 ? std::vector<bool>{true, false} : std::vector<bool>{false}) {
                for (const auto& ac : o.ac) {
                  ParallelConfig c = base;
                  c.schedule = sched;
                  c.virtualStages = v;
                  c.microbatches = mb;
                  c.sp = sp;
                  c.ac = ac;
                  configs.push_back(c);
                }
              }
            }
          }
          for (const auto& c : configs) {
            ++res.configurations;
            const std::string why = invalidReason(m, c);
            if (!why.empty()) {
              ++res.refused[why];
              continue;
            }
            Prediction pr;
            try {
              pr = predict(m, c, o);
            } catch (const pl::ScheduleError& e) {
              ++res.refused[std::string("the schedule: ") + e.what()];
              continue;
            } catch (const std::invalid_argument& e) {
              ++res.refused["the schedule cannot finish"];
              continue;
            }
            if (!res.anyValid || pr.peakBytes < res.leastMemory.peakBytes) res.leastMemory = pr;
            res.anyValid = true;
            if (!pr.fits) {
              ++res.overMemory;
              continue;
            }
            ++res.fitting;
            fitting.push_back(std::move(pr));
          }
        }
      }
    }
  }
  // Fastest first; ties by less memory, then by the label (a stable order to read).
  std::sort(fitting.begin(), fitting.end(), [](const Prediction& a, const Prediction& b) {
    if (a.stepUs != b.stepUs) return a.stepUs < b.stepUs;
    if (a.peakBytes != b.peakBytes) return a.peakBytes < b.peakBytes;
    return a.config.label() < b.config.label();
  });
  if (static_cast<int>(fitting.size()) > o.top) fitting.resize(static_cast<size_t>(o.top));
  res.ranked = std::move(fitting);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

}  // namespace sb::strategies::compose
