// vc_tokenizer_bench: load time and single-thread encode/decode throughput of
// every shared tokenizer on a generated English-like corpus (seeded: common
// words, capitals, punctuation, numbers, paragraphs). Prints MB/s of input
// text per core; the target for byte-level BPE (GPT-2) is >= 10 MB/s.
//
// Times are the thread's CPU time (clock_gettime(CLOCK_THREAD_CPUTIME_ID)), so
// a busy machine does not understate a core's speed; wall-clock figures are
// printed beside them.
//
//   vc_tokenizer_bench [--mb N] [--quick] [--only NAME] [--json]
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/tokenizer/text_tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string EnglishLikeCorpus(size_t bytes, uint32_t seed) {
  static const char* kWords[] = {
      "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "with",
      "as", "I", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "hot", "word",
      "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your",
      "how", "said", "an", "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many",
      "then", "them", "write", "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him",
      "two", "has", "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most",
      "people", "my", "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been",
      "now", "find", "little", "girl", "named", "Lily", "garden", "happy", "together", "suddenly", "because",
      "don't", "it's", "I'm", "they're", "we've", "government", "information", "development", "understanding",
      "international", "particularly", "responsibility", "characteristics", "approximately"};
  constexpr size_t kN = sizeof(kWords) / sizeof(kWords[0]);
  std::mt19937 rng(seed);
  std::string out;
  out.reserve(bytes + 64);
  bool sentence_start = true;
  while (out.size() < bytes) {
    int r = static_cast<int>(rng() % 1000);
    std::string w = kWords[rng() % kN];
    if (r < 15) w = std::to_string(rng() % 100000);
    if (sentence_start && !w.empty() && w[0] >= 'a' && w[0] <= 'z') w[0] = static_cast<char>(w[0] - 32);
    out += w;
    sentence_start = false;
    r = static_cast<int>(rng() % 1000);
    if (r < 60) {
      out += ". ";
      sentence_start = true;
    } else if (r < 110) {
      out += ", ";
    } else if (r < 115) {
      out += "? ";
      sentence_start = true;
    } else if (r < 120) {
      out += ".\n\n";
      sentence_start = true;
    } else {
      out += ' ';
    }
  }
  return out;
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::string ModelsDir() {
  const char* d = std::getenv("VC_MODELS_DIR");
  return d != nullptr && *d != '\0' ? d : VC_DEFAULT_MODELS_DIR;
}

}  // namespace

int main(int argc, char** argv) {
  double mb = 4.0;
  bool json = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      mb = 0.25;
    } else if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--mb") == 0 && i + 1 < argc) {
      mb = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: vc_tokenizer_bench [--mb N] [--quick] [--only NAME] [--json]\n");
      return 2;
    }
  }
  if (mb <= 0) {
    std::fprintf(stderr, "vc_tokenizer_bench: --mb must be positive\n");
    return 2;
  }
  std::vector<std::pair<std::string, std::string>> tokenizers;
  fs::path root = ModelsDir();
  tokenizers.emplace_back("tinystories656K", (root / "tinystories656K" / "tokenizer.json").string());
  for (const char* name : {"gpt2", "dolma2", "minimind", "llama2", "phi3", "nmt-unigram"}) {
    tokenizers.emplace_back(name, (root.parent_path() / "tokenizers" / name / "tokenizer.json").string());
  }
  // One paragraph per call, as a server encodes prompts: many short texts.
  const std::string corpus = EnglishLikeCorpus(static_cast<size_t>(mb * 1e6), 12345);
  std::vector<std::string> docs;
  for (size_t pos = 0; pos < corpus.size();) {
    size_t end = corpus.find("\n\n", pos);
    end = end == std::string::npos ? corpus.size() : end + 2;
    docs.push_back(corpus.substr(pos, end - pos));
    pos = end;
  }
  nlohmann::json results = nlohmann::json::array();
  if (!json) {
    std::printf("corpus: %.2f MB English-like text in %zu paragraphs, one thread\n", corpus.size() / 1e6,
                docs.size());
    std::printf("%-16s %9s %12s %12s %12s %12s\n", "tokenizer", "load ms", "encode MB/s", "(wall)",
                "tokens/byte", "decode MB/s");
  }
  int failures = 0;
  for (const auto& [name, path] : tokenizers) {
    if (!only.empty() && name != only) continue;
    if (!fs::exists(path)) {
      std::fprintf(stderr, "vc_tokenizer_bench: %s not found, skipped\n", path.c_str());
      continue;
    }
    auto t0 = Clock::now();
    auto tok = vc::LoadTextTokenizer(path);
    double load_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!tok.ok()) {
      std::fprintf(stderr, "vc_tokenizer_bench: %s: %s\n", name.c_str(), tok.status().ToString().c_str());
      ++failures;
      continue;
    }
    std::vector<std::vector<int32_t>> encoded(docs.size());
    size_t tokens = 0;
    t0 = Clock::now();
    double c0 = ThreadCpuSeconds();
    for (size_t i = 0; i < docs.size(); ++i) {
      auto ids = (*tok)->Encode(docs[i], false);
      if (!ids.ok()) {
        std::fprintf(stderr, "vc_tokenizer_bench: %s: %s\n", name.c_str(), ids.status().ToString().c_str());
        return 1;
      }
      tokens += ids->size();
      encoded[i] = std::move(ids).value();
    }
    double enc_cpu = ThreadCpuSeconds() - c0;
    double enc_wall = std::chrono::duration<double>(Clock::now() - t0).count();
    size_t decoded_bytes = 0;
    c0 = ThreadCpuSeconds();
    for (const auto& ids : encoded) {
      auto text = (*tok)->Decode(ids, false);
      if (!text.ok()) return 1;
      decoded_bytes += text->size();
    }
    double dec_cpu = ThreadCpuSeconds() - c0;
    double enc_mbs = corpus.size() / 1e6 / enc_cpu, dec_mbs = decoded_bytes / 1e6 / dec_cpu;
    double enc_wall_mbs = corpus.size() / 1e6 / enc_wall;
    double tpb = static_cast<double>(tokens) / corpus.size();
    results.push_back({{"tokenizer", name}, {"load_ms", load_ms}, {"encode_mb_per_s", enc_mbs}, {"encode_mb_per_s_wall", enc_wall_mbs},
                       {"tokens_per_byte", tpb}, {"decode_mb_per_s", dec_mbs}});
    if (!json) {
      std::printf("%-16s %9.0f %12.1f %12.1f %12.3f %12.1f\n", name.c_str(), load_ms, enc_mbs, enc_wall_mbs, tpb,
                  dec_mbs);
    }
  }
  if (json) std::printf("%s\n", nlohmann::json{{"corpus_bytes", corpus.size()}, {"results", results}}.dump(2).c_str());
  return failures == 0 ? 0 : 1;
}
