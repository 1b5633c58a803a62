#include "tests/common/tokenizer/hf_reference.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tokenizer/internal/hf_tokenizer.h"
#include "nlohmann/json.hpp"

namespace vc::testing {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string ToolsDir() {
  const char* env = std::getenv("VC_TOOLS_DIR");
  return env != nullptr && *env != '\0' ? env : VC_TOOLS_DIR_DEFAULT;
}

std::string ModuleFile() {
  return ToolsDir() + "/node_modules/@huggingface/tokenizers/dist/tokenizers.mjs";
}

std::string ModelsDir() {
  const char* env = std::getenv("VC_MODELS_DIR");
  return env != nullptr && *env != '\0' ? env : VC_MODELS_DIR_DEFAULT;
}

std::string Ids(const std::vector<int32_t>& v) { return absl::StrJoin(v, " "); }

}  // namespace

std::string Quote(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string ReferenceUnavailableReason() {
  if (std::system("node --version >/dev/null 2>&1") != 0) return "node is not installed";
  if (!fs::exists(ModuleFile())) {
    return "@huggingface/tokenizers is not installed at " + ModuleFile() +
           " (deploy/scripts/install_tools.sh installs it)";
  }
  return "";
}

std::vector<std::pair<std::string, std::string>> SharedTokenizers() {
  std::vector<std::pair<std::string, std::string>> out;
  fs::path tokenizers = fs::path(ModelsDir()).parent_path() / "tokenizers";
  std::error_code ec;
  if (fs::is_directory(tokenizers, ec)) {
    for (const auto& entry : fs::directory_iterator(tokenizers, ec)) {
      fs::path json = entry.path() / "tokenizer.json";
      if (fs::exists(json, ec)) out.emplace_back(entry.path().filename().string(), json.string());
    }
  }
  fs::path stories = fs::path(ModelsDir()) / "tinystories656K" / "tokenizer.json";
  if (fs::exists(stories, ec)) out.emplace_back("tinystories656K", stories.string());
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

absl::StatusOr<std::vector<ReferenceResult>> RunOnce(const std::string& tokenizer_json,
                                                     const std::vector<std::string>& texts, const Json* normalized,
                                                     std::vector<std::string>* missing) {
  fs::path dir = fs::temp_directory_path() / absl::StrCat("vc_tok_ref_", ::getpid(), "_", std::rand());
  fs::create_directories(dir);
  Json req;
  req["module"] = ModuleFile();
  req["tokenizer"] = tokenizer_json;
  fs::path config = fs::path(tokenizer_json).parent_path() / "tokenizer_config.json";
  req["config"] = fs::exists(config) ? Json(config.string()) : Json(nullptr);
  req["texts"] = texts;
  if (normalized != nullptr) req["normalized"] = *normalized;
  fs::path req_file = dir / "request.json", resp_file = dir / "response.json", err_file = dir / "stderr.txt";
  {
    std::ofstream out(req_file);
    out << req.dump();
  }
  std::string cmd = absl::StrCat("node '", VC_TOKENIZER_TEST_DIR, "/hf_reference.mjs' '", req_file.string(), "' > '",
                                 resp_file.string(), "' 2> '", err_file.string(), "'");
  int rc = std::system(cmd.c_str());
  std::stringstream resp, err;
  resp << std::ifstream(resp_file).rdbuf();
  err << std::ifstream(err_file).rdbuf();
  fs::remove_all(dir);
  if (rc != 0) return absl::InternalError(absl::StrCat("reference failed (", rc, "): ", err.str()));
  Json j = Json::parse(resp.str(), nullptr, false);
  if (j.is_discarded() || !j.contains("results")) return absl::InternalError("reference printed no results");
  std::vector<ReferenceResult> out;
  for (const auto& r : j["results"]) {
    ReferenceResult x;
    x.ids = r["ids"].get<std::vector<int32_t>>();
    x.ids_special = r["ids_special"].get<std::vector<int32_t>>();
    if (!r["normalized"].is_null()) x.normalized = r["normalized"].get<std::string>();
    x.decoded = r["decoded"].get<std::string>();
    x.decoded_skip = r["decoded_skip"].get<std::string>();
    out.push_back(std::move(x));
  }
  if (out.size() != texts.size()) return absl::InternalError("reference answered a different number of texts");
  if (missing != nullptr && j.contains("missing")) *missing = j["missing"].get<std::vector<std::string>>();
  return out;
}

}  // namespace

absl::StatusOr<std::vector<ReferenceResult>> RunReference(const std::string& tokenizer_json,
                                                          const std::vector<std::string>& texts,
                                                          const TextTokenizer* our_normalizer) {
  if (our_normalizer == nullptr) return RunOnce(tokenizer_json, texts, nullptr, nullptr);
  Json table = Json::object();
  auto add = [&](const std::vector<std::string>& sections) -> absl::Status {
    for (const auto& s : sections) {
      auto n = tokenizer_internal::NormalizeForTest(*our_normalizer, s);
      if (!n.ok()) return n.status();
      table[s] = *n;
    }
    return absl::OkStatus();
  };
  if (auto s = add(texts); !s.ok()) return s;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::string> missing;
    auto r = RunOnce(tokenizer_json, texts, &table, &missing);
    if (!r.ok() || missing.empty()) return r;
    if (auto s = add(missing); !s.ok()) return s;
  }
  return absl::InternalError("reference kept asking for normalisations");
}

std::vector<std::string> Compare(const TextTokenizer& ours, const std::vector<std::string>& texts,
                                 const std::vector<ReferenceResult>& reference, bool precompiled_exception,
                                 std::vector<std::string>* precompiled_differences) {
  std::vector<std::string> errors;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string& text = texts[i];
    const ReferenceResult& ref = reference[i];
    if (precompiled_exception && ref.normalized) {
      auto norm = tokenizer_internal::NormalizeForTest(ours, text);
      if (!norm.ok()) {
        errors.push_back(absl::StrCat(Quote(text), ": normalize failed: ", norm.status().ToString()));
        continue;
      }
      if (*norm != *ref.normalized) {
        precompiled_differences->push_back(
            absl::StrCat(Quote(text), ": ours ", Quote(*norm), " reference ", Quote(*ref.normalized)));
        continue;
      }
    }
    auto ids = ours.Encode(text, false);
    auto ids_special = ours.Encode(text, true);
    if (!ids.ok() || !ids_special.ok()) {
      errors.push_back(absl::StrCat(Quote(text), ": encode failed: ",
                                    (ids.ok() ? ids_special.status() : ids.status()).ToString()));
      continue;
    }
    if (*ids != ref.ids) {
      errors.push_back(absl::StrCat(Quote(text), ": ids [", Ids(*ids), "] reference [", Ids(ref.ids), "]"));
    }
    if (*ids_special != ref.ids_special) {
      errors.push_back(absl::StrCat(Quote(text), ": ids with special tokens [", Ids(*ids_special), "] reference [",
                                    Ids(ref.ids_special), "]"));
    }
    // Decode the reference's ids, so a decode check does not hang on an encode bug.
    for (bool skip : {false, true}) {
      auto decoded = ours.Decode(ref.ids_special, skip);
      const std::string& want = skip ? ref.decoded_skip : ref.decoded;
      if (!decoded.ok()) {
        errors.push_back(absl::StrCat(Quote(text), ": decode failed: ", decoded.status().ToString()));
      } else if (*decoded != want) {
        errors.push_back(absl::StrCat(Quote(text), ": decode(skip_special_tokens=", skip, ") ", Quote(*decoded),
                                      " reference ", Quote(want)));
      }
    }
  }
  return errors;
}

}  // namespace vc::testing
