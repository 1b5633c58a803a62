// Private to common/model: reads a checkpoint's small JSON files
// (config.json, generation_config.json, the shard index) with errors that
// name the file, never an exception.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace vc::model_internal {

// NotFound when `path` is missing; InvalidArgument when it is larger than
// `max_bytes` (a metadata file that large is not one) or not valid JSON.
[[nodiscard]] absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path,
                                                          size_t max_bytes = size_t{64} << 20);

// "<dir>/<name>", with or without a trailing slash on `dir`.
std::string JoinPath(const std::string& dir, const std::string& name);

// A JSON value for an error message, cut to 80 characters.
std::string DumpShort(const nlohmann::json& j);

}  // namespace vc::model_internal
