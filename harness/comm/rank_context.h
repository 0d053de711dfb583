#pragma once

#include <vector>

#include "harness/comm/comm.h"
#include "harness/comm/mesh.h"

namespace sb::harness {

// What an executor sees of its rank: who it is, the mesh, and one communicator per set of mesh
// axes. Implemented by each backend.
class RankContext {
 public:
  RankContext(int rank, const DeviceMesh& mesh) : rank_(rank), mesh_(mesh) {}
  virtual ~RankContext() = default;

  int rank() const { return rank_; }
  const DeviceMesh& mesh() const { return mesh_; }

  // The communicator of this rank's group over `axes` (all axes: the whole mesh). Group rank
  // order is DeviceMesh::groupIndex order.
  virtual Communicator& group(const std::vector<int>& axes) = 0;
  Communicator& world();

 private:
  int rank_;
  const DeviceMesh& mesh_;
};

}  // namespace sb::harness
