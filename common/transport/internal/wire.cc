#include "common/transport/internal/wire.h"

#include <cstring>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace vc::transport::internal {
namespace {

void PutU16(std::string* out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint16_t GetU16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}

// The 32-byte header of either request type.
std::string EncodeHeader(uint16_t type, LinkClass link, uint32_t count, uint32_t body_bytes,
                         uint32_t timeout_ms, uint64_t arg) {
  std::string out;
  out.reserve(kRequestHeaderBytes);
  PutU32(&out, kMagic);
  PutU16(&out, kVersion);
  PutU16(&out, type);
  out.push_back(static_cast<char>(link == LinkClass::kFast ? 0 : 1));
  out.append(3, '\0');
  PutU32(&out, count);
  PutU32(&out, body_bytes);
  PutU32(&out, timeout_ms);
  PutU64(&out, arg);
  return out;
}

}  // namespace

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string KeyHex(const std::string& key) {
  constexpr size_t kShown = 64;
  if (key.size() <= kShown) return absl::BytesToHexString(key);
  return absl::StrCat(absl::BytesToHexString(key.substr(0, kShown)), "...(", key.size(), " bytes)");
}

absl::StatusOr<std::string> EncodeRequest(const std::vector<std::string>& keys, LinkClass link,
                                          uint32_t timeout_ms, uint64_t max_response_bytes) {
  constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();
  if (keys.size() > kU32Max) return absl::InvalidArgumentError("too many keys for one fetch");
  uint64_t body_bytes = 0;
  for (const std::string& key : keys) body_bytes += 4 + key.size();
  if (body_bytes > kU32Max) {
    return absl::InvalidArgumentError(
        absl::StrCat("fetch request body of ", body_bytes, " bytes does not fit the framing"));
  }
  std::string out = EncodeHeader(kTypeFetchRequest, link, static_cast<uint32_t>(keys.size()),
                                 static_cast<uint32_t>(body_bytes), timeout_ms, max_response_bytes);
  out.reserve(kRequestHeaderBytes + body_bytes);
  for (const std::string& key : keys) {
    PutU32(&out, static_cast<uint32_t>(key.size()));
    out.append(key);
  }
  return out;
}

std::string EncodeStageHeader(uint64_t put_id, LinkClass link, uint32_t entry_count,
                              uint32_t body_bytes, uint32_t timeout_ms) {
  return EncodeHeader(kTypeStageRequest, link, entry_count, body_bytes, timeout_ms, put_id);
}

absl::StatusOr<uint32_t> StageBodyBytes(
    absl::Span<const std::pair<std::string, std::string>> entries) {
  constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();
  if (entries.size() > kU32Max) return absl::InvalidArgumentError("too many entries for one stage");
  uint64_t body_bytes = 0;
  for (const auto& [key, value] : entries) {
    if (key.size() > kU32Max)
      return absl::InvalidArgumentError("stage key does not fit the framing");
    body_bytes += kStageEntryFramingBytes + key.size() + value.size();
  }
  if (body_bytes > kU32Max) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage request body of ", body_bytes, " bytes does not fit the framing"));
  }
  return static_cast<uint32_t>(body_bytes);
}

std::string EncodeStageEntryHead(const std::string& key, uint64_t value_bytes) {
  std::string out;
  out.reserve(kStageEntryFramingBytes + key.size());
  PutU32(&out, static_cast<uint32_t>(key.size()));
  out.append(key);
  PutU64(&out, value_bytes);
  return out;
}

