// The memory model of one Megatron block step (megatron_memory.h).
//
// The step's allocations, in order, as sizes of this rank's tensors: one token per allocation
// (+) or release (-). Recorded with SB_MEMORY_TRACE on float32 over 16 shapes and meshes
// (batch, sequence, width and heads varied, tensor-parallel groups of 2 and 4, data-parallel
// groups of 2 and 4) and written in terms of the sizes below, the same sequence for every one;
// the sharding-ops suite checks it against the measured peak on every row. The tokens:
//   A      an activation at the block's ends, [b, t_local, d]
//   G      a gathered activation, [b, t, d]
//   S      a layer norm's mean or inverse deviation, [b, t_local]
//   QKV    the fused projections, [b, t, 3 d / tp]
//   QH     one of q, k, v or the attention output made contiguous, [b, t, d / tp]
//   SC     scores or probabilities, [b, h / tp, t, t]
//   M      the causal mask, t x t bools (none when bidirectional)
//   U      the MLP's hidden units, [b, t, 4d / tp]
//   Z      a dropout mask's int64 hash state, [b, t_local, d];  BOOL  its boolean keep mask
//   ARD, ART, ARB   the int64 index ranges of d, t_local and b
//   S8, S4, ZERO    scalars and empties
//   PLN, PQKVW, PQKVB, PPW, PFW, PFB, PMW   parameters and their gradients: d; 3d/tp x d;
//                   3d/tp; d x d/tp; 4d/tp x d; 4d/tp; d x 4d/tp
// The first tokens release the previous step's results (its output and every gradient).
// The collectives' copies and buffers are among the A and G tokens, so each backend has its
// tables: threads; gloo, whose all-gather and reduce-scatter allocate a buffer per rank (a
// table per tensor-parallel group size, 2 and 4, for sequence parallel). Other backends and
// group sizes have no table: no prediction.

#include "strategies/sharding/composite/megatron_memory.h"

#include <map>

#include "strategies/sharding/sharding_util.h"

