#include <gtest/gtest.h>

#include "reports/report_internal.h"
#include "reports/test/test_rows.h"

namespace sb::reports {
namespace {

using test::passRow;
using test::tempDir;
using test::writeRun;

std::vector<ResultRow> roundTrip(const std::string& name, const std::vector<harness::Record>& rows) {
  return readResults(writeRun(tempDir(name), rows));
}

harness::Record onTorch(harness::Record r, const std::string& version) {
  r.provenance.torchVersion = version;
  return r;
}

const std::vector<Cell>* rowOf(const Table& t, const std::string& strategy) {
  for (const auto& row : t.rows) {
    if (row.size() > 1 && row[1].text == strategy) return &row;
  }
  return nullptr;
}

TEST(Versions, OnlyABaselineOfAnotherLibTorchIsAnUpgrade) {
  const auto old = roundTrip("v_same_old", {passRow("c", "a")});
  const auto same = roundTrip("v_same_new", {passRow("c", "a")});
  const auto upgraded = roundTrip("v_same_up", {onTorch(passRow("c", "a"), "2.13.0")});
  EXPECT_FALSE(versionsDiffer(same, old));
  EXPECT_FALSE(versionsDiffer(upgraded, {}));
  EXPECT_TRUE(versionsDiffer(upgraded, old));
}

// One row keeps everything, one gains 64 bytes of peak (its model no longer exact), one turns
// mispredicted, one fails: the family counts say so and the changed rows are exactly those three.
TEST(Versions, RowsWhosePeakStatusOrVerdictMovedAreListedAndCounted) {
  auto exact = [](harness::Record r) {
    r.predictedMemBytes = r.peakMemBytes;
    return r;
  };
  const std::vector<harness::Record> base = {exact(passRow("c", "same")), exact(passRow("c", "peak")),
                                             passRow("c", "verdict"), passRow("c", "status")};
  auto peak = exact(passRow("c", "peak"));
  *peak.peakMemBytes += 64;
  auto verdict = passRow("c", "verdict");
  verdict.mispredicted = "memory";
  auto status = passRow("c", "status");
  status.status = harness::Status::kFail;
  status.errRatio = 3.0;
  std::vector<harness::Record> cur = {exact(passRow("c", "same")), peak, verdict, status};
  for (auto& r : cur) r = onTorch(r, "2.13.0");
  const auto cmp = compare(roundTrip("v_rows_new", cur), roundTrip("v_rows_old", base), {});
  const VersionTables t = versionTables(cmp, 100);

  EXPECT_EQ(t.both, 4);
  EXPECT_EQ(t.samePeak, 3);
  EXPECT_EQ(t.changed, 3);
  ASSERT_EQ(t.families.rows.size(), 1u);
  const auto& fam = t.families.rows[0];
  EXPECT_EQ(fam[1].text, "4");          // rows in both
  EXPECT_EQ(fam[2].text, "3");          // same status
  EXPECT_EQ(fam[3].text, "3");          // pass on both
  EXPECT_EQ(fam[6].text, "3");          // same peak
  EXPECT_EQ(fam[7].text, "2 -> 1");     // exact models, old -> new
  EXPECT_EQ(fam[8].text, "0 -> 1");     // mispredicted, old -> new

  EXPECT_EQ(rowOf(t.changes, "same"), nullptr);
  const auto* p = rowOf(t.changes, "peak");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ((*p)[5].text, "10000 -> 10064 (+64)");
  const auto* v = rowOf(t.changes, "verdict");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ((*v)[7].text, "- -> memory");
  const auto* s = rowOf(t.changes, "status");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ((*s)[3].text, "pass -> fail");

  // The limit keeps the count whole.
  const VersionTables few = versionTables(cmp, 1);
  EXPECT_EQ(few.changes.rows.size(), 1u);
  EXPECT_EQ(few.changed, 3);
}

}  // namespace
}  // namespace sb::reports
