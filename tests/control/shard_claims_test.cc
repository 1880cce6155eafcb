// Unit tests of sluice::internal::ShardClaims: which worker_addresses entry
// a registering worker takes.
#include "sluice/control/shard_claims.h"

#include <set>
#include <string>

#include "tests/test_util.h"

namespace sluice::internal {
namespace {

TEST(ShardClaimsTest, AWorkerTakesItsEntryOrAFreeEntryOfItsHost) {
  ShardClaims claims({"a:1", "b:%port%", "b:%port%"});
  EXPECT_EQ(claims.size(), 3);
  std::set<std::string> live;
  auto is_live = [&live](const std::string& a) { return live.count(a) > 0; };
  EXPECT_EQ(claims.Find("a:1", is_live).value(), 0);
  EXPECT_EQ(claims.Find("b:7", is_live).value(), 1);
  claims.Claim(1, "b:7");
  live.insert("b:7");
  EXPECT_EQ(claims.Find("b:8", is_live).value(), 2);
  claims.Claim(2, "b:8");
  live.insert("b:8");
  EXPECT_STATUS(claims.Find("b:9", is_live), absl::StatusCode::kFailedPrecondition,
                "not in the dispatcher's worker_addresses [a:1, b:%port%, b:%port%]");
  EXPECT_STATUS(claims.Find("c:1", is_live), absl::StatusCode::kFailedPrecondition, "c:1");
  // A claim outlives its worker: b:7 comes back to entry 1; once b:8 is
  // gone, another worker of host b may take its entry.
  live.erase("b:7");
  live.erase("b:8");
  EXPECT_EQ(claims.Find("b:7", is_live).value(), 1);
  EXPECT_EQ(claims.Find("b:9", is_live).value(), 1);
  claims.Claim(1, "b:7");
  live.insert("b:7");
  EXPECT_EQ(claims.Find("b:9", is_live).value(), 2);
  claims.Claim(7, "x:1");  // out of range: ignored
  EXPECT_EQ(claims.holders(), (std::vector<std::string>{"", "b:7", "b:8"}));
}

}  // namespace
}  // namespace sluice::internal
