// The threads backend's collectives, checked against values computed here on one thread.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>

#include "harness/comm/threads_backend.h"

namespace sb::harness {
namespace {

// A tensor whose every element says where it came from: 1000 * src + 10 * dst + k.
at::Tensor tagged(int64_t rows, int src, int dst, int64_t cols = 3) {
  at::Tensor t = at::empty({rows, cols});
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) t[i][j] = 1000.0 * src + 10.0 * dst + i * cols + j;
  }
  return t;
}

class ThreadsCollectives : public ::testing::TestWithParam<std::vector<int64_t>> {
 protected:
  DeviceMesh mesh() const { return DeviceMesh(GetParam()); }
};

TEST_P(ThreadsCollectives, AllReduceSumsOverTheWholeMeshIdenticallyOnEveryRank) {
  ThreadsWorld world(mesh());
  const int n = world.size();
  std::vector<at::Tensor> out(n);
  world.run([&](RankContext& ctx) {
    at::Tensor t = at::full({5, 7}, 0.1 * (ctx.rank() + 1));
    ctx.world().allReduce(t);
    out[ctx.rank()] = t;
  });
  at::Tensor expected = at::full({5, 7}, 0.1);
  for (int r = 1; r < n; ++r) expected = expected + at::full({5, 7}, 0.1 * (r + 1));
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(at::equal(out[r], out[0])) << "rank " << r << " differs from rank 0";
    EXPECT_TRUE(at::allclose(out[r], expected)) << "rank " << r;
  }
}

TEST_P(ThreadsCollectives, AllGatherConcatenatesUnevenRowsInRankOrder) {
  ThreadsWorld world(mesh());
  const int n = world.size();
  std::vector<int64_t> rows(n);
  for (int r = 0; r < n; ++r) rows[r] = r % 3;  // 0, 1, 2, 0, ...: includes empty blocks
  std::vector<at::Tensor> out(n);
  world.run([&](RankContext& ctx) {
    out[ctx.rank()] = ctx.world().allGather(tagged(rows[ctx.rank()], ctx.rank(), 0), rows);
  });
  std::vector<at::Tensor> parts;
  for (int r = 0; r < n; ++r) parts.push_back(tagged(rows[r], r, 0));
  const at::Tensor expected = at::cat(parts, 0);
  for (int r = 0; r < n; ++r) EXPECT_TRUE(at::equal(out[r], expected)) << "rank " << r;
}

TEST_P(ThreadsCollectives, ReduceScatterGivesEachRankTheSumOfItsUnevenBlock) {
  ThreadsWorld world(mesh());
  const int n = world.size();
  std::vector<int64_t> rows(n);
  int64_t total = 0;
  for (int r = 0; r < n; ++r) total += rows[r] = 1 + (r * 2) % 3;
  std::vector<at::Tensor> out(n);
  auto input = [&](int r) {
    return at::arange(total * 2, at::kFloat).reshape({total, 2}) * (r + 1);
  };
  world.run([&](RankContext& ctx) {
    out[ctx.rank()] = ctx.world().reduceScatter(input(ctx.rank()), rows);
  });
  int64_t offset = 0;
  for (int r = 0; r < n; ++r) {
    at::Tensor expected = at::zeros({rows[r], 2});
    for (int s = 0; s < n; ++s) expected += input(s).narrow(0, offset, rows[r]);
    EXPECT_TRUE(at::equal(out[r], expected)) << "rank " << r;
    offset += rows[r];
  }
}

TEST_P(ThreadsCollectives, AllToAllDeliversEveryBlockWithSplitSizes) {
  ThreadsWorld world(mesh());
  const int n = world.size();
  // Rank s sends (s + d) % 3 rows to rank d.
  auto count = [](int s, int d) -> int64_t { return (s + d) % 3; };
  std::vector<at::Tensor> out(n);
  world.run([&](RankContext& ctx) {
    const int s = ctx.rank();
    std::vector<int64_t> send(n), recv(n);
    std::vector<at::Tensor> blocks;
    for (int d = 0; d < n; ++d) {
      send[d] = count(s, d);
      recv[d] = count(d, s);
      blocks.push_back(tagged(send[d], s, d));
    }
    out[s] = ctx.world().allToAll(at::cat(blocks, 0), send, recv);
  });
  for (int d = 0; d < n; ++d) {
    std::vector<at::Tensor> parts;
    for (int s = 0; s < n; ++s) parts.push_back(tagged(count(s, d), s, d));
    EXPECT_TRUE(at::equal(out[d], at::cat(parts, 0))) << "rank " << d;
  }
}

