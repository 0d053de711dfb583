#include "harness/dist/calibrate.h"

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <mutex>
#include <ostream>
#include <string>

#include <ATen/ATen.h>

#include "harness/error.h"
#include "harness/run/records.h"

namespace sb::harness {
namespace {

using Clock = std::chrono::steady_clock;

// One collective at one size on the group over `axes`, issued by every rank.
void issue(Communicator& comm, Collective c, at::Tensor& buf, int64_t count) {
  const int n = comm.size();
  const std::vector<int64_t> even(n, count / n);
  switch (c) {
    case Collective::kAllReduce:
      comm.allReduce(buf);
      break;
    case Collective::kAllGather:
      comm.allGather(buf.narrow(0, 0, count / n), even);
      break;
    case Collective::kReduceScatter:
      comm.reduceScatter(buf, even);
      break;
    case Collective::kAllToAll:
      comm.allToAll(buf, even, even);
      break;
    case Collective::kBroadcast:
      comm.broadcast(buf, 0);
      break;
    case Collective::kBarrier:
      comm.barrier();
      break;
    case Collective::kSendRecv:  // a ring step: the whole buffer to the next rank
      comm.ringShift(buf.narrow(0, 0, count));
      break;
  }
}

// Seconds per iteration, the slowest rank's. A timed first iteration sets the iteration count
// (about `budget` seconds, 3 to 200): the same on every rank, since its time is the maximum
// over the mesh.
double timeLoop(World& world, const std::function<void(RankContext&)>& body, double budget = 0.05) {
  std::mutex mu;
  double slowest = 0;
  const auto timed = [&](int iters) {
    slowest = 0;
    world.run([&](RankContext& ctx) {
      ctx.world().barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) body(ctx);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
      std::lock_guard<std::mutex> lock(mu);
      slowest = std::max(slowest, s);
    });
    return world.maxOverProcesses(slowest);
  };
  const double probe = timed(1);
  return timed(static_cast<int>(std::clamp(budget / std::max(probe, 1e-9), 3.0, 200.0)));
}

}  // namespace

