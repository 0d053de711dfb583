#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "reference/workload.h"

namespace sb::reference {

// An Evoformer-style pair stack (AlphaFold 2's pair track) on z = [batch, n, n, c], each layer
// a triangle multiplicative update ("outgoing edges") and a pair transition, both residual:
//
//   zn = LN(z)
//   a = sigmoid(zn Wag) * (zn Wa),  b = sigmoid(zn Wbg) * (zn Wb)      [batch, n, n, h]
//   x[i, j] = sum_k a[i, k] * b[j, k]                                  [batch, n, n, h]
//   z = z + sigmoid(zn Wg) * (LN(x) Wo)
//   z = z + relu(LN(z) W1) W2
//
// x's row i needs a's row i and every row of b; its column j every row of a and b's row j:
// the update can be chunked over i (dimension 1) or over j (dimension 2).
struct PairShape {
  int64_t batch = 1, n = 64, c = 32, hidden = 32, layers = 1;
  bool training = false;
  static PairShape parse(const nlohmann::json& shape);  // throws naming the key
  std::string toString() const;
};

class PairStack {
 public:
  PairShape shape;

  PairStack(const PairShape& shape, at::ScalarType dtype, uint64_t seed);
  int layers() const { return static_cast<int>(layers_.size()); }

  at::Tensor normIn(int l, const at::Tensor& z) const;  // zn = LN(z)
  at::Tensor projA(int l, const at::Tensor& zn) const;  // a, for the rows of zn given
  at::Tensor projB(int l, const at::Tensor& zn) const;  // b
  // The update's output for the rows of x that `a` and `b` give (a's rows i, b's rows j) and
  // `znOut`, zn at those output positions: sigmoid(znOut Wg) * (LN(x) Wo).
  at::Tensor triangleOut(int l, const at::Tensor& a, const at::Tensor& b,
                         const at::Tensor& znOut) const;
  at::Tensor transition(int l, const at::Tensor& z) const;  // z + relu(LN(z) W1) W2
  at::Tensor layer(int l, const at::Tensor& z) const;       // unchunked
  at::Tensor forward(const at::Tensor& z) const;

  const std::vector<std::pair<std::string, at::Tensor>>& parameters() const { return params_; }
  const at::Tensor& input() const { return input_; }
  const at::Tensor& target() const { return target_; }
  void zeroGrad() const;

 private:
  struct Layer {
    at::Tensor lnw, lnb, wag, bag, wa, ba, wbg, bbg, wb, bb, lnxw, lnxb, wo, bo, wg, bg;
    at::Tensor lntw, lntb, w1, b1, w2, b2;
  };
  at::Tensor param(const std::string& name, at::Tensor value);
  std::vector<Layer> layers_;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  at::Tensor input_, target_;
};

const Workload* evoformerPairWorkload();  // "evoformer_pair"

}  // namespace sb::reference