TEST_P(ThreadsCollectives, BroadcastCopiesTheRootsTensor) {
  ThreadsWorld world(mesh());
  const int n = world.size();
  const int root = n - 1;
  std::vector<at::Tensor> out(n);
  world.run([&](RankContext& ctx) {
    at::Tensor t = tagged(2, ctx.rank(), 0);
    ctx.world().broadcast(t, root);
    out[ctx.rank()] = t;
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(at::equal(out[r], tagged(2, root, 0))) << "rank " << r;
}

TEST_P(ThreadsCollectives, AxisGroupsReduceOnlyAlongTheirAxis) {
  const DeviceMesh m = mesh();
  ThreadsWorld world(m);
  for (int axis = 0; axis < m.ndim(); ++axis) {
    std::vector<at::Tensor> out(world.size());
    world.run([&](RankContext& ctx) {
      at::Tensor t = at::full({3}, static_cast<double>(1 << ctx.rank()));
      ctx.group({axis}).allReduce(t);
      out[ctx.rank()] = t;
    });
    for (int r = 0; r < world.size(); ++r) {
      double expected = 0;
      for (int member : m.groupRanks(r, {axis})) expected += 1 << member;
      EXPECT_EQ(out[r][0].item<double>(), expected) << "rank " << r << " axis " << axis;
    }
  }
}

TEST_P(ThreadsCollectives, CountsCallsAndBytesPerRankInNcclTestsConvention) {
  ThreadsWorld world(mesh());
  const int n = world.size();
  world.run([&](RankContext& ctx) {
    at::Tensor t = at::zeros({16});  // 64 bytes
    ctx.world().allReduce(t);
    ctx.world().allGather(at::zeros({2, 4}), std::vector<int64_t>(n, 2));  // n*32 bytes out
    ctx.world().barrier();
  });
  for (int r = 0; r < n; ++r) {
    const CommStats& s = world.stats(r);
    EXPECT_EQ(s[Collective::kAllReduce].calls, 1);
    EXPECT_EQ(s[Collective::kAllReduce].bytes, 64);
    EXPECT_EQ(s[Collective::kAllGather].calls, 1);
    EXPECT_EQ(s[Collective::kAllGather].bytes, n * 32);
    EXPECT_EQ(s[Collective::kBarrier].calls, 1);
    EXPECT_EQ(s.totalBytes(), 64 + n * 32);
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, ThreadsCollectives,
                         ::testing::Values(std::vector<int64_t>{4}, std::vector<int64_t>{2, 2},
                                           std::vector<int64_t>{2, 4}, std::vector<int64_t>{8},
                                           std::vector<int64_t>{3}),
                         [](const auto& info) {
                           std::string s = "mesh";
                           for (auto d : info.param) s += "_" + std::to_string(d);
                           return s;
                         });

TEST(ThreadsWorld, GroupOfOneRankCountsTheCallButNoBytes) {
  ThreadsWorld world(DeviceMesh({1, 2}));
  world.run([&](RankContext& ctx) {
    at::Tensor t = at::ones({8});
    ctx.group({0}).allReduce(t);  // axis 0 has extent 1
    EXPECT_EQ(t[0].item<float>(), 1.0f);
  });
  EXPECT_EQ(world.stats(0)[Collective::kAllReduce].calls, 1);
  EXPECT_EQ(world.stats(0)[Collective::kAllReduce].bytes, 0);
}

TEST(ThreadsWorld, ARankThatThrowsWakesTheOthersAndIsNamed) {
  ThreadsWorld world(DeviceMesh({4}));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    world.run([&](RankContext& ctx) {
      if (ctx.rank() == 2) throw std::runtime_error("planted failure");
      at::Tensor t = at::ones({4});
      ctx.world().allReduce(t);  // ranks 0, 1, 3 block here until the abort
    });
    FAIL() << "run() should rethrow the failing rank's error";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("rank 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("planted failure"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // The world is usable again afterwards.
  world.run([&](RankContext& ctx) {
    at::Tensor t = at::ones({2});
    ctx.world().allReduce(t);
    EXPECT_EQ(t[0].item<float>(), 4.0f);
  });
}

TEST(ThreadsWorld, ARankMissingACollectiveTimesOutWithAClearError) {
  ThreadsOptions opts;
  opts.timeout = std::chrono::milliseconds(200);
  ThreadsWorld world(DeviceMesh({2}), opts);
  try {
    world.run([&](RankContext& ctx) {
      if (ctx.rank() == 1) return;  // never joins
      at::Tensor t = at::ones({4});
      ctx.world().allReduce(t);
    });
    FAIL() << "expected a timeout";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("waited more than 200 ms in all_reduce"), std::string::npos) << msg;
  }
}

TEST(ThreadsWorld, MismatchedAllReduceShapesAreAnErrorNotACorruptSum) {
  ThreadsWorld world(DeviceMesh({2}));
  EXPECT_THROW(world.run([&](RankContext& ctx) {
    at::Tensor t = at::ones({ctx.rank() + 1});
    ctx.world().allReduce(t);
  }),
               c10::Error);
}

TEST(ThreadsPointToPoint, ARingShiftHandsEachRankThePreviousRanksTensorAndCountsItsSend) {
  ThreadsWorld world(DeviceMesh({4}));
  std::vector<at::Tensor> got(4);
  world.run([&](RankContext& ctx) {
    const int r = ctx.rank();
    at::Tensor t = tagged(2, r, (r + 1) % 4);
    for (int step = 0; step < 3; ++step) t = ctx.world().ringShift(t);  // three hops
    got[r] = t;
  });
  for (int r = 0; r < 4; ++r) {
    // After three hops rank r holds what rank r - 3 = r + 1 (mod 4) made.
    const int src = (r + 1) % 4;
    EXPECT_TRUE(at::equal(got[r], tagged(2, src, (src + 1) % 4))) << "rank " << r;
    EXPECT_EQ(world.stats(r)[Collective::kSendRecv].calls, 3);
    EXPECT_EQ(world.stats(r)[Collective::kSendRecv].bytes, 3 * 2 * 3 * 4);
  }
}

TEST(ThreadsPointToPoint, OnlyThePairTakesPartAndMessagesKeepTheirOrder) {
  ThreadsWorld world(DeviceMesh({3}));
  at::Tensor first = at::zeros({2, 3}), second = at::zeros({2, 3});
  world.run([&](RankContext& ctx) {
    auto& w = ctx.world();
    if (ctx.rank() == 2) {
      w.send(tagged(2, 2, 0), 0);
      w.send(tagged(2, 2, 1), 0);
    } else if (ctx.rank() == 0) {
      w.recv(first, 2);
      w.recv(second, 2);
    }  // rank 1 takes no part
  });
  EXPECT_TRUE(at::equal(first, tagged(2, 2, 0)));
  EXPECT_TRUE(at::equal(second, tagged(2, 2, 1)));
  EXPECT_EQ(world.stats(1)[Collective::kSendRecv].calls, 0);
  EXPECT_EQ(world.stats(0)[Collective::kSendRecv].bytes, 0);  // a receiver sends nothing
  EXPECT_EQ(world.stats(2)[Collective::kSendRecv].bytes, 2 * 2 * 3 * 4);
}

TEST(ThreadsPointToPoint, AShapeMismatchNamesBothRanksAndAMissingSendTimesOut) {
  ThreadsWorld world(DeviceMesh({2}));
  try {
    world.run([&](RankContext& ctx) {
      if (ctx.rank() == 0) ctx.world().send(at::ones({3}), 1);
      if (ctx.rank() == 1) {
        at::Tensor t = at::empty({4});
        ctx.world().recv(t, 0);
      }
    });
    FAIL() << "expected a mismatch";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("rank 0 sent [3] Float to rank 1, which receives [4] Float"),
              std::string::npos)
        << msg;
  }
  ThreadsOptions opts;
  opts.timeout = std::chrono::milliseconds(200);
  ThreadsWorld lonely(DeviceMesh({2}), opts);
  try {
    lonely.run([&](RankContext& ctx) {
      if (ctx.rank() == 1) return;  // never sends
      at::Tensor t = at::empty({4});
      ctx.world().recv(t, 1);
    });
    FAIL() << "expected a timeout";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("waited more than 200 ms in send_recv for a send from rank 1"),
              std::string::npos)
        << msg;
  }
}

TEST(ThreadsPointToPoint, IsendReturnsAtOnceAndTagsMatchWhateverOrderTheyArePostedIn) {
  // Rank 0 sends tags 1 and 2 before receiving; rank 1 sends first and receives tag 2 before
  // tag 1. Blocking sends would deadlock here (each waits for the other's receive).
  ThreadsWorld world(DeviceMesh({2}));
  at::Tensor one = at::zeros({2, 3}), two = at::zeros({2, 3}), back = at::zeros({4});
  world.run([&](RankContext& ctx) {
    auto& w = ctx.world();
    if (ctx.rank() == 0) {
      auto a = w.isend(tagged(2, 0, 1), 1, 1);
      auto b = w.isend(tagged(2, 0, 2), 1, 2);
      w.recv(back, 1, 3);
      a->wait();
      b->wait();
    } else {
      auto c = w.isend(at::arange(4, at::kFloat), 0, 3);
      w.recv(two, 0, 2);
      w.recv(one, 0, 1);
      c->wait();
    }
  });
  EXPECT_TRUE(at::equal(one, tagged(2, 0, 1)));
  EXPECT_TRUE(at::equal(two, tagged(2, 0, 2)));
  EXPECT_TRUE(at::equal(back, at::arange(4, at::kFloat)));
  EXPECT_EQ(world.stats(0)[Collective::kSendRecv].calls, 3);  // two sends, one receive
  EXPECT_EQ(world.stats(0)[Collective::kSendRecv].bytes, 2 * 2 * 3 * 4);
  EXPECT_EQ(world.stats(1)[Collective::kSendRecv].bytes, 4 * 4);

  ThreadsOptions opts;
  opts.timeout = std::chrono::milliseconds(200);
  ThreadsWorld lonely(DeviceMesh({2}), opts);
  try {
    lonely.run([&](RankContext& ctx) {
      if (ctx.rank() == 1) {
        at::Tensor t = at::empty({4});
        ctx.world().recv(t, 0, 7);  // a tag rank 0 never sends
        return;
      }
      ctx.world().isend(at::ones({4}), 1, 6)->wait();
    });
    FAIL() << "expected a timeout";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_TRUE(msg.find("for a send from rank 0 (tag 7)") != std::string::npos ||
                msg.find("for its send to rank 1 (tag 6) to be received") != std::string::npos)
        << msg;
  }
}

class NoCollectives final : public Communicator {
 public:
  NoCollectives() : Communicator(0, 2, nullptr) {}
  std::string backendName() const override { return "none"; }
};

TEST(Communicator, ABackendWithoutACollectiveSaysWhichOne) {
  NoCollectives c;
  at::Tensor t = at::ones({2});
  try {
    c.allReduce(t);
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Backend none does not support all_reduce"),
              std::string::npos);
  }
}

