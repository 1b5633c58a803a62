// The data plane framing: round trips, hand-checked layout, and every
// malformed header or body rejected with a clear error (never trusted).
#include "common/transport/internal/wire.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/transport/test_util.h"

namespace vc::transport::internal {
namespace {

using testing::HasCode;

TEST(WireTest, RequestLayoutIsAsDocumented) {
  auto req = EncodeRequest({"ab", ""}, LinkClass::kSlow, 1234, 0x0102030405060708ull);
  ASSERT_TRUE(req.ok());
  // 32-byte header + (4 + 2) + (4 + 0).
  ASSERT_EQ(req->size(), 32u + 10u);
  EXPECT_EQ(req->substr(0, 4), "VCDP");
  EXPECT_EQ(static_cast<uint8_t>((*req)[4]), 1);      // version, little-endian
  EXPECT_EQ(static_cast<uint8_t>((*req)[6]), 1);      // type = fetch request
  EXPECT_EQ(static_cast<uint8_t>((*req)[8]), 1);      // link = slow
  EXPECT_EQ(static_cast<uint8_t>((*req)[12]), 2);     // key count
  EXPECT_EQ(static_cast<uint8_t>((*req)[16]), 10);    // body bytes
  EXPECT_EQ(static_cast<uint8_t>((*req)[24]), 0x08);  // max_response_bytes, low byte first
  EXPECT_EQ(static_cast<uint8_t>((*req)[31]), 0x01);
  EXPECT_EQ(req->substr(32), std::string("\x02\0\0\0ab\0\0\0\0", 10));

  auto h = DecodeRequestHeader(req->data());
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->link, LinkClass::kSlow);
  EXPECT_EQ(h->key_count, 2u);
  EXPECT_EQ(h->body_bytes, 10u);
  EXPECT_EQ(h->timeout_ms, 1234u);
  EXPECT_EQ(h->max_response_bytes, 0x0102030405060708ull);
  auto keys = DecodeRequestBody(req->substr(32), h->key_count, 16);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys, (std::vector<std::string>{"ab", ""}));
}

TEST(WireTest, BadRequestHeadersAreRejected) {
  std::string good = *EncodeRequest({"k"}, LinkClass::kFast, 0, 0);
  std::string bad = good;
  bad[0] = 'X';
  EXPECT_TRUE(
      HasCode(DecodeRequestHeader(bad.data()), absl::StatusCode::kInvalidArgument, "magic"));
  bad = good;
  bad[4] = 9;
  EXPECT_TRUE(
      HasCode(DecodeRequestHeader(bad.data()), absl::StatusCode::kInvalidArgument, "version 9"));
  bad = good;
  bad[6] = 2;
  EXPECT_TRUE(HasCode(DecodeRequestHeader(bad.data()), absl::StatusCode::kInvalidArgument, "type"));
  bad = good;
  bad[8] = 7;
  EXPECT_TRUE(HasCode(DecodeRequestHeader(bad.data()), absl::StatusCode::kInvalidArgument, "link"));
}

TEST(WireTest, BadRequestBodiesAreRejected) {
  // A key longer than allowed.
  std::string body = EncodeRequest({"abcdef"}, LinkClass::kFast, 0, 0)->substr(32);
  EXPECT_TRUE(
      HasCode(DecodeRequestBody(body, 1, 5), absl::StatusCode::kInvalidArgument, "limit is 5"));
  // Truncated inside the length, inside the key, and bytes left over.
  EXPECT_TRUE(HasCode(DecodeRequestBody(body.substr(0, 3), 1, 16),
                      absl::StatusCode::kInvalidArgument, "ends inside key 0"));
  EXPECT_TRUE(HasCode(DecodeRequestBody(body.substr(0, 7), 1, 16),
                      absl::StatusCode::kInvalidArgument, "ends inside key 0"));
  EXPECT_TRUE(HasCode(DecodeRequestBody(body + "x", 1, 16), absl::StatusCode::kInvalidArgument,
                      "after its keys"));
  // A huge claimed length does not allocate: it is checked against the body.
  std::string huge("\xff\xff\xff\x7f", 4);
  EXPECT_TRUE(HasCode(DecodeRequestBody(huge, 1, 0x7fffffff), absl::StatusCode::kInvalidArgument,
                      "ends inside key 0"));
  // More keys claimed than present.
  EXPECT_TRUE(HasCode(DecodeRequestBody(body, 2, 16), absl::StatusCode::kInvalidArgument,
                      "ends inside key 1"));
}

