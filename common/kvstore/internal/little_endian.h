// Internal: the little-endian u32 fields of the kvstore's byte formats.
#pragma once

#include <cstdint>
#include <string>

namespace vc::kvstore::internal {

inline void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(static_cast<uint8_t>(v >> (8 * i))));
}

inline uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace vc::kvstore::internal
