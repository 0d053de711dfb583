#pragma once

// The degree search of composed parallelism (`stratbench solve parallel`, docs/compose.md): for
// a model, a rank count, a memory limit and a cost profile, every assignment of the ranks to
// torchtitan's mesh axes (pp, dp_replicate, dp_shard, cp, tp, outermost first) with a pipeline
// schedule, a micro-batch count, sequence parallelism and activation checkpointing, priced
// (step time, per-rank peak) and ranked. Nothing is allocated: the model is a summary of its
// graph (ModelCosts, built from a reference::Graph by parallel_graph.h), the pipeline's bubble
// the dry run of strategies/pipeline/schedule.h on the configuration's stage costs.
//
// What a prediction is (and is not): an analytic model of torchtitan's composition as the
// PyTorch executor torch/compose builds it (strategies/torch/builtin_strategies.py, Compose):
//   memory  per pipeline rank: the parameters its stages hold (tp-cut weights / tp, norms
//           whole), FSDP's shard of them over dp_shard with as many gradient elements and the
//           optimizer's states (AdamW 2, SGD with momentum 1), the gathered copy FSDP keeps
//           (under a pipeline the rank's stages gathered for the whole step, with their
//           unsharded gradients accumulating over the micro-batches; without one the largest
//           unit gathered, the next prefetched and the unit's unsharded gradient before its
//           reduce-scatter: three of the largest), the activations the pipeline's dry run
//           holds at its peak (each stage's saved elements per micro-batch: inside tp regions
//           / tp, on the residual stream / tp with SP only, / cp; `ac full` keeps a block's
//           input, `ac selective` its matmul outputs), and the largest unit's activations again
//           while a checkpointed block recomputes.
//   time    the dry run of the schedule over stage costs (the stage's matmul flops at the
//           profile's rate, its element-wise traffic at the copy rate, the backward twice the
//           forward's matmuls, a recomputation where checkpointed; tp's activation collectives
//           (two a block each way: all-reduce, or SP's reduce-scatter + all-gather, equal in a
//           ring), cp's ring passes of the keys and values, the stages' sends), then FSDP's
//           gathers and reduce-scatter over dp_shard, HSDP's all-reduce over dp_replicate and
//           the optimizer's update, not overlapped with the compute. Where ranks share a host's
//           cores (a CPU run), the dry run shares them.
// The model is the families' shape, not their byte-exact replays: the verified rows (`--verify
// K`) put each prediction beside the measured step time and peak, and docs/compose.md says by
// how much they differ.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sb::strategies::compose {

// A unit the pipeline cuts at (the embedding, a block, the head), over the whole batch.
struct UnitCosts {
  std::string name;
  bool block = false;  // a repeated block (checkpointing wraps it)
  double flops = 0;    // forward matmul flops (2 m n k each)
  // Parameter elements: cut by tp (the weights of Megatron's plan), or whole on every tp rank.
  double tpParams = 0, replicatedParams = 0;
  double largestParam = 0;  // elements of its largest parameter
  // Activation elements the forward leaves for the backward, inside tp regions (between a
  // column- and a row-parallel matmul: cut by tp) and on the residual stream (cut by tp with
  // SP only); of those, the matmuls' outputs (what selective checkpointing keeps).
  double shardedActs = 0, streamActs = 0, shardedMatmulActs = 0, streamMatmulActs = 0;
  // Elements the non-matmul kernels write, by region (their time at the copy rate).
  double shardedTraffic = 0, streamTraffic = 0;
  int kernels = 0;            // kernels a forward launches
  int tpCollectives = 0;      // row-parallel matmuls: an activation collective each way
  double attentionKv = 0;     // key and value elements (context parallelism's ring passes)
  double boundaryElems = 0;   // the unit's output: what a pipeline stage sends on
};

struct ModelCosts {
  std::string workload;
  int64_t batch = 0, seq = 0, dModel = 0, heads = 0, kvHeads = 0, ffn = 0, vocab = 0;
  int64_t elementBytes = 4;
  std::vector<UnitCosts> units;  // in order: embedding, blocks, head
  nlohmann::json toJson() const;
};

