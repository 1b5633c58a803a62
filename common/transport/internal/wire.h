// The data plane's framing, shared by every backend (TCP bytes or a UCX
// stream). All integers little-endian.
//
// Request  = header (32 bytes) + body. Two request types share the header:
//   u32 magic 'VCDP' | u16 version | u16 type | u8 link | 3 reserved
//   u32 count | u32 body_bytes | u32 timeout_ms (0: none) | u64 arg
// Fetch (type=1, store -> worker): count keys, arg = max_response_bytes
//   (the client's limit on value bytes); body: count x (u32 length + key
//   bytes), exactly body_bytes long.
// Stage (type=3, worker -> store, the upload half of a two-phase put):
//   count entries, arg = put id (from the control plane's BeginPut); body:
//   count x (u32 key length + key + u64 value length + value), exactly
//   body_bytes long. The body is streamed: the server reads it piece by
//   piece (paced on `link`) and hands each entry to its stager as it lands.
// Response = header (24 bytes) + either an error message or the values.
//   u32 magic | u16 version | u16 type=2 | u32 code (absl::StatusCode) |
//   u32 count | u32 message_bytes | u32 reserved
//   code != 0: message_bytes of text follow (<= kMaxMessageBytes), nothing
//   else. code == 0: fetch: count x (u64 length + value bytes), in request
//   order; stage: nothing, count = the entries staged (all of them).
// A fetch fails as a whole (the first failing key's status, naming the key);
// values are only sent when every key was found and they fit the limits. A
// stage answers with its first failure (naming the key); entries before it
// may have been staged, which is harmless: a put stays invisible until its
// commit, and a writer that sees an error aborts the put.
//
// Version: stage requests came without a version bump. A server that
// predates them answers type 3 with InvalidArgument ("unexpected message
// type 3") and hangs up, which is the error a new writer then reports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/transport/data_plane.h"

namespace vc::transport::internal {

inline constexpr uint32_t kMagic = 0x50444356;  // "VCDP" read as little-endian bytes
inline constexpr uint16_t kVersion = 1;
inline constexpr uint16_t kTypeFetchRequest = 1;
inline constexpr uint16_t kTypeFetchResponse = 2;  // answers both request types
inline constexpr uint16_t kTypeStageRequest = 3;
inline constexpr size_t kRequestHeaderBytes = 32;
inline constexpr size_t kResponseHeaderBytes = 24;
inline constexpr size_t kEntryHeaderBytes = 8;
inline constexpr uint32_t kMaxMessageBytes = 1024;

// One u32 key length + one u64 value length: the framing of a stage entry.
inline constexpr size_t kStageEntryFramingBytes = 12;

struct RequestHeader {
  uint16_t type = kTypeFetchRequest;  // kTypeFetchRequest or kTypeStageRequest
  LinkClass link = LinkClass::kFast;
  uint32_t key_count = 0;  // fetch: keys; stage: entries
  uint32_t body_bytes = 0;
  uint32_t timeout_ms = 0;
  uint64_t max_response_bytes = 0;  // fetch only
  uint64_t put_id = 0;              // stage only
};

struct ResponseHeader {
  uint32_t code = 0;  // absl::StatusCode; 0 = OK
  uint32_t count = 0;
  uint32_t message_bytes = 0;
};

// Header + body of a fetch request. InvalidArgument if a key or the body does
// not fit the u32 fields.
absl::StatusOr<std::string> EncodeRequest(const std::vector<std::string>& keys, LinkClass link,
                                          uint32_t timeout_ms, uint64_t max_response_bytes);
// The header of a stage request whose body (count entries, body_bytes long,
// see StageBodyBytes) the caller streams after it.
std::string EncodeStageHeader(uint64_t put_id, LinkClass link, uint32_t entry_count,
                              uint32_t body_bytes, uint32_t timeout_ms);
// Body bytes of a stage of `entries`; InvalidArgument if the entry count,
// a key, or the body does not fit the u32 fields.
absl::StatusOr<uint32_t> StageBodyBytes(
    absl::Span<const std::pair<std::string, std::string>> entries);
// The framing in front of one entry's value: u32 key length + key + u64
// value length.
std::string EncodeStageEntryHead(const std::string& key, uint64_t value_bytes);

// Checks magic, version and type (fetch or stage); InvalidArgument (with what
// was wrong) otherwise. The link byte is checked too. Counts are not bounded here: the
// server bounds them against its options.
absl::StatusOr<RequestHeader> DecodeRequestHeader(const char* bytes);
// Splits a body into key_count keys, each at most max_key_bytes long, that
// exactly fill the body. InvalidArgument otherwise.
absl::StatusOr<std::vector<std::string>> DecodeRequestBody(const std::string& body,
                                                           uint32_t key_count,
                                                           uint32_t max_key_bytes);

std::string EncodeResponseHeader(const ResponseHeader& header);
// Checks magic, version, type, that code is a known absl::StatusCode and that
// message_bytes <= kMaxMessageBytes (and 0 when code is 0). DataLoss otherwise.
absl::StatusOr<ResponseHeader> DecodeResponseHeader(const char* bytes);

// The header and message of an error response (message truncated to
// kMaxMessageBytes).
std::string EncodeErrorResponse(const absl::Status& status);

void PutU64(std::string* out, uint64_t v);
uint64_t GetU64(const char* p);
uint32_t GetU32(const char* p);

// Hex of a key for error messages; long keys are cut to their first 64 bytes.
std::string KeyHex(const std::string& key);

}  // namespace vc::transport::internal
