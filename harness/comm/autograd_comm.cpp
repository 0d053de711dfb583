#include "harness/comm/autograd_comm.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "harness/comm/comm_site.h"

namespace sb::harness {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The communicator travels through the autograd context as an integer: the executor that
// built the graph outlives its backward, and IValue has no slot for a raw pointer.
// The node it was made in goes with it, for the backward's collectives (comm_site.h).
void saveComm(AutogradContext* ctx, Communicator& comm) {
  ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm));
  saveCommNode(ctx);
}
Communicator& loadComm(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

struct IdentityFwdAllReduceBwd : torch::autograd::Function<IdentityFwdAllReduceBwd> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm) {
    saveComm(ctx, *comm);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto site = backwardCommSite(ctx);
    at::Tensor g = grads[0].contiguous().clone();
    loadComm(ctx).allReduce(g);
    return {g, at::Tensor()};
  }
};

struct AllReduceFwdIdentityBwd : torch::autograd::Function<AllReduceFwdIdentityBwd> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm) {
    at::Tensor y = x.contiguous().clone();
    comm->allReduce(y);
    return y;
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

struct AllReduceFwdAllReduceBwd : torch::autograd::Function<AllReduceFwdAllReduceBwd> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm) {
    saveComm(ctx, *comm);
    at::Tensor y = x.contiguous().clone();
    comm->allReduce(y);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto site = backwardCommSite(ctx);
    at::Tensor g = grads[0].contiguous().clone();
    loadComm(ctx).allReduce(g);
    return {g, at::Tensor()};
  }
};

struct AllGatherFwdReduceScatterBwd : torch::autograd::Function<AllGatherFwdReduceScatterBwd> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm,
                            std::vector<int64_t> rows) {
    saveComm(ctx, *comm);
    ctx->saved_data["rows"] = rows;
    return comm->allGather(x, rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto site = backwardCommSite(ctx);
    const auto rows = ctx->saved_data["rows"].toIntVector();
    return {loadComm(ctx).reduceScatter(grads[0].contiguous(), rows), at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterFwdAllGatherBwd : torch::autograd::Function<ReduceScatterFwdAllGatherBwd> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm,
                            std::vector<int64_t> rows) {
    saveComm(ctx, *comm);
    ctx->saved_data["rows"] = rows;
    return comm->reduceScatter(x, rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto site = backwardCommSite(ctx);
    const auto rows = ctx->saved_data["rows"].toIntVector();
    return {loadComm(ctx).allGather(grads[0].contiguous(), rows), at::Tensor(), at::Tensor()};
  }
};

struct AllToAllFwdAllToAllBwd : torch::autograd::Function<AllToAllFwdAllToAllBwd> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm,
                            std::vector<int64_t> sendRows, std::vector<int64_t> recvRows) {
    saveComm(ctx, *comm);
    ctx->saved_data["send"] = sendRows;
    ctx->saved_data["recv"] = recvRows;
    return comm->allToAll(x, sendRows, recvRows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto site = backwardCommSite(ctx);
    const auto send = ctx->saved_data["send"].toIntVector();
    const auto recv = ctx->saved_data["recv"].toIntVector();
    // The gradient flows back the way the data came: what was received is sent back.
    return {loadComm(ctx).allToAll(grads[0].contiguous(), recv, send), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor identityFwdAllReduceBwd(const at::Tensor& x, Communicator& comm) {
  return IdentityFwdAllReduceBwd::apply(x, &comm);
}

at::Tensor allReduceFwdIdentityBwd(const at::Tensor& x, Communicator& comm) {
  return AllReduceFwdIdentityBwd::apply(x, &comm);
}

at::Tensor allReduceFwdAllReduceBwd(const at::Tensor& x, Communicator& comm) {
  return AllReduceFwdAllReduceBwd::apply(x, &comm);
}

at::Tensor allGatherFwdReduceScatterBwd(const at::Tensor& x, Communicator& comm,
                                        const std::vector<int64_t>& rows) {
  return AllGatherFwdReduceScatterBwd::apply(x, &comm, rows);
}

at::Tensor reduceScatterFwdAllGatherBwd(const at::Tensor& x, Communicator& comm,
                                        const std::vector<int64_t>& rows) {
  return ReduceScatterFwdAllGatherBwd::apply(x, &comm, rows);
}

at::Tensor allToAllFwdAllToAllBwd(const at::Tensor& x, Communicator& comm,
                                  const std::vector<int64_t>& sendRows,
                                  const std::vector<int64_t>& recvRows) {
  return AllToAllFwdAllToAllBwd::apply(x, &comm, sendRows, recvRows);
}

}  // namespace sb::harness
