// The memory model of ShardedTensor's sharded Linear (sharded_tensor_common.h): each step's
// allocations, in order, as one token per allocation (+) or release (-) in terms of this rank's
// sizes, recorded with SB_MEMORY_TRACE over 7 shapes (even and uneven chunks) on 2 and 4 ranks
// (threads) or 4 ranks (gloo, whose all-gather and reduce-scatter allocate a buffer per rank)
// and the same for all of them. The tokens:
//   X    the rank's input rows, [b, K]            AG    all of them gathered, [n b, K]
//   W    its weight chunk                         BIAS  the bias, [N]
//   Y    its output rows, [b, N]                  P     colwise: its chunk's columns of every
//                                                       rank's rows, [n_c, n b]
//   GOT  rowwise: its features of every rank's rows, [n k_c, b]
//   PART rowwise: the partial products of every rank's rows, [n b, N]
//   PC   colwise: P made contiguous from its transpose, a copy where the chunk has more than
//        one column (one column's transpose is already contiguous: no copy, nothing freed)
//   GC   rowwise: GOT made contiguous from its transpose, a copy where the rank's features are
//        more than one (one feature's transpose is contiguous: no copy, nothing freed)
//   GT   rowwise: where there is no such copy, the product copies its strided operand itself
//        for the time it runs
//   S8, S4, ZERO   scalars and empty tensors
//   MMF, MMA, MMB  the scratch the forward product and the backward's two products hold while
//                  they run (matmulScratchBytes): zero where LibTorch's product allocates none
//                  through the CPU allocator (float32 and float64 on every CPU, bfloat16
//                  without AVX-512); oneDNN's scratch pad where bfloat16 runs on oneDNN.
// The first tokens release the previous step's results (output and gradients). "reordered" is a
// placement other than rank order, which adds the index_select that puts chunks in order.

#include "strategies/sharding/sharded_tensor/common.h"
#include "strategies/sharding/sharding_util.h"

namespace sb::strategies {
namespace {

struct MemoryTable {
  const char* backend;
  const char* kind;
  bool reordered;
  int ranks;  // 0: any
  const char* tokens;
};

const MemoryTable kTables[] = {
    {"threads", "colwise", false, 0,
     "-Y -X -W -BIAS +AG +P +MMF -MMF +PC +Y +Y +BIAS +BIAS +BIAS -BIAS -BIAS +Y +P -Y +PC -PC +AG "
     "+MMA -MMA +W +MMB -MMB -P +X -AG -Y -P -PC -AG "},
    {"threads", "rowwise", false, 0,
     "-Y -X -W -BIAS +X +GOT -X +GC +PART +GT -GT +MMF -MMF +Y +Y -Y +BIAS +BIAS +BIAS -BIAS -BIAS "
     "+PART +W +MMA -MMA +GT -GT +GOT +MMB -MMB -PART +GC -GC +X -GOT +X -X -PART -GOT -GC "},
    {"threads", "colwise", true, 4,
     "-Y -X -W -BIAS +AG +P +MMF -MMF +PC +Y +ZERO +Y -Y +Y +BIAS +BIAS +BIAS -BIAS -BIAS +Y +P -Y "
     "+PC -PC +AG +MMA -MMA +W +MMB -MMB -P +X -AG -Y -P -PC -AG "},
    {"threads", "rowwise", true, 4,
     "-Y -X -W -BIAS +ZERO +X +GOT +GC +PART +GT -GT +MMF -MMF +Y +Y -Y +BIAS +BIAS +BIAS -BIAS "
     "-BIAS +PART +W +MMA -MMA +GT -GT +GOT +MMB -MMB -PART +GC -GC +X -GOT +X -X +X -X -PART -GOT "
     "-GC -X "},
    {"gloo", "colwise", false, 4,
     "-Y -X -W -BIAS +X +X +X +X +AG -X -X -X -X +P +MMF -MMF +PC +Y +Y +BIAS +BIAS -BIAS +Y +P -Y "
     "+PC -PC +AG +MMA -MMA +W +MMB -MMB -P +AG +X -AG -AG -Y -P -PC -AG "},
    {"gloo", "rowwise", false, 4,
     "-Y -X -W -BIAS +X +GOT -X +GC +PART +GT -GT +MMF -MMF +PART +Y -PART +Y -Y +BIAS +BIAS -BIAS "
     "+Y +Y +Y +Y +PART -Y -Y -Y -Y +W +MMA -MMA +GT -GT +GOT +MMB -MMB -PART +GC -GC +X -GOT +X "
     "-X -PART -GOT -GC "},
    {"gloo", "colwise", true, 4,
     "-Y -X -W -BIAS +X +X +X +X +AG -X -X -X -X +P +MMF -MMF +PC +Y +ZERO +Y -Y +Y +BIAS +BIAS "
     "-BIAS +Y +P -Y +PC -PC +AG +MMA -MMA +W +MMB -MMB -P +AG +X -AG -AG -Y -P -PC -AG "},
    {"gloo", "rowwise", true, 4,
     "-Y -X -W -BIAS +ZERO +X +GOT +GC +PART +GT -GT +MMF -MMF +PART +Y -PART +Y -Y +BIAS +BIAS "
     "-BIAS +Y +Y +Y +Y +PART -Y -Y -Y -Y +W +MMA -MMA +GT -GT +GOT +MMB -MMB -PART +GC -GC +X "
     "-GOT +X -X +X -X -PART -GOT -GC -X "},
};

}  // namespace

std::optional<int64_t> shardedTensorLinearPeak(const std::string& backend, const std::string& kind,
                                               bool reordered, int ranks,
                                               const std::map<std::string, int64_t>& size,
                                               int64_t base, int64_t results) {
  const char* table = nullptr;
  for (const MemoryTable& m : kTables) {
    if (backend == m.backend && kind == m.kind && reordered == m.reordered &&
        (m.ranks == 0 || m.ranks == ranks)) {
      table = m.tokens;
    }
  }
  if (table == nullptr) return std::nullopt;
  return replayAllocations(table, size, base + results);
}

}  // namespace sb::strategies