// One assignment of the ranks to the mesh's axes, with the pipeline's and memory's choices.
struct ParallelConfig {
  int pp = 1, dpReplicate = 1, dpShard = 1, cp = 1, tp = 1;
  bool sp = false;
  std::string schedule;  // "" without a pipeline; gpipe, 1f1b, interleaved-1f1b
  int virtualStages = 1;
  int microbatches = 1;
  std::string ac = "none";  // none, selective, full
  int ranks() const { return pp * dpReplicate * dpShard * cp * tp; }
  int dp() const { return dpReplicate * dpShard; }
  // "pp2 1f1b M4 x dp_shard2 x tp2+sp, ac full"
  std::string label() const;
  // The mesh (axes of degree 1 left out) and its axis names, outermost first.
  std::vector<int> mesh() const;
  std::vector<std::string> axes() const;
  nlohmann::json toJson() const;
};

// Prices: a matmul rate, a copy rate and per-kernel latency for the compute; per collective a
// latency and a bandwidth, inside a node (axes whose group fits in `ranksPerNode` ranks, the
// innermost axes first) or across nodes.
struct Prices {
  double gflops = 20.0, copyGBps = 10.0, kernelUs = 0.0;
  double intraGBps = 10.0, interGBps = 10.0, latencyUs = 10.0;
  int ranksPerNode = 8;
  double hostCores = 0;  // ranks share this many cores (a CPU host); 0: a device each
};

struct SearchOptions {
  int ranks = 1;
  double memoryLimit = 0;  // bytes per rank; 0: none
  std::string optimizer = "adamw";  // adamw, sgd (with momentum), sgd-plain
  std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved-1f1b"};
  std::vector<std::string> ac = {"none", "selective", "full"};
  std::vector<int> microbatches;  // per data-parallel replica; empty: pp, 2 pp, 4 pp, 8 pp
  int virtualStages = 2;          // interleaved-1f1b's stages a rank
  bool cp = true;                 // whether cp is an axis the search may use
  bool pp = true;
  Prices prices;
  int top = 20;  // predictions kept, best first
};

struct Prediction {
  ParallelConfig config;
  double stepUs = 0;
  // The step's parts: the pipeline's dry run (compute, tp and cp collectives, sends, bubble),
  // then data parallelism's collectives and the optimizer.
  double pipelineUs = 0, computeUs = 0, tpUs = 0, cpUs = 0, ppUs = 0, dpUs = 0, optimizerUs = 0;
  double bubbleFraction = 0;
  // The peak rank's bytes and their parts.
  double peakBytes = 0;
  int peakRank = 0;  // its pipeline rank
  double paramBytes = 0, gradBytes = 0, optimizerBytes = 0, gatheredBytes = 0,
         activationBytes = 0, transientBytes = 0;
  // Bytes a rank sends and receives per step in each axis's collectives.
  std::map<std::string, double> commBytes;
  bool fits = true;
  nlohmann::json toJson() const;
};

struct SearchResult {
  std::vector<Prediction> ranked;  // fitting ones, fastest first, at most options.top
  int64_t degreeAssignments = 0;   // factorisations of the ranks into the axes
  int64_t configurations = 0;      // with schedules, micro-batches, sp, ac
  int64_t fitting = 0, overMemory = 0;
  std::map<std::string, int64_t> refused;  // by reason (a degree that does not divide, ...)
  Prediction leastMemory;                  // the configuration of least peak (over the limit)
  bool anyValid = false;
  double seconds = 0;
  nlohmann::json toJson() const;
};

// Why `c` cannot run `m` ("" when it can): a degree that does not divide what it cuts.
std::string invalidReason(const ModelCosts& m, const ParallelConfig& c);
// The prediction of one configuration. Throws std::invalid_argument with invalidReason.
Prediction predict(const ModelCosts& m, const ParallelConfig& c, const SearchOptions& o);
// Every configuration on o.ranks ranks, priced and ranked.
SearchResult search(const ModelCosts& m, const SearchOptions& o);

}  // namespace sb::strategies::compose