TEST(WireTest, ResponseHeaderRoundTripAndChecks) {
  ResponseHeader h;
  h.count = 3;
  std::string bytes = EncodeResponseHeader(h);
  ASSERT_EQ(bytes.size(), kResponseHeaderBytes);
  auto back = DecodeResponseHeader(bytes.data());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->code, 0u);
  EXPECT_EQ(back->count, 3u);

  std::string err = EncodeErrorResponse(absl::NotFoundError("key 00: gone"));
  ASSERT_EQ(err.size(), kResponseHeaderBytes + 12);
  back = DecodeResponseHeader(err.data());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->code, static_cast<uint32_t>(absl::StatusCode::kNotFound));
  EXPECT_EQ(back->message_bytes, 12u);
  EXPECT_EQ(err.substr(kResponseHeaderBytes), "key 00: gone");

  // Messages are truncated to the limit.
  err = EncodeErrorResponse(absl::InternalError(std::string(5000, 'm')));
  EXPECT_EQ(err.size(), kResponseHeaderBytes + kMaxMessageBytes);

  std::string bad = bytes;
  bad[8] = 17;  // no such status code
  EXPECT_TRUE(
      HasCode(DecodeResponseHeader(bad.data()), absl::StatusCode::kDataLoss, "status code"));
  bad = bytes;
  bad[16] = 5;  // a message on an OK response
  EXPECT_TRUE(HasCode(DecodeResponseHeader(bad.data()), absl::StatusCode::kDataLoss, "message"));
  bad = EncodeErrorResponse(absl::NotFoundError("x"));
  bad[17] = 0x10;  // message of 4097 bytes
  EXPECT_TRUE(HasCode(DecodeResponseHeader(bad.data()), absl::StatusCode::kDataLoss, "message"));
  bad = bytes;
  bad[1] = 0;
  EXPECT_TRUE(HasCode(DecodeResponseHeader(bad.data()), absl::StatusCode::kDataLoss, "magic"));
}

TEST(WireTest, KeyHexNamesTheKey) {
  EXPECT_EQ(KeyHex(std::string("\x00\xab", 2)), "00ab");
  const std::string long_key(100, '\x11');
  const std::string hex = KeyHex(long_key);
  EXPECT_EQ(hex.substr(0, 128), std::string(128, '1'));
  EXPECT_NE(hex.find("100 bytes"), std::string::npos);
}

TEST(WireTest, StageRequestLayoutIsAsDocumented) {
  const std::vector<std::pair<std::string, std::string>> entries = {{"ab", "xyz"}, {"", ""}};
  auto body_bytes = StageBodyBytes(entries);
  ASSERT_TRUE(body_bytes.ok()) << body_bytes.status();
  EXPECT_EQ(*body_bytes, (12u + 2 + 3) + 12u);
  const std::string header =
      EncodeStageHeader(0x1122334455667788ull, LinkClass::kFast, 2, *body_bytes, 99);
  ASSERT_EQ(header.size(), kRequestHeaderBytes);
  EXPECT_EQ(static_cast<uint8_t>(header[6]), 3);      // type = stage request
  EXPECT_EQ(static_cast<uint8_t>(header[24]), 0x88);  // put id, low byte first
  auto h = DecodeRequestHeader(header.data());
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->type, kTypeStageRequest);
  EXPECT_EQ(h->link, LinkClass::kFast);
  EXPECT_EQ(h->key_count, 2u);
  EXPECT_EQ(h->body_bytes, *body_bytes);
  EXPECT_EQ(h->timeout_ms, 99u);
  EXPECT_EQ(h->put_id, 0x1122334455667788ull);
  EXPECT_EQ(h->max_response_bytes, 0u);
  // u32 key length + key + u64 value length; the value follows.
  EXPECT_EQ(EncodeStageEntryHead("ab", 3), std::string("\x02\0\0\0ab\x03\0\0\0\0\0\0\0", 14));
}

TEST(WireTest, U64RoundTrip) {
  std::string s;
  PutU64(&s, 0xfedcba9876543210ull);
  ASSERT_EQ(s.size(), 8u);
  EXPECT_EQ(static_cast<uint8_t>(s[0]), 0x10);
  EXPECT_EQ(GetU64(s.data()), 0xfedcba9876543210ull);
}

}  // namespace
}  // namespace vc::transport::internal
