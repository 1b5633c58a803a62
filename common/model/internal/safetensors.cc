#include "common/model/internal/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace vc::safetensors {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swaps");

using Json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; a larger value
// is far more likely to be garbage than a real header.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

// Largest element count we accept: keeps every byte count below 2^62.
constexpr uint64_t kMaxElements = uint64_t{1} << 58;

std::string Dump(const Json& j) {
  // The replace handler cannot throw on invalid UTF-8 (the parser already
  // rejects it, but error paths must never throw).
  std::string s = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// A non-negative JSON integer, or an error naming `what`.
absl::StatusOr<uint64_t> NonNegativeInt(const Json& j, const std::string& what) {
  if (!j.is_number_unsigned()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be a non-negative integer, found ", Dump(j)));
  }
  return j.get<uint64_t>();
}

}  // namespace

size_t DtypeSize(const std::string& dtype) {
  static const std::unordered_map<std::string, size_t>* const sizes =
      new std::unordered_map<std::string, size_t>{
          {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
          {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
          {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},
      };
  auto it = sizes->find(dtype);
  return it == sizes->end() ? 0 : it->second;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

const TensorInfo* File::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<File> File::Open(const std::string& path) {
  VC_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  return Parse(std::move(mapped));
}

absl::StatusOr<File> File::Parse(MappedFile mapped) {
  const std::string path = mapped.path();
  const size_t file_size = mapped.size();
  auto corrupt = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": corrupt safetensors file: ", what));
  };
  if (file_size < 8) {
    return corrupt(
        absl::StrCat("truncated: ", file_size, " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, mapped.data(), 8);
  if (header_len > file_size - 8) {
    return corrupt(absl::StrCat("header length ", header_len, " exceeds the ", file_size - 8,
                                " bytes that follow it (truncated, or not a safetensors file)"));
  }
  if (header_len > kMaxHeaderBytes) {
    return corrupt(absl::StrCat("header length ", header_len, " is above the 100 MB limit"));
  }
  const char* header = reinterpret_cast<const char*>(mapped.data() + 8);
  Json root;
  try {
    root = Json::parse(header, header + header_len);
  } catch (const Json::exception& e) {
    // The exception text carries the byte position, which is worth keeping.
    return corrupt(absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return corrupt(absl::StrCat("header is not a JSON object: ", Dump(root)));

  const uint8_t* data = mapped.data() + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;
  File f;
  f.tensors_.reserve(root.size());
  for (auto item = root.begin(); item != root.end(); ++item) {
    const std::string& name = item.key();
    const Json& entry = item.value();
    if (name == "__metadata__") {
      // The reference implementation reads it as a map of strings to strings
      // and refuses anything else.
      if (!entry.is_object()) return corrupt(absl::StrCat("__metadata__ is not an object: ", Dump(entry)));
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return corrupt(absl::StrCat("__metadata__ entry '", m.key(),
                                      "' is not a string: ", Dump(m.value())));
        }
        f.metadata_.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return corrupt(absl::StrCat("tensor '", name, "': ", what));
    };
    if (!entry.is_object()) return bad(absl::StrCat("entry is not an object: ", Dump(entry)));
    auto dtype_it = entry.find("dtype");
    auto shape_it = entry.find("shape");
    auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) return bad("missing string 'dtype'");
    if (shape_it == entry.end() || !shape_it->is_array()) return bad("missing array 'shape'");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
      return bad("missing 'data_offsets' [begin, end]");
    }
    TensorInfo t;
    t.name = name;
    t.dtype = dtype_it->get<std::string>();
    t.element_size = DtypeSize(t.dtype);
    if (t.element_size == 0) return bad(absl::StrCat("unknown dtype '", t.dtype, "'"));
    uint64_t count = 1;
    for (const Json& dim : *shape_it) {
      auto d = NonNegativeInt(dim, "shape entry");
      if (!d.ok()) return bad(std::string(d.status().message()));
      if (*d > kMaxElements || (*d != 0 && count > kMaxElements / *d)) {
        return bad(absl::StrCat("shape ", Dump(*shape_it), " has too many elements"));
      }
      count *= *d;
      t.shape.push_back(static_cast<int64_t>(*d));
    }
    t.num_elements = static_cast<int64_t>(count);
    auto begin = NonNegativeInt((*offsets_it)[0], "data_offsets begin");
    if (!begin.ok()) return bad(std::string(begin.status().message()));
    auto end = NonNegativeInt((*offsets_it)[1], "data_offsets end");
    if (!end.ok()) return bad(std::string(end.status().message()));
    t.begin = *begin;
    t.end = *end;
    if (t.end < t.begin) {
      return bad(absl::StrCat("data_offsets [", t.begin, ", ", t.end, "] end before they begin"));
    }
    const uint64_t want = count * t.element_size;
    if (t.end - t.begin != want) {
      return bad(absl::StrCat("data_offsets [", t.begin, ", ", t.end, "] span ", t.end - t.begin,
                              " bytes but shape ", ShapeString(t.shape), " of ", t.dtype, " needs ",
                              want));
    }
    if (t.end > data_size) {
      return bad(absl::StrCat("truncated file: data [", t.begin, ", ", t.end,
                              ") runs past the end of the ", data_size, "-byte data section"));
    }
    t.data = data + t.begin;
    f.tensors_.push_back(std::move(t));
  }

  // The byte ranges must tile the data section exactly; an overlap or a hole
  // means the header and the data disagree about where tensors live.
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : f.tensors_) {
    if (t.begin < expect) {
      return corrupt(absl::StrCat("tensors '", prev->name, "' [", prev->begin, ", ", prev->end,
                                  ") and '", t.name, "' [", t.begin, ", ", t.end,
                                  ") overlap in the data section"));
    }
    if (t.begin > expect) {
      return corrupt(absl::StrCat("hole in the data section: bytes [", expect, ", ", t.begin,
                                  ") before tensor '", t.name, "' belong to no tensor"));
    }
    expect = t.end;
    prev = &t;
  }
  if (expect != data_size) {
    return corrupt(absl::StrCat(data_size - expect, " trailing bytes after the last tensor (the ",
                                "header describes ", expect, " of ", data_size, " data bytes)"));
  }
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_.emplace(f.tensors_[i].name, i);
  f.file_ = std::move(mapped);
  return f;
}

}  // namespace vc::safetensors
