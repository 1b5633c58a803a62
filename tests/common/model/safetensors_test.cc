// The safetensors reader on hand-built files: what it accepts and the error
// for each way a header can be corrupt or a file truncated.
#include "common/model/internal/safetensors.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/hf_checkpoint_writer.h"
#include "tests/common/model/status_matchers.h"
#include "tests/scratch_dir.h"

namespace vc::safetensors {
namespace {

using ::vc::testing::StatusIs;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

std::string F32Bytes(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  // Writes [header length][header][data] and opens it. `length` overrides
  // the header length field.
  absl::StatusOr<File> OpenRaw(const std::string& header, const std::string& data,
                               std::optional<uint64_t> length = std::nullopt) {
    const uint64_t n = length.value_or(header.size());
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &n, 8);
    return OpenBytes(bytes + header + data);
  }
  absl::StatusOr<File> OpenBytes(const std::string& bytes) {
    path_ = tmp_.path() + "/t" + std::to_string(next_++) + ".safetensors";
    vc::testing::WriteFile(path_, bytes);
    return File::Open(path_);
  }

  test_support::ScratchDir tmp_{"vc_model_"};
  std::string path_;
  int next_ = 0;
};

TEST_F(SafetensorsTest, ParsesTensors) {
  const std::string data = F32Bytes({1, 2, 3, 4, 5, 6}) + std::string("\x80\x3f\x00\x40", 4);
  auto f = OpenRaw(R"({"__metadata__": {"format": "pt"},
                       "b": {"dtype": "BF16", "shape": [2], "data_offsets": [24, 28]},
                       "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})",
                   data);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->path(), path_);
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "a");  // data order, not header order
  const TensorInfo* a = f->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, "F32");
  EXPECT_EQ(a->element_size, 4u);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->num_elements, 6);
  float x[6];
  std::memcpy(x, a->data, sizeof(x));
  EXPECT_EQ(x[5], 6.0f);
  const TensorInfo* b = f->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->begin, 24u);
  EXPECT_EQ(b->end, 28u);
  EXPECT_EQ(b->data, a->data + 24);
  EXPECT_EQ(f->Find("c"), nullptr);
}

TEST_F(SafetensorsTest, ExposesMetadataAndRejectsNonStringValues) {
  const std::string data = F32Bytes({1, 2});
  auto f = OpenRaw(R"({"__metadata__": {"format": "pt", "model.embed_tokens.weight": "lm_head.weight"},
                       "lm_head.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                   data);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata().at("model.embed_tokens.weight"), "lm_head.weight");
  EXPECT_EQ(f->metadata().at("format"), "pt");
  // The reference implementation reads __metadata__ as strings to strings.
  EXPECT_THAT(OpenRaw(R"({"__metadata__": {"total_size": 8},
                          "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                      data),
              StatusIs(kInvalid, {"__metadata__", "'total_size'", "not a string"}));
  EXPECT_THAT(OpenRaw(R"({"__metadata__": ["pt"],
                          "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                      data),
              StatusIs(kInvalid, {"__metadata__ is not an object"}));
}

TEST_F(SafetensorsTest, AcceptsScalarsEmptyTensorsAndPaddedHeaders) {
  auto f = OpenRaw(R"({"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
                       "e": {"dtype": "F16", "shape": [0, 5], "data_offsets": [4, 4]}}     )",
                   F32Bytes({7}));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->Find("s")->num_elements, 1);
  EXPECT_EQ(f->Find("e")->num_elements, 0);

  f = OpenRaw("{}", "");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->tensors().empty());
}

TEST_F(SafetensorsTest, RejectsShortFiles) {
  EXPECT_THAT(OpenBytes(""), StatusIs(kInvalid, {"truncated", "0 bytes"}));
  EXPECT_THAT(OpenBytes("12345"), StatusIs(kInvalid, {"truncated", "5 bytes"}));
}

TEST_F(SafetensorsTest, RejectsHeaderLengthBeyondTheFile) {
  EXPECT_THAT(OpenRaw("{}", "", 3), StatusIs(kInvalid, {"header length 3 exceeds the 2 bytes"}));
  // No wrap-around on absurd lengths.
  EXPECT_THAT(OpenRaw("{}", "", UINT64_MAX), StatusIs(kInvalid, {"header length"}));
}

