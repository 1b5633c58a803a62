// The coordinator's request checks (services/coordinator/request_validation.h)
// on their own: every rule's error names what was wrong, accepted requests
// pass, and the NaN ratio that the old inline check let through is refused.
#include "services/coordinator/request_validation.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/status_matchers.h"

namespace vc::coordinator {
namespace {

namespace pb = ::vericache::v1;
using ::vc::testing::StatusIs;

constexpr RequestLimits kLimits{512, 256, 16};

CompressorOptions Fallback() {
  CompressorOptions c;
  c.name = "snapkv";
  c.ratio = 0.25;
  return c;
}

pb::GenerateRequest Valid() {
  pb::GenerateRequest r;
  for (int i = 0; i < 20; ++i) r.add_prompt_ids(i);
  r.set_max_new_tokens(8);
  return r;
}

absl::Status Check(const pb::GenerateRequest& r) {
  std::vector<int32_t> prompt(r.prompt_ids().begin(), r.prompt_ids().end());
  return ValidateGenerate(r, prompt, kLimits, Fallback());
}

TEST(RequestValidationTest, AcceptsPlainAndCompressedRequests) {
  EXPECT_TRUE(Check(Valid()).ok());
  pb::GenerateRequest r = Valid();
  r.set_compressor("kivi");
  r.set_bits(4);
  EXPECT_TRUE(Check(r).ok());
}

TEST(RequestValidationTest, PromptSource) {
  pb::GenerateRequest both = Valid();
  both.set_prefix_id(std::string(64, 'a'));
  EXPECT_THAT(CheckPromptSource(both), StatusIs(absl::StatusCode::kInvalidArgument, {"not both"}));
  pb::GenerateRequest suffix = Valid();
  suffix.clear_prompt_ids();
  suffix.add_suffix_ids(1);
  EXPECT_THAT(CheckPromptSource(suffix),
              StatusIs(absl::StatusCode::kInvalidArgument, {"suffix_ids need a prefix_id"}));
  EXPECT_TRUE(CheckPromptSource(Valid()).ok());
}

TEST(RequestValidationTest, PrefixIds) {
  auto raw = ParsePrefixId(std::string(64, 'F'));
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->size(), 32u);
  EXPECT_THAT(ParsePrefixId(std::string(63, 'a')),
              StatusIs(absl::StatusCode::kInvalidArgument, {"64-digit hex"}));
  EXPECT_THAT(ParsePrefixId(std::string(63, 'a') + "g"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"64-digit hex"}));
}

TEST(RequestValidationTest, EachRuleNamesItsField) {
  pb::GenerateRequest r = Valid();
  r.set_deadline_ms(-1);
  EXPECT_THAT(Check(r), StatusIs(absl::StatusCode::kInvalidArgument, {"deadline_ms"}));
  r = Valid();
  r.clear_prompt_ids();
  EXPECT_THAT(Check(r), StatusIs(absl::StatusCode::kInvalidArgument, {"prompt is empty"}));
  r = Valid();
  r.set_prompt_ids(3, 512);
  EXPECT_THAT(Check(r), StatusIs(absl::StatusCode::kInvalidArgument, {"prompt token 3", "512"}));
  r = Valid();
  r.set_max_new_tokens(0);
  EXPECT_THAT(Check(r), StatusIs(absl::StatusCode::kInvalidArgument, {"max_new_tokens"}));
  r = Valid();
  r.set_max_new_tokens(237);  // 20 + 237 > 256
  EXPECT_THAT(Check(r), StatusIs(absl::StatusCode::kInvalidArgument, {"context of 256"}));
  r = Valid();
  r.set_max_new_tokens(std::numeric_limits<int64_t>::max());  // no overflow in the sum
  EXPECT_THAT(Check(r), StatusIs(absl::StatusCode::kInvalidArgument, {"context of 256"}));
  r = Valid();
  r.set_draft_len(-2);
  EXPECT_THAT(Check(r), StatusIs(absl::StatusCode::kInvalidArgument, {"draft_len"}));
  r = Valid();
  r.set_ratio(0.5);
  EXPECT_THAT(Check(r), StatusIs(absl::StatusCode::kInvalidArgument, {"need a compressor"}));
  r = Valid();
  r.set_compressor("no-such-method");
  EXPECT_FALSE(Check(r).ok());
  r = Valid();
  r.set_compressor("snapkv");
  r.set_ratio(1.5);
  EXPECT_THAT(Check(r), StatusIs(absl::StatusCode::kInvalidArgument, {"ratio"}));
  r = Valid();
  r.set_online_update(true);
  r.set_mode(pb::MODE_FULL_LOCAL);
  EXPECT_THAT(Check(r), StatusIs(absl::StatusCode::kInvalidArgument, {"online_update", "full_local"}));
}

TEST(RequestValidationTest, NanRatioIsRefused) {
  pb::GenerateRequest r = Valid();
  r.set_compressor("snapkv");
  r.set_ratio(std::nan(""));
  EXPECT_THAT(Check(r), StatusIs(absl::StatusCode::kInvalidArgument, {"ratio"}));
}

TEST(RequestValidationTest, RegisterPrefix) {
  pb::RegisterPrefixRequest r;
  for (int i = 0; i < 20; ++i) r.add_tokens(i);
  EXPECT_TRUE(ValidateRegisterPrefix(r, kLimits, "snapkv:0.25").ok());
  pb::RegisterPrefixRequest short_one;
  short_one.add_tokens(1);
  EXPECT_THAT(ValidateRegisterPrefix(short_one, kLimits, "snapkv:0.25"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"whole chunk of 16"}));
  pb::RegisterPrefixRequest bad_id = r;
  bad_id.set_tokens(5, -1);
  EXPECT_THAT(ValidateRegisterPrefix(bad_id, kLimits, "snapkv:0.25"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"token 5", "-1"}));
  pb::RegisterPrefixRequest long_one;
  for (int i = 0; i < 256; ++i) long_one.add_tokens(1);
  EXPECT_THAT(ValidateRegisterPrefix(long_one, kLimits, "snapkv:0.25"),
              StatusIs(absl::StatusCode::kInvalidArgument, {"no room"}));
  pb::RegisterPrefixRequest variants = r;
  variants.set_variants("snapkv:7");
  EXPECT_FALSE(ValidateRegisterPrefix(variants, kLimits, "snapkv:0.25").ok());
}

}  // namespace
}  // namespace vc::coordinator