absl::StatusOr<RequestHeader> DecodeRequestHeader(const char* bytes) {
  if (GetU32(bytes) != kMagic) return absl::InvalidArgumentError("bad magic in data plane request");
  if (uint16_t v = GetU16(bytes + 4); v != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported data plane protocol version ", v,
                                                   " (this server speaks ", kVersion, ")"));
  }
  const uint16_t type = GetU16(bytes + 6);
  if (type != kTypeFetchRequest && type != kTypeStageRequest) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected message type ", type));
  }
  RequestHeader h;
  h.type = type;
  const uint8_t link = static_cast<uint8_t>(bytes[8]);
  if (link > 1) return absl::InvalidArgumentError(absl::StrCat("unknown link class ", link));
  h.link = link == 0 ? LinkClass::kFast : LinkClass::kSlow;
  h.key_count = GetU32(bytes + 12);
  h.body_bytes = GetU32(bytes + 16);
  h.timeout_ms = GetU32(bytes + 20);
  if (type == kTypeFetchRequest) {
    h.max_response_bytes = GetU64(bytes + 24);
  } else {
    h.put_id = GetU64(bytes + 24);
  }
  return h;
}

absl::StatusOr<std::vector<std::string>> DecodeRequestBody(const std::string& body,
                                                           uint32_t key_count,
                                                           uint32_t max_key_bytes) {
  std::vector<std::string> keys;
  keys.reserve(key_count);
  size_t pos = 0;
  for (uint32_t i = 0; i < key_count; ++i) {
    if (body.size() - pos < 4) {
      return absl::InvalidArgumentError(absl::StrCat("fetch request body ends inside key ", i));
    }
    const uint32_t len = GetU32(body.data() + pos);
    pos += 4;
    if (len > max_key_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("key ", i, " is ", len, " bytes; the limit is ", max_key_bytes));
    }
    if (body.size() - pos < len) {
      return absl::InvalidArgumentError(absl::StrCat("fetch request body ends inside key ", i));
    }
    keys.emplace_back(body.data() + pos, len);
    pos += len;
  }
  if (pos != body.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fetch request body has ", body.size() - pos, " bytes after its keys"));
  }
  return keys;
}

std::string EncodeResponseHeader(const ResponseHeader& header) {
  std::string out;
  out.reserve(kResponseHeaderBytes);
  PutU32(&out, kMagic);
  PutU16(&out, kVersion);
  PutU16(&out, kTypeFetchResponse);
  PutU32(&out, header.code);
  PutU32(&out, header.count);
  PutU32(&out, header.message_bytes);
  PutU32(&out, 0);
  return out;
}

absl::StatusOr<ResponseHeader> DecodeResponseHeader(const char* bytes) {
  if (GetU32(bytes) != kMagic) return absl::DataLossError("bad magic in fetch response");
  if (uint16_t v = GetU16(bytes + 4); v != kVersion) {
    return absl::DataLossError(absl::StrCat("unsupported data plane protocol version ", v));
  }
  if (uint16_t t = GetU16(bytes + 6); t != kTypeFetchResponse) {
    return absl::DataLossError(absl::StrCat("unexpected message type ", t));
  }
  ResponseHeader h;
  h.code = GetU32(bytes + 8);
  h.count = GetU32(bytes + 12);
  h.message_bytes = GetU32(bytes + 16);
  if (h.code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::DataLossError(absl::StrCat("unknown status code ", h.code, " in fetch response"));
  }
  if (h.message_bytes > kMaxMessageBytes || (h.code == 0 && h.message_bytes != 0)) {
    return absl::DataLossError(
        absl::StrCat("bad message length ", h.message_bytes, " in fetch response"));
  }
  if (h.code != 0 && h.count != 0) {
    return absl::DataLossError("error fetch response carries values");
  }
  return h;
}

std::string EncodeErrorResponse(const absl::Status& status) {
  std::string message(status.message().substr(0, kMaxMessageBytes));
  ResponseHeader h;
  h.code = static_cast<uint32_t>(status.code());
  if (h.code == 0) h.code = static_cast<uint32_t>(absl::StatusCode::kInternal);
  h.message_bytes = static_cast<uint32_t>(message.size());
  return EncodeResponseHeader(h) + message;
}

}  // namespace vc::transport::internal
