// `vericache tokenize` and `vericache detokenize`: text <-> ids with a
// Hugging Face tokenizer.json or a llama2.c tokenizer.bin, as Hugging Face's
// encode(text, add_special_tokens) and decode(ids, skip_special_tokens).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/flags.h"
#include "common/tokenizer/text_tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/vericache/commands.h"

namespace vc::cli {
namespace {

constexpr char kTokenizerHelp[] =
    "tokenizer.json (a tokenizer_config.json beside it is read), a checkpoint directory holding one, "
    "or a llama2.c tokenizer.bin (required)";

absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadFromFlags(const std::string& path, int vocab_size) {
  TextTokenizerOptions options;
  options.llama2c_vocab_size = vocab_size;
  return LoadTextTokenizer(path, options);
}

}  // namespace

int RunTokenize(int argc, char** argv) {
  std::string tokenizer, text, file;
  bool add_special = false, json = false;
  int vocab_size = 0;
  FlagSet flags("vericache tokenize",
                "Print the token ids of a text, as encode(text, add_special_tokens). By default no\n"
                "special tokens are added; added-token strings inside the text are always matched.");
  flags.Add("--tokenizer", &tokenizer, "PATH", kTokenizerHelp);
  flags.Add("--text", &text, "TEXT", "the text to encode");
  flags.Add("--file", &file, "PATH", "encode this file's bytes exactly (nothing stripped)");
  flags.AddBool("--add-special-tokens", &add_special, "add the post-processor's special tokens (e.g. BOS)");
  flags.Add("--vocab-size", &vocab_size, "N",
            "pieces to read from a llama2.c tokenizer.bin (default: all pieces in the file)");
  flags.AddBool("--json", &json, "print {\"ids\": [...]} instead of space-separated ids");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Fail("tokenize", s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (tokenizer.empty()) return BadInput("tokenize", "--tokenizer is required");
  if (flags.was_set("--text") == flags.was_set("--file")) {
    return BadInput("tokenize", "give exactly one of --text or --file");
  }
  if (vocab_size < 0) return BadInput("tokenize", "--vocab-size must be positive");
  if (flags.was_set("--file")) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return BadInput("tokenize", "--file: cannot open '" + file + "'");
    std::stringstream buf;
    buf << in.rdbuf();
    text = buf.str();
  }
  auto tok = LoadFromFlags(tokenizer, vocab_size);
  if (!tok.ok()) return Fail("tokenize", tok.status());
  auto ids = (*tok)->Encode(text, add_special);
  if (!ids.ok()) return Fail("tokenize", ids.status());
  if (json) {
    nlohmann::json j;
    j["ids"] = *ids;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string line;
    for (size_t i = 0; i < ids->size(); ++i) {
      if (i > 0) line += ' ';
      line += std::to_string((*ids)[i]);
    }
    std::printf("%s\n", line.c_str());
  }
  return kExitOk;
}

int RunDetokenize(int argc, char** argv) {
  std::string tokenizer, ids_text;
  bool skip_special = false, json = false;
  int vocab_size = 0;
  FlagSet flags("vericache detokenize",
                "Print the text of token ids, as decode(ids, skip_special_tokens), with the clean-up\n"
                "of tokenization spaces that tokenizer_config.json asks for (on when it is absent).");
  flags.Add("--tokenizer", &tokenizer, "PATH", kTokenizerHelp);
  flags.Add("--ids", &ids_text, "\"ID ID ...\"", "token ids, separated by spaces or commas (required)");
  flags.AddBool("--skip-special-tokens", &skip_special, "leave special tokens (BOS, EOS, ...) out");
  flags.Add("--vocab-size", &vocab_size, "N",
            "pieces to read from a llama2.c tokenizer.bin (default: all pieces in the file)");
  flags.AddBool("--json", &json, "print {\"text\": \"...\"} instead of the bare text");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Fail("detokenize", s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (tokenizer.empty()) return BadInput("detokenize", "--tokenizer is required");
  if (!flags.was_set("--ids")) return BadInput("detokenize", "--ids is required (\"\" for none)");
  if (vocab_size < 0) return BadInput("detokenize", "--vocab-size must be positive");
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(ids_text, absl::ByAnyChar(" ,\t\n"), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return BadInput("detokenize", "--ids: '" + std::string(piece) + "' is not an integer token id");
    }
    ids.push_back(id);
  }
  auto tok = LoadFromFlags(tokenizer, vocab_size);
  if (!tok.ok()) return Fail("detokenize", tok.status());
  auto text = (*tok)->Decode(ids, skip_special);
  if (!text.ok()) return Fail("detokenize", text.status());
  if (json) {
    nlohmann::json j;
    j["text"] = *text;
    // Invalid UTF-8 cannot come out of Decode (it repairs bytes), so dump is safe.
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::fwrite(text->data(), 1, text->size(), stdout);
    std::fputc('\n', stdout);
  }
  return kExitOk;
}

}  // namespace vc::cli
