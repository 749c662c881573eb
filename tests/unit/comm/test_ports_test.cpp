// The unit tests' side of the test port registry (tests/unit/test_ports.h, the same files as
// tests/integration/ports.py, whose own test is suite.ports): claims are distinct, held
// while this process lives, free to bind, and below the kernel's ephemeral range.
#include <gtest/gtest.h>

#include <set>

#include "../test_ports.h"

namespace tessera::test_ports {
namespace {

TEST(TestPorts, ClaimsAreDistinctHeldAndBelowTheEphemeralRange) {
  const auto [first, last] = claimable_range();
  std::set<int> seen;
  for (int count : {1, 2, 1, 3}) {
    const int port = claim(count);
    for (int p = port; p < port + count; ++p) {
      EXPECT_TRUE(seen.insert(p).second) << "port " << p << " handed out twice";
      EXPECT_TRUE(held(p)) << p;
      EXPECT_TRUE(bindable(p)) << p;
      EXPECT_GE(p, first);
      EXPECT_LE(p, last);
    }
  }
}

}  // namespace
}  // namespace tessera::test_ports