CostProfile calibrate(World& world, const CalibrateOptions& options, std::ostream& out) {
  // A line through one point has any slope: the fit would keep the latency and price every
  // byte at nothing (an infinite bandwidth).
  if (options.sizes.size() < 2 || options.gemmSizes.size() < 2) {
    throw InputError(
        "calibrate needs at least two sizes per collective and per matmul to fit "
        "a bandwidth; got " +
        std::to_string(options.sizes.size()) + " and " + std::to_string(options.gemmSizes.size()));
  }
  const DeviceMesh& mesh = world.mesh();
  CostProfile profile;
  profile.backend = world.backendName();
  profile.mesh = mesh.toString();
  const Provenance prov = Provenance::collect();
  profile.host = prov.host;
  profile.timestampUtc = prov.timestampUtc;

  std::vector<std::vector<int>> groups;
  for (int a = 0; a < mesh.ndim(); ++a) groups.push_back({a});
  if (mesh.ndim() > 1) {
    std::vector<int> all(mesh.ndim());
    for (int a = 0; a < mesh.ndim(); ++a) all[a] = a;
    groups.push_back(all);
  }
  const Collective kinds[] = {Collective::kAllReduce,     Collective::kAllGather,
                              Collective::kReduceScatter, Collective::kAllToAll,
                              Collective::kBroadcast,     Collective::kSendRecv};
  out << "# " << profile.backend << " on mesh " << profile.mesh << " (" << mesh.size()
      << " ranks); time is the slowest rank's, sizes in nccl-tests' convention\n";
  out << std::left << std::setw(7) << "# axes" << std::setw(16) << "collective" << std::right
      << std::setw(12) << "size(B)" << std::setw(12) << "time(us)" << std::setw(13) << "algbw(GB/s)"
      << std::setw(13) << "busbw(GB/s)"
      << "\n";
  for (const auto& axes : groups) {
    const std::string key = CostProfile::axesKey(axes);
    CostProfile::Group group;
    group.size = static_cast<int>(mesh.groupSize(axes));
    if (group.size < 2) continue;
    for (Collective c : kinds) {
      std::vector<CostProfile::Point> points;
      for (int64_t bytes : options.sizes) {
        // float32 elements, a multiple of the group size so every block is even.
        const int64_t count = std::max<int64_t>(bytes / 4 / group.size, 1) * group.size;
        std::vector<at::Tensor> bufs(mesh.size());
        world.run([&](RankContext& ctx) { bufs[ctx.rank()] = at::ones({count}, at::kFloat); });
        const double s = timeLoop(
            world, [&](RankContext& ctx) { issue(ctx.group(axes), c, bufs[ctx.rank()], count); });
        CostProfile::Point p;
        p.bytes = count * 4;
        p.timeUs = s * 1e6;
        p.algbwGBps = p.bytes / s / 1e9;
        p.busbwGBps = p.algbwGBps * CostProfile::busFactor(c, group.size);
        points.push_back(p);
        out << std::left << std::setw(7) << key << std::setw(16) << collectiveName(c) << std::right
            << std::setw(12) << p.bytes << std::setw(12) << std::fixed << std::setprecision(1)
            << p.timeUs << std::setw(13) << std::setprecision(3) << p.algbwGBps << std::setw(13)
            << p.busbwGBps << std::defaultfloat << "\n";
      }
      group.collectives[c] = CostProfile::fit(points);
      const auto& f = group.collectives[c];
      out << "#   fit: " << std::setprecision(3) << f.latencyUs << " us + "
          << (f.usPerByte > 0 ? 1e-3 / f.usPerByte : 0) << " GB/s (algbw)\n";
    }
    profile.groups[key] = group;
  }

  // Compute: a float32 matmul on every rank at once, as in a step.
  std::vector<CostProfile::Point> gemm;
  for (int64_t m : options.gemmSizes) {
    std::vector<at::Tensor> a(mesh.size()), b(mesh.size());
    world.run([&](RankContext& ctx) {
      a[ctx.rank()] = at::rand({m, m});
      b[ctx.rank()] = at::rand({m, m});
    });
    const double s =
        timeLoop(world, [&](RankContext& ctx) { at::mm(a[ctx.rank()], b[ctx.rank()]); });
    CostProfile::Point p;
    p.bytes = 2 * m * m * m;  // flops
    p.timeUs = s * 1e6;
    gemm.push_back(p);
    out << "# gemm " << m << "x" << m << "x" << m << ": " << std::setprecision(3) << p.timeUs
        << " us, " << p.bytes / s / 1e9 << " GFLOP/s per rank\n";
  }
  profile.gemm = CostProfile::fit(gemm);

  // Local data movement: a fresh tensor filled from another on every rank at once, as the
  // steps of a redistribution do.
  std::vector<CostProfile::Point> copies;
  for (int64_t bytes : options.sizes) {
    std::vector<at::Tensor> src(mesh.size());
    world.run([&](RankContext& ctx) { src[ctx.rank()] = at::ones({bytes / 4}, at::kFloat); });
    const double s = timeLoop(world, [&](RankContext& ctx) {
      at::Tensor dst = at::empty_like(src[ctx.rank()]);
      dst.copy_(src[ctx.rank()]);
    });
    CostProfile::Point p;
    p.bytes = bytes / 4 * 4;
    p.timeUs = s * 1e6;
    p.algbwGBps = p.bytes / s / 1e9;
    copies.push_back(p);
  }
  profile.copy = CostProfile::fit(copies);
  out << "# copy: " << std::setprecision(3) << profile.copy->latencyUs << " us + "
      << (profile.copy->usPerByte > 0 ? 1e-3 / profile.copy->usPerByte : 0) << " GB/s per rank\n";

  // The fixed cost of a step: an empty one through the World, as the runner times a step
  // (every rank woken, the slowest rank's time taken over the processes); the median of 7.
  std::vector<double> empties;
  for (int k = 0; k < 7; ++k) {
    constexpr int kIters = 50;
    const auto t0 = Clock::now();
    for (int i = 0; i < kIters; ++i) {
      world.run([](RankContext&) {});
      world.maxOverProcesses(0.0);
    }
    empties.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / kIters);
  }
  std::sort(empties.begin(), empties.end());
  profile.stepUs = world.maxOverProcesses(empties[empties.size() / 2]) * 1e6;
  out << "# an empty step: " << std::setprecision(3) << *profile.stepUs << " us\n";
  return profile;
}

}  // namespace sb::harness
