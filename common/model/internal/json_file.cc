#include "common/model/internal/json_file.h"

#include "absl/strings/str_cat.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"

namespace vc::model_internal {

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, size_t max_bytes) {
  VC_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  if (file.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", file.size(), " bytes, above the ", max_bytes, "-byte limit"));
  }
  const char* text = reinterpret_cast<const char*>(file.data());
  try {
    return nlohmann::json::parse(text, text + file.size());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return absl::StrCat(dir, "/", name);
}

std::string DumpShort(const nlohmann::json& j) {
  // The replace handler cannot throw on invalid UTF-8.
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

}  // namespace vc::model_internal
