#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "harness/comm/comm.h"

namespace sb::harness {

// Collectives as autograd functions: the communication actions of a sharded operator, each
// with its forward collective and the collective its gradient needs (ColossalAI's
// CollectiveCommPattern names). An executor composes these with ordinary LibTorch ops, and the
// autograd engine runs the backward collectives on the rank's own thread, in graph order,
// which is the same on every rank.

// Forward: identity. Backward: all-reduce of the gradient over `comm`'s group. For an operand
// that is replicated over the group while its consumers are split (its gradient arrives as
// partial sums), e.g. a weight replicated over the data-parallel axis.
at::Tensor identityFwdAllReduceBwd(const at::Tensor& x, Communicator& comm);

// Forward: all-reduce of partial sums. Backward: identity. For an output whose contraction
// dimension was split over the group.
at::Tensor allReduceFwdIdentityBwd(const at::Tensor& x, Communicator& comm);

// Forward: all-reduce of partial sums. Backward: all-reduce of the gradient. For partial sums
// whose total is consumed by computations that differ per rank (the statistics of a layer norm
// over a split hidden dimension, of a batch norm over a split batch): each rank's gradient of
// the total is then partial too.
at::Tensor allReduceFwdAllReduceBwd(const at::Tensor& x, Communicator& comm);

// Forward: all-gather along dim 0 (`rows[r]` rows from rank r). Backward: reduce-scatter of the
// gradient back to each rank's rows.
at::Tensor allGatherFwdReduceScatterBwd(const at::Tensor& x, Communicator& comm,
                                        const std::vector<int64_t>& rows);

// Forward: reduce-scatter along dim 0 (rank r keeps `rows[r]` summed rows). Backward:
// all-gather of the gradient.
at::Tensor reduceScatterFwdAllGatherBwd(const at::Tensor& x, Communicator& comm,
                                        const std::vector<int64_t>& rows);

// Forward: all-to-all along dim 0 with the given row counts. Backward: the reverse all-to-all
// (send and receive counts swapped).
at::Tensor allToAllFwdAllToAllBwd(const at::Tensor& x, Communicator& comm,
                                  const std::vector<int64_t>& sendRows,
                                  const std::vector<int64_t>& recvRows);

}  // namespace sb::harness