TEST_F(SafetensorsTest, RejectsBadJson) {
  auto s = OpenRaw(R"({"a": {"dtype": "F32",)", "");
  EXPECT_THAT(s, StatusIs(kInvalid, {"not valid JSON"}));
  EXPECT_THAT(s, StatusIs(kInvalid, {path_}));
  EXPECT_THAT(OpenRaw("", ""), StatusIs(kInvalid, {"not valid JSON"}));
  EXPECT_THAT(OpenRaw("[1, 2]", ""), StatusIs(kInvalid, {"not a JSON object"}));
  EXPECT_THAT(OpenRaw("{\"a\": \"\xff\xfe\"}", ""), StatusIs(kInvalid, {"not valid JSON"}));
}

TEST_F(SafetensorsTest, RejectsMalformedEntries) {
  EXPECT_THAT(OpenRaw(R"({"a": 5})", ""), StatusIs(kInvalid, {"'a'", "not an object"}));
  EXPECT_THAT(OpenRaw(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", F32Bytes({1})),
              StatusIs(kInvalid, {"'a'", "dtype"}));
  EXPECT_THAT(OpenRaw(R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", F32Bytes({1})),
              StatusIs(kInvalid, {"'a'", "shape"}));
  EXPECT_THAT(
      OpenRaw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", F32Bytes({1})),
      StatusIs(kInvalid, {"'a'", "data_offsets"}));
  EXPECT_THAT(
      OpenRaw(R"({"a": {"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 4]}})", F32Bytes({1})),
      StatusIs(kInvalid, {"'a'", "unknown dtype 'Q4_K'"}));
  EXPECT_THAT(
      OpenRaw(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", F32Bytes({1})),
      StatusIs(kInvalid, {"'a'", "shape entry", "-1"}));
  EXPECT_THAT(
      OpenRaw(R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", F32Bytes({1})),
      StatusIs(kInvalid, {"'a'", "shape entry"}));
  EXPECT_THAT(
      OpenRaw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, "4"]}})", F32Bytes({1})),
      StatusIs(kInvalid, {"'a'", "data_offsets end"}));
  EXPECT_THAT(OpenRaw(R"({"a": {"dtype": "U8", "shape": [1099511627776, 1099511627776],
                        "data_offsets": [0, 4]}})",
                      F32Bytes({1})),
              StatusIs(kInvalid, {"'a'", "too many elements"}));
}

TEST_F(SafetensorsTest, RejectsInconsistentOffsets) {
  const std::string data = F32Bytes({1, 2, 3, 4});
  EXPECT_THAT(OpenRaw(R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", data),
              StatusIs(kInvalid, {"'a'", "end before they begin"}));
  EXPECT_THAT(OpenRaw(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", data),
              StatusIs(kInvalid, {"'a'", "span 16 bytes", "[3] of F32 needs 12"}));
  EXPECT_THAT(OpenRaw(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
                          "c": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}})",
                      data),
              StatusIs(kInvalid, {"'a'", "'b'", "overlap"}));
  EXPECT_THAT(OpenRaw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                      data),
              StatusIs(kInvalid, {"hole", "[4, 8)", "'b'"}));
  EXPECT_THAT(OpenRaw(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}})", data),
              StatusIs(kInvalid, {"4 trailing bytes"}));
}

TEST_F(SafetensorsTest, RejectsTruncatedData) {
  EXPECT_THAT(OpenRaw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                          "big": {"dtype": "BF16", "shape": [8], "data_offsets": [4, 20]}})",
                      F32Bytes({1, 2, 3})),
              StatusIs(kInvalid, {"'big'", "truncated", "[4, 20)", "12-byte data section"}));
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  EXPECT_THAT(File::Open(tmp_.path() + "/nope.safetensors"),
              StatusIs(absl::StatusCode::kNotFound, {"nope.safetensors"}));
}

TEST(SafetensorsHelpers, DtypeSizeAndShapeString) {
  EXPECT_EQ(DtypeSize("F32"), 4u);
  EXPECT_EQ(DtypeSize("BF16"), 2u);
  EXPECT_EQ(DtypeSize("F64"), 8u);
  EXPECT_EQ(DtypeSize("I8"), 1u);
  EXPECT_EQ(DtypeSize("f32"), 0u);
  EXPECT_EQ(ShapeString({}), "[]");
  EXPECT_EQ(ShapeString({4, 64}), "[4, 64]");
}

}  // namespace
}  // namespace vc::safetensors
