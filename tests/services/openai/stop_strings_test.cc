#include "services/openai/stop_strings.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace vc::openai {
namespace {

// Feeds `pieces` one by one; returns every emitted piece (Finish last).
std::vector<std::string> Feed(StopStringFilter& f, const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (const auto& p : pieces) out.push_back(f.Push(p));
  out.push_back(f.Finish());
  return out;
}

TEST(StopStringFilterTest, NoStopsPassesEverythingThrough) {
  StopStringFilter f({});
  EXPECT_EQ(Feed(f, {"a", "bc", ""}), (std::vector<std::string>{"a", "bc", "", ""}));
  EXPECT_FALSE(f.stopped());
}

TEST(StopStringFilterTest, StopInsideOnePieceCutsBeforeIt) {
  StopStringFilter f({"END"});
  EXPECT_EQ(f.Push("hello END world"), "hello ");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.Push("more"), "");
  EXPECT_EQ(f.Finish(), "");
}

TEST(StopStringFilterTest, StopAcrossPiecesIsHeldBackThenDropped) {
  StopStringFilter f({"\n\n"});
  EXPECT_EQ(f.Push("one\n"), "one");  // "\n" may start the stop string
  EXPECT_FALSE(f.stopped());
  EXPECT_EQ(f.Push("\ntwo"), "");
  EXPECT_TRUE(f.stopped());
}

TEST(StopStringFilterTest, HeldBackTextIsReleasedWhenItIsNotAStop) {
  StopStringFilter f({"STOP"});
  EXPECT_EQ(f.Push("xST"), "x");
  EXPECT_EQ(f.Push("AR"), "STAR");
  EXPECT_EQ(f.Push("S"), "");
  EXPECT_EQ(f.Finish(), "S");
  EXPECT_FALSE(f.stopped());
}

TEST(StopStringFilterTest, EarliestOfSeveralStopsWins) {
  StopStringFilter f({"world", "lo w"});
  EXPECT_EQ(f.Push("hello world"), "hel");
}

TEST(StopStringFilterTest, OverlappingCandidatesKeepTheLongest) {
  StopStringFilter f({"abcd", "cx"});
  EXPECT_EQ(f.Push("zabc"), "z");  // "abc" could still become "abcd"
  EXPECT_EQ(f.Push("x"), "ab");    // it became "cx" instead
  EXPECT_TRUE(f.stopped());
  StopStringFilter g({"abcd", "cx"});
  EXPECT_EQ(g.Push("zabc"), "z");
  EXPECT_EQ(g.Push("y"), "abcy");  // neither
  EXPECT_FALSE(g.stopped());
}

TEST(StopStringFilterTest, MultiByteCharactersAreNeverSplit) {
  // "é" is C3 A9; the stop starts with the same character.
  StopStringFilter f({"\xC3\xA9t\xC3\xA9"});
  EXPECT_EQ(f.Push("caf\xC3\xA9"), "caf");
  EXPECT_EQ(f.Push(" ok"), "\xC3\xA9 ok");
  EXPECT_EQ(f.Push("\xC3\xA9t\xC3\xA9!"), "");
  EXPECT_TRUE(f.stopped());
}

TEST(StopStringFilterTest, ConcatenationEqualsOneShotTruncation) {
  const std::string text = "The cat sat. The dog ran. The end.";
  const std::vector<std::string> stops = {"dog r", "zzz"};
  std::string streamed;
  StopStringFilter f(stops);
  for (char c : text) streamed += f.Push(std::string(1, c));
  streamed += f.Finish();
  EXPECT_EQ(streamed, text.substr(0, text.find("dog r")));
}

}  // namespace
}  // namespace vc::openai