TEST(DeviceMesh, GroupsFollowRowMajorCoordinates) {
  const DeviceMesh m({2, 2});
  EXPECT_EQ(m.coords(3), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(m.groupRanks(3, {0}), (std::vector<int>{1, 3}));
  EXPECT_EQ(m.groupRanks(3, {1}), (std::vector<int>{2, 3}));
  EXPECT_EQ(m.groupRanks(2, {0, 1}), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(m.groupRanks(2, {1, 0}), (std::vector<int>{0, 2, 1, 3}));
  EXPECT_EQ(m.groupIndex(2, {0, 1}), 2);
  EXPECT_EQ(m.groupIndex(2, {1, 0}), 1);
  EXPECT_EQ(m.toString(), "2x2");
  EXPECT_THROW(m.coords(4), c10::Error);
  EXPECT_THROW(m.groupSize({2}), c10::Error);
}

TEST(DeviceMesh, ParsesShapesAndRejectsGarbage) {
  EXPECT_EQ(DeviceMesh::parseShape("2x4"), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(DeviceMesh::parseShape("8"), (std::vector<int64_t>{8}));
  EXPECT_THROW(DeviceMesh::parseShape("2x"), c10::Error);
  EXPECT_THROW(DeviceMesh::parseShape("two"), c10::Error);
  // Issue 34: refused before anything is sized by the mesh, with no overflow on the way.
  EXPECT_THROW(DeviceMesh::parseShape("65536x65536"), c10::Error);
  EXPECT_THROW(DeviceMesh::parseShape("99999999999999999999999"), c10::Error);
  EXPECT_THROW(DeviceMesh::parseShape("0x2"), c10::Error);
  EXPECT_THROW(DeviceMesh::parseShape("2000", 64), c10::Error);
  EXPECT_EQ(DeviceMesh::parseShape("8x8", 64), (std::vector<int64_t>{8, 8}));
  EXPECT_THROW(DeviceMesh({int64_t{1} << 40, int64_t{1} << 40}), c10::Error);
  EXPECT_THROW(DeviceMesh({2, 0}), c10::Error);
}

}  // namespace
}  // namespace sb::harness
