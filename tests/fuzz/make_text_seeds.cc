// Writes the seed corpora of the text-side fuzz targets into
// REPO/tests/fuzz/corpus/<target>/ (vc_fuzz_seeds writes the binary ones;
// this one needs no project library, so it builds in seconds):
//   fuzz_tokenizer_json: the shared real tokenizer.json files
//     (REPO/../shared/tokenizers/*, the tinystories656K model's) with every
//     component kept but the vocabulary cut to its first 400 ids and the
//     merges to those among them, so a seed is a few KB (the Unigram one
//     keeps its Precompiled charsmap, ~36 KB). Input: u8 text length, the
//     text, the JSON. Left as they are when ../shared is missing. Their
//     sources and licences (Apache-2.0, MIT): ../shared/tokenizers/README.md.
//   fuzz_chat_template: the repo's chat templates (tests/data/chat_templates,
//     the OpenAI test's), as they are.
// Deterministic: rerunning it rewrites the same files.
//   usage: vc_fuzz_text_seeds REPO_ROOT
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string g_root;

[[noreturn]] void Die(const std::string& what) {
  std::cerr << "vc_fuzz_text_seeds: " << what << "\n";
  std::exit(1);
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

void Seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::path(g_root) / "tests/fuzz/corpus" / target;
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) Die("cannot write " + (dir / name).string());
}

Json TrimTokenizer(Json j, int64_t keep_ids, size_t keep_merges) {
  Json& model = j["model"];
  if (model.value("type", "") == "Unigram" && model["vocab"].is_array()) {
    Json vocab = Json::array();
    for (const Json& e : model["vocab"]) {
      if (static_cast<int64_t>(vocab.size()) >= keep_ids) break;
      vocab.push_back(e);
    }
    model["vocab"] = vocab;
    if (model.contains("unk_id") && model["unk_id"].is_number_integer() &&
        model["unk_id"].get<int64_t>() >= keep_ids) {
      model["unk_id"] = 0;
    }
    return j;
  }
  if (!model["vocab"].is_object()) return j;
  Json vocab = Json::object();
  std::set<std::string> kept;
  for (const auto& [token, id] : model["vocab"].items()) {
    if (id.is_number_integer() && id.get<int64_t>() < keep_ids) {
      vocab[token] = id;
      kept.insert(token);
    }
  }
  model["vocab"] = vocab;
  Json merges = Json::array();
  for (const Json& m : model.value("merges", Json::array())) {
    if (merges.size() >= keep_merges) break;
    std::string a, b;
    if (m.is_string()) {
      const std::string text = m.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos) continue;
      a = text.substr(0, space);
      b = text.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      continue;
    }
    if (kept.count(a) && kept.count(b) && kept.count(a + b)) merges.push_back(m);
  }
  model["merges"] = merges;
  return j;
}

void TokenizerJsonSeeds() {
  const std::string shared = g_root + "/../shared";
  // Whitespace runs, scripts, an emoji with joiners, digits, special-token
  // strings of several families.
  const std::string text =
      "Hello, world! It's 2026:\tna\xc3\xafve caf\xc3\xa9 \xf0\x9f\x98\x80\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7"
      "  x=12345; <s></s><|endoftext|><|im_start|>\n\xe4\xbd\xa0\xe5\xa5\xbd";
  std::vector<std::pair<std::string, std::string>> files = {
      {"tinystories656K", shared + "/models/tinystories656K/tokenizer.json"}};
  for (const char* family : {"gpt2", "dolma2", "llama2", "phi3", "minimind", "nmt-unigram"}) {
    files.emplace_back(family, shared + "/tokenizers/" + family + "/tokenizer.json");
  }
  for (const auto& [name, path] : files) {
    std::string raw;
    if (!ReadFile(path, &raw)) {
      std::cerr << "vc_fuzz_text_seeds: " << path << " not found; fuzz_tokenizer_json seeds left as they are\n";
      return;
    }
    Json j = Json::parse(raw, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) Die(path + ": not JSON");
    const std::string trimmed = TrimTokenizer(std::move(j), 400, 300).dump();
    Seed("fuzz_tokenizer_json", name, std::string(1, static_cast<char>(text.size())) + text + trimmed);
  }
}

void ChatTemplateSeeds() {
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(fs::path(g_root) / "tests/data/chat_templates")) {
    if (e.path().extension() == ".jinja") paths.push_back(e.path());
  }
  paths.push_back(fs::path(g_root) / "tests/data/openai/tinystories_chat.jinja");
  std::sort(paths.begin(), paths.end());
  for (const auto& p : paths) {
    std::string text;
    if (!ReadFile(p.string(), &text)) Die("cannot read " + p.string());
    Seed("fuzz_chat_template", p.stem().string(), text);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: vc_fuzz_text_seeds REPO_ROOT\n";
    return 2;
  }
  g_root = argv[1];
  TokenizerJsonSeeds();
  ChatTemplateSeeds();
  std::cout << "vc_fuzz_text_seeds: corpora written under " << g_root << "/tests/fuzz/corpus\n";
  return 0;
}
