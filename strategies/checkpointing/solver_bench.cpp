// rotor against its reference implementation (solvers.h) on random heterogeneous chains: the
// time to solve, side by side in one run, and the bytes of each one's table. Stage times are
// uniform in [1, 10] (backward about twice the forward), activation and tape sizes in
// [1, 100] and [x, 3x], temporaries up to a fifth of them; the budget is half of what keeping
// every tape peaks at. `terms:1` adds what every profiled chain carries (chain.h): the step's
// terms (output and loss kept, d[L] held) and a taped forward's own temporaries, so rotor plans
// the chain with them and without (solvers.cpp). The reference runs only up to 200 stages (its
// time grows as L^3 with nothing to spare); 2,000 stages at 500 slots is refused by the memory
// limit, in microseconds. Whole processes, against another build and ColossalAI's C rotor:
// ci/bench/rotor_bench.py.
//
//   build/strategies/checkpoint_solver_bench --benchmark_counters_tabular=true

#include <benchmark/benchmark.h>

#include <random>

#include "strategies/checkpointing/solvers.h"

namespace {

namespace ck = sb::strategies::checkpointing;

ck::Chain randomChain(int stages, uint64_t seed, bool terms) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> time(1, 10), size(1, 100), frac(0, 0.2), tape(1, 3);
  ck::Chain c;
  for (int i = 0; i <= stages; ++i) {
    const double x = std::round(size(gen));
    c.x.push_back(x);
    c.xbar.push_back(std::round(x * tape(gen)));
    c.btmp.push_back(std::round(x * frac(gen)));
    if (i < stages) {
      const double f = time(gen);
      c.ftime.push_back(f);
      c.ftmp.push_back(std::round(x * frac(gen)));
      c.btime.push_back(2 * f * (0.8 + 0.4 * frac(gen)));
    } else {
      c.btime.push_back(1);  // the loss
    }
  }
  if (terms) {  // drawn after the rest: the plain and the profiled chain share every other value
    for (int i = 0; i < stages; ++i) {
      c.fetmp.push_back(std::round(c.ftmp[i] * (0.3 + 3.5 * frac(gen))));
    }
    c.outputKept = true;
    c.lossBytes = 8;
    c.lossGradKept = true;
  }
  return c;
}

double halfOfKeepingEverything(const ck::Chain& c) {
  return ck::solve("none", c, {}).value().predictedPeak / 2;
}

template <bool kReference>
void BM_Rotor(benchmark::State& state) {
  const int stages = static_cast<int>(state.range(0));
  const int slots = static_cast<int>(state.range(1));
  const ck::Chain chain = randomChain(stages, 42 + stages, state.range(2) != 0);
  ck::SolveOptions o;
  o.budget = halfOfKeepingEverything(chain);
  o.slots = slots;
  double time = 0;
  bool refused = false;
  for (auto _ : state) {
    try {
      const auto s = kReference ? ck::solveRotorReference(chain, o) : ck::solve("rotor", chain, o);
      time = s ? s->predictedTime : -1;
    } catch (const ck::SolverLimitError&) {
      refused = true;
    }
  }
  // The reference: a time (8 bytes) per (slots, i, l); the fast table the same per (i <= l,
  // slots) and per row its least value and where it turns finite (12 bytes), and with the
  // step's terms 2L + 1 rows more (the table without them).
  const double rows = kReference ? (stages + 1.0) * (stages + 1.0)
                                 : (stages + 1.0) * (stages + 2) / 2 +
                                       (chain.stepTermsBound() > 0 ? 2.0 * stages + 1 : 0);
  state.counters["table_MB"] = rows * ((slots + 1) * 8.0 + (kReference ? 0 : 12)) / 1e6;
  state.counters["predicted_time"] = time;
  state.counters["refused"] = refused;
}

void fast(benchmark::internal::Benchmark* b) {
  for (int stages : {20, 60, 120, 200, 500, 1000, 2000}) {
    for (int slots : {100, 500}) {
      for (int terms : {0, 1}) b->Args({stages, slots, terms});
    }
  }
}
void reference(benchmark::internal::Benchmark* b) {
  for (int stages : {20, 60, 120, 200}) {
    for (int slots : {100, 500}) {
      for (int terms : {0, 1}) b->Args({stages, slots, terms});
    }
  }
}

BENCHMARK_TEMPLATE(BM_Rotor, false)
    ->Name("rotor")
    ->Apply(fast)
    ->ArgNames({"stages", "slots", "terms"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1);
BENCHMARK_TEMPLATE(BM_Rotor, true)
    ->Name("rotor_reference")
    ->Apply(reference)
    ->ArgNames({"stages", "slots", "terms"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
