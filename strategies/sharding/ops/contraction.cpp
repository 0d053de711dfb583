// The strategies and memory replay addmm and conv2d share (contraction.h).

#include "strategies/sharding/ops/contraction.h"

#include "strategies/sharding/ops/op_specs_common.h"

namespace sb::strategies {

std::vector<MatmulSplit> linearSplits(bool withSingleAxisBatch) {
  const std::vector<int> twoD = {2}, both = {1, 2};
  std::vector<MatmulSplit> out;
  if (withSingleAxisBatch) {  // ConvStrategyGenerator's split_input_batch comes first
    for (int a : {0, 1}) {
      out.push_back({seq({a}) + "R = " + seq({a}) + "R x RR", {a}, {}, {}, a == 0 ? both : twoD});
    }
  }
  for (auto [a, b] : kPairs) {
    out.push_back(
        {seq({a}) + seq({b}) + " = " + seq({a}) + "R x R" + seq({b}), {a}, {}, {b}, twoD});
  }
  for (auto [a, b] : kPairs) {
    out.push_back(
        {seq({a}) + "R = " + seq({a}) + seq({b}) + " x " + seq({b}) + "R", {a}, {b}, {}, twoD});
  }
  for (auto [a, b] : kPairs) {
    out.push_back(
        {"R" + seq({b}) + " = R" + seq({a}) + " x " + seq({a}) + seq({b}), {}, {a}, {b}, twoD});
  }
  for (int a : {0, 1}) {
    out.push_back(
        {"RR = R" + seq({a}) + " x " + seq({a}) + "R", {}, {a}, {}, a == 0 ? both : twoD});
  }
  for (int a : {0, 1}) {
    out.push_back({"R" + seq({a}) + " = RR x R" + seq({a}), {}, {}, {a}, a == 0 ? both : twoD});
  }
  out.push_back({"S01R = S01R x RR", {0, 1}, {}, {}, twoD});
  out.push_back({"RR = RS01 x S01R", {}, {0, 1}, {}, twoD});
  out.push_back({"RS01 = RR x RS01", {}, {}, {0, 1}, twoD});
  out.push_back({"RR = RR x RR", {}, {}, {}, both});
  if (!withSingleAxisBatch) out.push_back({"S0R = S0R x RR", {0}, {}, {}, {1}});
  return out;
}

void productMemory(MemoryReplay& m) {
  m.dropPreviousResults(false, false);
  m.alloc(m.O);
  m.reduceCopy();
  m.backwardBegins();
  m.alloc(m.sumG);
  m.gradAllReduces();
}

void contractionReplay(MemoryReplay& m, int64_t columns) {
  const int64_t O = m.O;
  m.alloc(columns);
  m.alloc(O);
  m.release(columns);
  m.release(O);
  if (!m.reduces) {
    m.alloc(O);
  } else {
    // (product, reduced copy) + bias: the product lives to the end of the expression.
    m.alloc(O);
    m.alloc(O);
    m.alloc(m.scratch(m.outPartial, O));
    m.release(m.scratch(m.outPartial, O));
    m.alloc(O);
    m.release(2 * O);
  }
  m.backwardBegins();
  m.alloc(m.sumG);
  m.alloc(columns);
  m.release(columns);
  m.gradAllReduces();
}

}  // namespace sb::strategies
