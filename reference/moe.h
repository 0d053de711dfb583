#pragma once

// The mixture-of-experts layer (workload "moe", docs/moe.md): T = batch x seq tokens of width
// d_model routed to `experts` SwiGLU experts (hidden `ffn`) by a linear router without bias:
// scores softmax (or sigmoid) over the experts, each token's top_k experts, their scores as the
// gates (normalised to sum to 1 with `norm_topk`), optionally a capacity per expert
// (ceil(T k / E x capacity_factor); 0: dropless) with the assignments over it dropped, the
// lowest probabilities first (`drop: probability`, ties by position) or the latest positions
// (`drop: position`); the layer's output is each token's gated sum of its kept experts'
// outputs, in expert order. The auxiliary load-balancing loss is Switch's: E x sum_e f_e P_e,
// f_e the share of the T k assignments (before dropping) routed to e and P_e the mean over the
// tokens of e's score (sigmoid scores normalised per token first). Backward from
// (output x grad_output).sum() + aux_coef x aux.
//
// Checked: output, aux_loss, expert_index (each token's top-k experts, as the router chose
// them), kept (1 where an assignment survived the capacity), tokens_per_expert (the kept
// assignments per expert), grad_input, grad_router, grad_w1, grad_w3 (gate and up, [E, ffn,
// d_model]) and grad_w2 (down, [E, d_model, ffn]).

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "reference/workload.h"

namespace sb::reference {

struct MoeShape {
  int64_t batch = 2, seq = 8, dModel = 16, ffn = 32, experts = 4, topK = 2;
  bool sigmoid = false;    // score: softmax | sigmoid
  bool normTopk = false;   // the top-k gates normalised to sum to 1
  double capacityFactor = 0;  // 0: dropless
  bool dropByPosition = false;  // drop: probability (default) | position
  double auxCoef = 0.01;
  int64_t tokens() const { return batch * seq; }
  // ceil(T k / E x factor), computed in integers where the factor is whole; -1 dropless.
  int64_t capacity() const;
  // Throws std::invalid_argument naming the key.
  static MoeShape parse(const nlohmann::json& shape);
};

const Workload* moeWorkload();

// One expert's SwiGLU, down(silu(gate x) * up x): x [rows, d_model], w1 and w3 [ffn, d_model]
// (or an executor's rows of them), w2 [d_model, ffn] (or its columns).
at::Tensor moeExpert(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w3,
                     const at::Tensor& w2);

// The layer's forward on whole tensors (the reference's; an executor that runs the layer on one
// rank may call it): its output, the auxiliary loss (with autograd), each token's top-k experts
// [T, k], which assignments were kept [T, k] (float64 0/1) and the kept assignments per expert
// [E] (float64).
struct MoeForward {
  at::Tensor output, aux, expertIndex, kept, tokensPerExpert;
};
MoeForward moeForward(const MoeShape& s, const at::Tensor& x, const at::Tensor& router,
                      const at::Tensor& w1, const at::Tensor& w3, const at::Tensor& w2);

struct TrainingSpec;
// Training over steps (reference/training.h): the loss sum(output * target) + aux_coef x aux, the
// router and the experts stepped; target the one-step workload's grad_output. Beside training's
// tensors, every step's routing: expert_index and kept [steps, T, k], tokens_per_expert
// [steps, E].
WorkloadData buildMoeTraining(const nlohmann::json& shape, at::ScalarType dtype, uint64_t seed,
                              InputMode mode, const TrainingSpec& training);

}  // namespace sb::reference
