// LoadGenerationConfig on generation_config.json files as real checkpoints
// ship them (one EOS id, a list, nulls) and the error for each malformed one.
#include "common/model/generation_config.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/hf_checkpoint_writer.h"
#include "tests/common/model/status_matchers.h"
#include "tests/scratch_dir.h"

namespace vc {
namespace {

using ::vc::testing::StatusIs;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

class GenerationConfigTest : public ::testing::Test {
 protected:
  absl::StatusOr<GenerationConfig> Load(const std::string& text) {
    const std::string dir = tmp_.Subdir(absl::StrCat("g", next_++));
    vc::testing::WriteFile(dir + "/generation_config.json", text);
    return LoadGenerationConfig(dir);
  }
  test_support::ScratchDir tmp_{"vc_model_"};
  int next_ = 0;
};

TEST_F(GenerationConfigTest, SingleIdAsTransformersWritesIt) {
  auto g = Load(R"({"_from_model_config": true, "bos_token_id": 1, "eos_token_id": 2,
                    "transformers_version": "4.41.2"})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->eos_token_ids, std::vector<int32_t>{2});
  EXPECT_EQ(g->bos_token_id, 1);
  EXPECT_FALSE(g->pad_token_id.has_value());
}

TEST_F(GenerationConfigTest, ListOfIdsAndNulls) {
  // Llama-3.1-8B-Instruct's, verbatim apart from sampling fields.
  auto g = Load(R"({"bos_token_id": 128000, "do_sample": true,
                    "eos_token_id": [128001, 128008, 128009], "temperature": 0.6, "top_p": 0.9})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(g->bos_token_id, 128000);

  g = Load(R"({"eos_token_id": null, "bos_token_id": null, "pad_token_id": 0})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->eos_token_ids.empty());
  EXPECT_FALSE(g->bos_token_id.has_value());
  EXPECT_EQ(g->pad_token_id, 0);

  g = Load("{}");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->eos_token_ids.empty());
}

TEST_F(GenerationConfigTest, AbsentFileIsNotFound) {
  EXPECT_THAT(LoadGenerationConfig(tmp_.Subdir("empty")),
              StatusIs(absl::StatusCode::kNotFound, {"generation_config.json"}));
}

TEST_F(GenerationConfigTest, RejectsMalformedFields) {
  EXPECT_THAT(Load(R"({"eos_token_id": "2"})"), StatusIs(kInvalid, {"'eos_token_id'", "integer"}));
  EXPECT_THAT(Load(R"({"eos_token_id": 2.5})"), StatusIs(kInvalid, {"'eos_token_id'", "integer"}));
  EXPECT_THAT(Load(R"({"eos_token_id": -1})"), StatusIs(kInvalid, {"'eos_token_id'", "[0, 2^31)"}));
  EXPECT_THAT(Load(R"({"eos_token_id": 2147483648})"),
              StatusIs(kInvalid, {"'eos_token_id'", "[0, 2^31)"}));
  EXPECT_THAT(Load(R"({"eos_token_id": []})"), StatusIs(kInvalid, {"'eos_token_id'", "empty"}));
  EXPECT_THAT(Load(R"({"eos_token_id": [1, "x"]})"),
              StatusIs(kInvalid, {"'eos_token_id[1]'", "integer"}));
  EXPECT_THAT(Load(R"({"bos_token_id": [1]})"), StatusIs(kInvalid, {"'bos_token_id'"}));
  EXPECT_THAT(Load(R"({"pad_token_id": -1})"), StatusIs(kInvalid, {"'pad_token_id'"}));
  std::string many = R"({"eos_token_id": [)";
  for (int i = 0; i < 1000; ++i) many += (i ? ",1" : "1");
  EXPECT_THAT(Load(many + "]}"), StatusIs(kInvalid, {"'eos_token_id'", "1000 ids", "at most"}));
  EXPECT_THAT(Load("[2]"), StatusIs(kInvalid, {"not a JSON object"}));
  EXPECT_THAT(Load(R"({"eos_token_id": 2)"), StatusIs(kInvalid, {"not valid JSON"}));
  EXPECT_THAT(Load(""), StatusIs(kInvalid, {"not valid JSON"}));
  std::string huge(size_t{2} << 20, ' ');
  huge.append("{}");
  EXPECT_THAT(Load(huge), StatusIs(kInvalid, {"limit"}));
}

TEST_F(GenerationConfigTest, Tinystories656K) {
  const char* models = std::getenv("VC_MODELS_DIR");
  if (models == nullptr) GTEST_SKIP() << "VC_MODELS_DIR is not set";
  const std::string dir = std::string(models) + "/tinystories656K";
  auto g = LoadGenerationConfig(dir);
  if (absl::IsNotFound(g.status())) GTEST_SKIP() << dir << " not found";
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->eos_token_ids, std::vector<int32_t>{2});  // <|end_story|>
  EXPECT_EQ(g->bos_token_id, 1);                         // <|start_story|>
}

}  // namespace
}  // namespace vc