namespace sb::strategies {
namespace {

struct MemoryTable {
  const char* backend;
  bool sequenceParallel, twoD;
  int64_t tp;  // 0: any
  const char* tokens;
};

const MemoryTable kMemoryTables[] = {
    {"threads", false, false, 0,
     "-A -A -PLN -PLN -PQKVW -PQKVB -PPW -PLN -PLN -PLN -PFW -PFB -PFW -PLN +A +S +S +QKV "
     "+QH +QH +SC +S8 +S4 -S4 -S8 +M +SC +QH +QH +QH -QH -SC +A +A +A -A +A -A -A +Z +ZERO "
     "+ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO +ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 "
     "+Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z "
     "-S8 +S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 -Z +A -BOOL +S8 +S4 -S4 -S8 +A +A -A +A +S "
     "+S +U +U +ZERO +A +A +A -A +A -A -A +Z +ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART "
     "+ZERO +ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 "
     "-S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 "
     "-Z +A -BOOL +S8 +S4 -S4 -S8 +A +A -A -A -A -QKV +A -A +PLN +PFW +U -A -U +U +ZERO -U "
     "-U +A +PFW +PFB -U -A +A +A -A -A +A +PLN +PLN +ZERO +ARD -ARD -A -A -S -S +A -A +A -A "
     "+PLN +PPW +QH -A -QH +QH -QH +QH +SC -QH -QH +SC -SC -SC +SC -SC -M +S8 +S4 +SC -S4 "
     "-S8 -SC +QH +QH -SC -QH -QH +QKV -QH +QKV -QH +QKV -QKV -QKV +QKV -QH +QKV -QKV -QKV "
     "+A +PQKVW +PQKVB -QKV -A +A +A -A -A +A +PLN +PLN +ZERO +ARD -ARD -A -S -S +A -A -A "},
    {"threads", true, false, 0,
     "-A -A -PLN -PLN -PQKVW -PQKVB -PPW -PLN -PLN -PLN -PFW -PFB -PFW -PLN +A +S +S +A +G "
     "-A +G +QKV -G +A +A +SC +S8 +S4 -S4 -S8 +M +SC +A +A +A -A -SC +G +G +A -G +A -A -G +Z "
     "+ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO +ARB +S8 -S8 -ARB +S8 -S8 +S8 "
     "-S8 +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z "
     "+S8 +Z -S8 +S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 -Z +A -BOOL +S8 +S4 -S4 -S8 +A +A -A "
     "+A +S +S +A +G -A +G +U +U +ZERO -G +G +G +A -G +A -A -G +Z +ZERO +ARD +S8 -S8 -ARD "
     "+ZERO +ART +S8 -S8 -ART +ZERO +ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 +Z -S8 +S8 -S8 +S8 "
     "-S8 -Z +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +Z -Z "
     "+S8 -S8 +S8 +BOOL -S8 -Z +A -BOOL +S8 +S4 -S4 -S8 +A +A -A -A -A -A -QKV -A +A -A +PLN "
     "+A +G -A -A +G -G +PFW +U -G -U +U +ZERO -U -U +PFB +PFW +G -U -G +G +A -G -G +A +PLN "
     "+PLN +A +ZERO +ARD -ARD -A -A -A -S -S +A -A +A -A +PLN +A +G -A -A +G -G +PPW +A -G "
     "-A +A -A +A +SC -A -A +SC -SC -SC +SC -SC -M +S8 +S4 +SC -S4 -S8 -SC +A +A -SC -A -A "
     "+QKV -A +QKV -A +QKV -QKV -QKV +QKV -A +QKV -QKV -QKV +PQKVB +PQKVW +G -QKV -G +G +A "
     "-G -G +A +PLN +PLN +A +ZERO +ARD -ARD -A -A -S -S +A -A -A +PLN +PLN -PLN -PLN +PLN "
     "+PLN -PLN -PLN +PLN +PLN -PLN -PLN +PLN +PLN -PLN -PLN +PLN +PLN -PLN -PLN +PLN +PLN "
     "-PLN -PLN "},
    {"threads", false, true, 0,
     "-A -A -PLN -PLN -PQKVW -PQKVB -PPW -PLN -PLN -PLN -PFW -PFB -PFW -PLN +A +S +S +QKV "
     "+QH +QH +SC +S8 +S4 -S4 -S8 +M +SC +QH +QH +QH -QH -SC +A +A +A -A +A -A -A +Z +ZERO "
     "+ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO +ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 "
     "+Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z "
     "-S8 +S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 -Z +A -BOOL +S8 +S4 -S4 -S8 +A +A -A +A +S "
     "+S +U +U +ZERO +A +A +A -A +A -A -A +Z +ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART "
     "+ZERO +ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 "
     "-S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 "
     "-Z +A -BOOL +S8 +S4 -S4 -S8 +A +A -A -A -A -QKV +A -A +PLN +PFW +U -A -U +U +ZERO -U "
     "-U +A +PFW +PFB -U -A +A +A -A -A +A +PLN +PLN +ZERO +ARD -ARD -A -A -S -S +A -A +A -A "
     "+PLN +PPW +QH -A -QH +QH -QH +QH +SC -QH -QH +SC -SC -SC +SC -SC -M +S8 +S4 +SC -S4 "
     "-S8 -SC +QH +QH -SC -QH -QH +QKV -QH +QKV -QH +QKV -QKV -QKV +QKV -QH +QKV -QKV -QKV "
     "+A +PQKVW +PQKVB -QKV -A +A +A -A -A +A +PLN +PLN +ZERO +ARD -ARD -A -S -S +A -A -A "
     "+PLN +PLN -PLN -PLN +PFW +PFW -PFW -PFW +PFB +PFB -PFB -PFB +PFW +PFW -PFW -PFW +PLN "
     "+PLN -PLN -PLN +PLN +PLN -PLN -PLN +PLN +PLN -PLN -PLN +PPW +PPW -PPW -PPW +PQKVB "
     "+PQKVB -PQKVB -PQKVB +PQKVW +PQKVW -PQKVW -PQKVW +PLN +PLN -PLN -PLN +PLN +PLN -PLN "
     "-PLN "},
    {"threads", true, true, 0,
     "-A -A -PLN -PLN -PQKVW -PQKVB -PPW -PLN -PLN -PLN -PFW -PFB -PFW -PLN +A +S +S +A +G "
     "-A +G +QKV -G +A +A +SC +S8 +S4 -S4 -S8 +M +SC +A +A +A -A -SC +G +G +A -G +A -A -G +Z "
     "+ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO +ARB +S8 -S8 -ARB +S8 -S8 +S8 "
     "-S8 +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z "
     "+S8 +Z -S8 +S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 -Z +A -BOOL +S8 +S4 -S4 -S8 +A +A -A "
     "+A +S +S +A +G -A +G +U +U +ZERO -G +G +G +A -G +A -A -G +Z +ZERO +ARD +S8 -S8 -ARD "
     "+ZERO +ART +S8 -S8 -ART +ZERO +ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 +Z -S8 +S8 -S8 +S8 "
     "-S8 -Z +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +Z -Z "
     "+S8 -S8 +S8 +BOOL -S8 -Z +A -BOOL +S8 +S4 -S4 -S8 +A +A -A -A -A -A -QKV -A +A -A +PLN "
     "+A +G -A -A +G -G +PFW +U -G -U +U +ZERO -U -U +PFB +PFW +G -U -G +G +A -G -G +A +PLN "
     "+PLN +A +ZERO +ARD -ARD -A -A -A -S -S +A -A +A -A +PLN +A +G -A -A +G -G +PPW +A -G "
     "-A +A -A +A +SC -A -A +SC -SC -SC +SC -SC -M +S8 +S4 +SC -S4 -S8 -SC +A +A -SC -A -A "
     "+QKV -A +QKV -A +QKV -QKV -QKV +QKV -A +QKV -QKV -QKV +PQKVB +PQKVW +G -QKV -G +G +A "
     "-G -G +A +PLN +PLN +A +ZERO +ARD -ARD -A -A -S -S +A -A -A +PLN +PLN -PLN -PLN +PFW "
     "+PFW -PFW -PFW +PFB +PFB -PFB -PFB +PFW +PFW -PFW -PFW +PLN +PLN -PLN -PLN +PLN +PLN "
     "-PLN -PLN +PLN +PLN -PLN -PLN +PPW +PPW -PPW -PPW +PQKVB +PQKVB -PQKVB -PQKVB +PQKVW "
     "+PQKVW -PQKVW -PQKVW +PLN +PLN -PLN -PLN +PLN +PLN -PLN -PLN "},
    {"gloo", false, false, 0,
     "-A -A -PLN -PLN -PQKVW -PQKVB -PPW -PLN -PLN -PLN -PFW -PFB -PFW -PLN +A +S +S +QKV "
     "+QH +QH +SC +S8 +S4 -S4 -S8 +M +SC +QH +QH +QH -QH -SC +A +A +A -A -A +Z +ZERO +ARD "
     "+S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO +ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 +Z "
     "-S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z -S8 "
     "+S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 -Z +A -BOOL +S8 +S4 -S4 -S8 +A +A -A +A +S +S "
     "+U +U +ZERO +A +A +A -A -A +Z +ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO "
     "+ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 +S8 "
     "-S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 -Z +A "
     "-BOOL +S8 +S4 -S4 -S8 +A +A -A -A -A -QKV +A -A +PLN +PFW +U -A -U +U +ZERO -U -U +A "
     "+PFW +PFB -U -A +A -A +A +PLN +PLN +ZERO +ARD -ARD -A -A -S -S +A -A +A -A +PLN +PPW "
     "+QH -A -QH +QH -QH +QH +SC -QH -QH +SC -SC -SC +SC -SC -M +S8 +S4 +SC -S4 -S8 -SC +QH "
     "+QH -SC -QH -QH +QKV -QH +QKV -QH +QKV -QKV -QKV +QKV -QH +QKV -QKV -QKV +A +PQKVW "
     "+PQKVB -QKV -A +A -A +A +PLN +PLN +ZERO +ARD -ARD -A -S -S +A -A -A "},
    {"gloo", false, true, 0,
     "-A -A -PLN -PLN -PQKVW -PQKVB -PPW -PLN -PLN -PLN -PFW -PFB -PFW -PLN +A +S +S +QKV "
     "+QH +QH +SC +S8 +S4 -S4 -S8 +M +SC +QH +QH +QH -QH -SC +A +A +A -A -A +Z +ZERO +ARD "
     "+S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO +ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 +Z "
     "-S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z -S8 "
     "+S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 -Z +A -BOOL +S8 +S4 -S4 -S8 +A +A -A +A +S +S "
     "+U +U +ZERO +A +A +A -A -A +Z +ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO "
     "+ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 +S8 "
     "-S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 -Z +A "
     "-BOOL +S8 +S4 -S4 -S8 +A +A -A -A -A -QKV +A -A +PLN +PFW +U -A -U +U +ZERO -U -U +A "
     "+PFW +PFB -U -A +A -A +A +PLN +PLN +ZERO +ARD -ARD -A -A -S -S +A -A +A -A +PLN +PPW "
     "+QH -A -QH +QH -QH +QH +SC -QH -QH +SC -SC -SC +SC -SC -M +S8 +S4 +SC -S4 -S8 -SC +QH "
     "+QH -SC -QH -QH +QKV -QH +QKV -QH +QKV -QKV -QKV +QKV -QH +QKV -QKV -QKV +A +PQKVW "
     "+PQKVB -QKV -A +A -A +A +PLN +PLN +ZERO +ARD -ARD -A -S -S +A -A -A +PLN -PLN +PFW "
     "-PFW +PFB -PFB +PFW -PFW +PLN -PLN +PLN -PLN +PLN -PLN +PPW -PPW +PQKVB -PQKVB +PQKVW "
     "-PQKVW +PLN -PLN +PLN -PLN "},
    {"gloo", true, false, 2,
     "-A -A -PLN -PLN -PQKVW -PQKVB -PPW -PLN -PLN -PLN -PFW -ARD -PFW -PLN +A +S +S +A +A "
     "+A +G -A -A -A +G +QKV -G +A +A +SC +S8 +S4 -S4 -S8 +M +SC +A +A +A -A -SC +G +G +G +A "
     "-G -G +A -A -G +G +ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO +ARB +S8 -S8 "
     "-ARB +S8 -S8 +S8 -S8 +S8 +G -S8 +S8 -S8 +S8 -S8 -G +S8 +G -S8 +S8 -S8 +S8 -S8 -G +S8 "
     "+G -S8 +S8 -S8 -G +S8 +G -S8 +S8 -S8 -G +G -G +S8 -S8 +S8 +BOOL -S8 -G +A -BOOL +S8 "
     "+S4 -S4 -S8 +A +A -A +A +S +S +A +A +A +G -A -A -A +G +U +U +ZERO -G +G +G +G +A -G -G "
     "+A -A -G +G +ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO +ARB +S8 -S8 -ARB "
     "+S8 -S8 +S8 -S8 +S8 +G -S8 +S8 -S8 +S8 -S8 -G +S8 +G -S8 +S8 -S8 +S8 -S8 -G +S8 +G -S8 "
     "+S8 -S8 -G +S8 +G -S8 +S8 -S8 -G +G -G +S8 -S8 +S8 +BOOL -S8 -G +A -BOOL +S8 +S4 -S4 "
     "-S8 +A +A -A -A -A -A -QKV -A +A -A +PLN +A +A +A +G -A -A -A -A +G -G +PFW +U -G -U "
     "+U +ZERO -U -U +ARD +PFW +G -U -G +G +G +A -G -G -G +A +PLN +PLN +A +ZERO +ARD -ARD -A "
     "-A -A -S -S +A -A +A -A +PLN +A +A +A +G -A -A -A -A +G -G +PPW +A -G -A +A -A +A +SC "
     "-A -A +SC -SC -SC +SC -SC -M +S8 +S4 +SC -S4 -S8 -SC +A +A -SC -A -A +QKV -A +QKV -A "
     "+QKV -QKV -QKV +QKV -A +QKV -QKV -QKV +PQKVB +PQKVW +G -QKV -G +G +G +A -G -G -G +A "
     "+PLN +PLN +A +ZERO +ARD -ARD -A -A -S -S +A -A -A +PLN -PLN +PLN -PLN +PLN -PLN +PLN "
     "-PLN +PLN -PLN +PLN -PLN "},
    {"gloo", true, false, 4,
     "-A -A -PLN -PLN -PQKVW -PQKVB -PPW -PLN -PLN -PLN -PFW -PLN -PFW -PLN +A +S +S +A +A "
     "+A +A +A +G -A -A -A -A -A +G +QKV -G +A +A +SC +S8 +S4 -S4 -S8 +M +SC +A +A +A -A -SC "
     "+G +G +G +A -G -G +A -A -G +Z +ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO "
     "+ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 +S8 "
     "-S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 -Z +A "
     "-BOOL +S8 +S4 -S4 -S8 +A +A -A +A +S +S +A +A +A +A +A +G -A -A -A -A -A +G +G +G "
     "+ZERO -G +G +G +G +A -G -G +A -A -G +Z +ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART "
     "+ZERO +ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 "
     "-S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 "
     "-Z +A -BOOL +S8 +S4 -S4 -S8 +A +A -A -A -A -A -QKV -A +A -A +PLN +A +A +A +A +A +G -A "
     "-A -A -A -A -A +G -G +PFW +G -G -G +G +ZERO -G -G +PLN +PFW +G -G -G +G +G +A -G -G -G "
     "+A +PLN +PLN +A +ZERO +ARD -ARD -A -A -A -S -S +A -A +A -A +PLN +A +A +A +A +A +G -A "
     "-A -A -A -A -A +G -G +PPW +A -G -A +A -A +A +SC -A -A +SC -SC -SC +SC -SC -M +S8 +S4 "
     "+SC -S4 -S8 -SC +A +A -SC -A -A +QKV -A +QKV -A +QKV -QKV -QKV +QKV -A +QKV -QKV -QKV "
     "+PQKVB +PQKVW +G -QKV -G +G +G +A -G -G -G +A +PLN +PLN +A +ZERO +ARD -ARD -A -A -S -S "
     "+A -A -A +PLN -PLN +PLN -PLN +PLN -PLN +PLN -PLN +PLN -PLN +PLN -PLN "},
    {"gloo", true, true, 2,
     "-A -A -PLN -PLN -PQKVW -PQKVB -PPW -PLN -PLN -PLN -PFW -ARD -PFW -PLN +A +S +S +A +A "
     "+A +G -A -A -A +G +QKV -G +A +A +SC +S8 +S4 -S4 -S8 +M +SC +A +A +A -A -SC +G +G +G +A "
     "-G -G +A -A -G +G +ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO +ARB +S8 -S8 "
     "-ARB +S8 -S8 +S8 -S8 +S8 +G -S8 +S8 -S8 +S8 -S8 -G +S8 +G -S8 +S8 -S8 +S8 -S8 -G +S8 "
     "+G -S8 +S8 -S8 -G +S8 +G -S8 +S8 -S8 -G +G -G +S8 -S8 +S8 +BOOL -S8 -G +A -BOOL +S8 "
     "+S4 -S4 -S8 +A +A -A +A +S +S +A +A +A +G -A -A -A +G +U +U +ZERO -G +G +G +G +A -G -G "
     "+A -A -G +G +ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO +ARB +S8 -S8 -ARB "
     "+S8 -S8 +S8 -S8 +S8 +G -S8 +S8 -S8 +S8 -S8 -G +S8 +G -S8 +S8 -S8 +S8 -S8 -G +S8 +G -S8 "
     "+S8 -S8 -G +S8 +G -S8 +S8 -S8 -G +G -G +S8 -S8 +S8 +BOOL -S8 -G +A -BOOL +S8 +S4 -S4 "
     "-S8 +A +A -A -A -A -A -QKV -A +A -A +PLN +A +A +A +G -A -A -A -A +G -G +PFW +U -G -U "
     "+U +ZERO -U -U +ARD +PFW +G -U -G +G +G +A -G -G -G +A +PLN +PLN +A +ZERO +ARD -ARD -A "
     "-A -A -S -S +A -A +A -A +PLN +A +A +A +G -A -A -A -A +G -G +PPW +A -G -A +A -A +A +SC "
     "-A -A +SC -SC -SC +SC -SC -M +S8 +S4 +SC -S4 -S8 -SC +A +A -SC -A -A +QKV -A +QKV -A "
     "+QKV -QKV -QKV +QKV -A +QKV -QKV -QKV +PQKVB +PQKVW +G -QKV -G +G +G +A -G -G -G +A "
     "+PLN +PLN +A +ZERO +ARD -ARD -A -A -S -S +A -A -A +PLN -PLN +PFW -PFW +ARD -ARD +PFW "
     "-PFW +PLN -PLN +PLN -PLN +PLN -PLN +PPW -PPW +PQKVB -PQKVB +PQKVW -PQKVW +PLN -PLN "
     "+PLN -PLN "},
    {"gloo", true, true, 4,
     "-A -A -PLN -PLN -PQKVW -PQKVB -PPW -PLN -PLN -PLN -PFW -PLN -PFW -PLN +A +S +S +A +A "
     "+A +A +A +G -A -A -A -A -A +G +QKV -G +A +A +SC +S8 +S4 -S4 -S8 +M +SC +A +A +A -A -SC "
     "+G +G +G +A -G -G +A -A -G +Z +ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART +ZERO "
     "+ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 +S8 "
     "-S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 -Z +A "
     "-BOOL +S8 +S4 -S4 -S8 +A +A -A +A +S +S +A +A +A +A +A +G -A -A -A -A -A +G +G +G "
     "+ZERO -G +G +G +G +A -G -G +A -A -G +Z +ZERO +ARD +S8 -S8 -ARD +ZERO +ART +S8 -S8 -ART "
     "+ZERO +ARB +S8 -S8 -ARB +S8 -S8 +S8 -S8 +S8 +Z -S8 +S8 -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 "
     "-S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +S8 +Z -S8 +S8 -S8 -Z +Z -Z +S8 -S8 +S8 +BOOL -S8 "
     "-Z +A -BOOL +S8 +S4 -S4 -S8 +A +A -A -A -A -A -QKV -A +A -A +PLN +A +A +A +A +A +G -A "
     "-A -A -A -A -A +G -G +PFW +G -G -G +G +ZERO -G -G +PLN +PFW +G -G -G +G +G +A -G -G -G "
     "+A +PLN +PLN +A +ZERO +ARD -ARD -A -A -A -S -S +A -A +A -A +PLN +A +A +A +A +A +G -A "
     "-A -A -A -A -A +G -G +PPW +A -G -A +A -A +A +SC -A -A +SC -SC -SC +SC -SC -M +S8 +S4 "
     "+SC -S4 -S8 -SC +A +A -SC -A -A +QKV -A +QKV -A +QKV -QKV -QKV +QKV -A +QKV -QKV -QKV "
     "+PQKVB +PQKVW +G -QKV -G +G +G +A -G -G -G +A +PLN +PLN +A +ZERO +ARD -ARD -A -A -S -S "
     "+A -A -A +PLN -PLN +PFW -PFW +PLN -PLN +PFW -PFW +PLN -PLN +PLN -PLN +PLN -PLN +PPW "
     "-PPW +PQKVB -PQKVB +PQKVW -PQKVW +PLN -PLN +PLN -PLN "},
};

}  // namespace

std::optional<int64_t> replayBlockStep(const BlockStepSizes& s, int64_t start) {
  const char* table = nullptr;
  for (const MemoryTable& m : kMemoryTables) {
    if (s.backend == m.backend && m.sequenceParallel == s.sequenceParallel && m.twoD == s.twoD &&
        (m.tp == 0 || m.tp == s.tp)) {
      table = m.tokens;
    }
  }
  if (table == nullptr) return std::nullopt;
  // Recorded for float32 with per-rank batch, sequence, heads and dropout masks of more than
  // one: other cases take other ATen paths (a transpose of extent 1 is already contiguous).
  const reference::BlockShape& b = s.shape;
  const int64_t bl = s.batchLocal, tl = s.seqLocal;
  if (s.dtype != at::kFloat || b.dropout == 0 || bl < 2 || tl < 2 || b.heads / s.tp < 2) {
    return std::nullopt;
  }
  const int64_t es = 4, T = b.seq, D = b.dModel, dl = D / s.tp, hl = b.heads / s.tp;
  const int64_t F = 4 * D / s.tp;
  const std::map<std::string, int64_t> size = {{"A", bl * tl * D * es},
                                               {"G", bl * T * D * es},
                                               {"S", bl * tl * es},
                                               {"QKV", bl * T * 3 * dl * es},
                                               {"QH", bl * T * dl * es},
                                               {"SC", bl * hl * T * T * es},
                                               {"M", b.causal ? T * T : 0},
                                               {"U", bl * T * F * es},
                                               {"Z", bl * tl * D * 8},
                                               {"BOOL", bl * tl * D},
                                               {"ARD", D * 8},
                                               {"ART", tl * 8},
                                               {"ARB", bl * 8},
                                               {"S8", 8},
                                               {"S4", 4},
                                               {"ZERO", 0},
                                               {"PLN", D * es},
                                               {"PQKVW", 3 * dl * D * es},
                                               {"PQKVB", 3 * dl * es},
                                               {"PPW", D * dl * es},
                                               {"PFW", F * D * es},
                                               {"PFB", F * es},
                                               {"PMW", D * F * es}};
  return replayAllocations(table, size, start);
}

}  // namespace sb::strategies
