#include "common/tokenizer/internal/hf_tokenizer.h"

#include <algorithm>
#include <bitset>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/internal/components.h"
#include "common/tokenizer/internal/unicode.h"

namespace vc::tokenizer_internal {
namespace {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// Leftmost-longest matching of a set of strings (the added tokens), over
// bytes. A small trie: added-token sets are tens of entries.
class TokenMatcher {
 public:
  void Add(const std::string& key, int token_index) {
    if (key.empty()) return;
    int node = 0;
    for (unsigned char b : key) {
      auto it = nodes_[node].next.find(b);
      if (it == nodes_[node].next.end()) {
        nodes_.push_back({});
        int child = static_cast<int>(nodes_.size()) - 1;
        nodes_[node].next[b] = child;
        node = child;
      } else {
        node = it->second;
      }
    }
    nodes_[node].token = token_index;
    first_bytes_.set(static_cast<unsigned char>(key[0]));
  }
  bool empty() const { return nodes_.size() == 1; }

  // The longest key starting at `pos`: (token index, length), or (-1, 0).
  std::pair<int, size_t> LongestAt(std::string_view s, size_t pos) const {
    if (!first_bytes_.test(static_cast<unsigned char>(s[pos]))) return {-1, 0};
    int node = 0;
    std::pair<int, size_t> best{-1, 0};
    for (size_t k = pos; k < s.size(); ++k) {
      auto it = nodes_[node].next.find(static_cast<unsigned char>(s[k]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      if (nodes_[node].token >= 0) best = {nodes_[node].token, k + 1 - pos};
    }
    return best;
  }

 private:
  struct Node {
    absl::flat_hash_map<unsigned char, int> next;
    int token = -1;
  };
  std::vector<Node> nodes_{Node{}};
  std::bitset<256> first_bytes_;
};

struct Section {
  std::string text;
  int32_t token_id = -1;  // >= 0: an added token
  bool at_origin = false;
};

bool EndsWithWordChar(std::string_view s) {
  if (s.empty()) return false;
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t p = start;
  char32_t cp = NextCodePoint(s, &p);
  return cp == '_' || IsAlphanumeric(cp);
}

bool StartsWithWordChar(std::string_view s) {
  if (s.empty()) return false;
  size_t p = 0;
  char32_t cp = NextCodePoint(s, &p);
  return cp == '_' || IsAlphanumeric(cp);
}

class HfTokenizer : public TextTokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const override;
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    auto it = added_by_content_.find(std::string(token));
    if (it != added_by_content_.end()) return added_[it->second].id;
    return model_->TokenToId(token);
  }
  bool IsSpecial(int32_t id) const override {
    auto it = added_by_id_.find(id);
    return it != added_by_id_.end() && added_[it->second].special;
  }
  const TokenizerConfig& config() const override { return config_; }

  absl::Status Init(const Json& j, const std::string& name);
  absl::StatusOr<std::string> NormalizeOnly(std::string text) const {
    if (normalizer_) VC_RETURN_IF_ERROR(normalizer_->Normalize(&text));
    return text;
  }

  TokenizerConfig config_;

 private:
  // Splits `text` at the matches of `matcher`, honouring each token's
  // single_word / lstrip / rstrip, appending to `out`.
  void SplitAdded(const TokenMatcher& matcher, const std::string& text, bool at_origin,
                  std::vector<Section>* out) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  absl::flat_hash_map<std::string, size_t> added_by_content_;
  absl::flat_hash_map<int32_t, size_t> added_by_id_;
  TokenMatcher raw_matcher_;
  TokenMatcher normalized_matcher_;
  int vocab_size_ = 0;
};

absl::Status HfTokenizer::Init(const Json& j, const std::string& name) {
  if (!j.is_object()) return absl::InvalidArgumentError(name + ": not a JSON object");
  auto component = [&](const char* key) -> const Json* {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return nullptr;
    return &*it;
  };
  auto wrap = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(name, ": ", s.message()));
  };
  if (const Json* n = component("normalizer")) {
    auto r = MakeNormalizer(*n);
    if (!r.ok()) return wrap(r.status());
    normalizer_ = std::move(r).value();
  }
  if (const Json* p = component("pre_tokenizer")) {
    auto r = MakePreTokenizer(*p);
    if (!r.ok()) return wrap(r.status());
    pre_tokenizer_ = std::move(r).value();
  }
  const Json* m = component("model");
  if (m == nullptr) return absl::InvalidArgumentError(name + ": no \"model\"");
  {
    auto r = MakeModel(*m);
    if (!r.ok()) return wrap(r.status());
    model_ = std::move(r).value();
  }
  if (const Json* p = component("post_processor")) {
    auto r = MakePostProcessor(*p);
    if (!r.ok()) return wrap(r.status());
    post_processor_ = std::move(r).value();
  }
  if (const Json* d = component("decoder")) {
    auto r = MakeDecoder(*d);
    if (!r.ok()) return wrap(r.status());
    decoder_ = std::move(r).value();
  }
  if (const Json* t = component("truncation")) {
    (void)t;  // truncation and padding shape batches; a single encode ignores them
  }
  vocab_size_ = model_->size();
  if (const Json* added = component("added_tokens")) {
    if (!added->is_array()) return absl::InvalidArgumentError(name + ": \"added_tokens\" must be a list");
    for (const auto& a : *added) {
      std::string where = name + ": added token";
      AddedToken t;
      auto content = GetString(a, "content", where);
      if (!content.ok()) return content.status();
      t.content = *content;
      if (!a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
          a["id"].get<int64_t>() > (1 << 30)) {
        return absl::InvalidArgumentError(absl::StrCat(where, " '", t.content, "': bad \"id\""));
      }
      t.id = a["id"].get<int32_t>();
      VC_ASSIGN_OR_RETURN(t.special, GetBoolOr(a, "special", false, where));
      VC_ASSIGN_OR_RETURN(t.lstrip, GetBoolOr(a, "lstrip", false, where));
      VC_ASSIGN_OR_RETURN(t.rstrip, GetBoolOr(a, "rstrip", false, where));
      VC_ASSIGN_OR_RETURN(t.single_word, GetBoolOr(a, "single_word", false, where));
      VC_ASSIGN_OR_RETURN(t.normalized, GetBoolOr(a, "normalized", !t.special, where));
      if (t.content.empty()) continue;
      vocab_size_ = std::max(vocab_size_, t.id + 1);
      size_t index = added_.size();
      added_by_content_[t.content] = index;
      added_by_id_[t.id] = index;
      added_.push_back(std::move(t));
    }
  }
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& t = added_[i];
    if (t.normalized && normalizer_) {
      std::string norm = t.content;
      VC_RETURN_IF_ERROR(normalizer_->Normalize(&norm));
      normalized_matcher_.Add(norm, static_cast<int>(i));
    } else if (t.normalized) {
      normalized_matcher_.Add(t.content, static_cast<int>(i));
    } else {
      raw_matcher_.Add(t.content, static_cast<int>(i));
    }
  }
  return absl::OkStatus();
}

void HfTokenizer::SplitAdded(const TokenMatcher& matcher, const std::string& text, bool at_origin,
                             std::vector<Section>* out) const {
  if (matcher.empty()) {
    out->push_back({text, -1, at_origin});
    return;
  }
  size_t start_offset = 0;  // end of the previous split
  size_t pos = 0;
  while (pos < text.size()) {
    auto [index, len] = matcher.LongestAt(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = added_[index];
    size_t start = pos, stop = pos + len;
    pos = stop;  // matching goes on after the match, whatever is kept
    if (t.single_word) {
      bool start_ok = start == 0 || !EndsWithWordChar(std::string_view(text).substr(0, start));
      bool stop_ok = stop == text.size() || !StartsWithWordChar(std::string_view(text).substr(stop));
      if (!start_ok || !stop_ok) continue;
    }
    if (t.lstrip) {
      std::string_view left = TrimWhiteSpace(std::string_view(text).substr(0, start), false, true);
      start = std::max(left.size(), start_offset);
    }
    if (t.rstrip) {
      std::string_view right = std::string_view(text).substr(stop);
      stop += right.size() - TrimWhiteSpace(right, true, false).size();
    }
    if (start_offset < start) {
      out->push_back({text.substr(start_offset, start - start_offset), -1, at_origin && start_offset == 0});
    }
    out->push_back({std::string(), t.id, false});
    start_offset = stop;
  }
  if (start_offset < text.size()) {
    out->push_back({text.substr(start_offset), -1, at_origin && start_offset == 0});
  }
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  if (size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("text is not valid UTF-8 (byte ", bad, ")"));
  }
  std::vector<int32_t> ids;
  std::vector<Section> raw;
  SplitAdded(raw_matcher_, std::string(text), true, &raw);
  std::vector<Section> sections;
  for (auto& s : raw) {
    if (s.token_id >= 0) {
      sections.push_back(std::move(s));
      continue;
    }
    if (normalizer_) VC_RETURN_IF_ERROR(normalizer_->Normalize(&s.text));
    if (s.text.empty()) continue;
    SplitAdded(normalized_matcher_, s.text, s.at_origin, &sections);
  }
  std::vector<PreToken> pieces;
  for (auto& s : sections) {
    if (s.token_id >= 0) {
      ids.push_back(s.token_id);
      continue;
    }
    if (s.text.empty()) continue;
    pieces.clear();
    pieces.push_back({std::move(s.text), s.at_origin});
    if (pre_tokenizer_) VC_RETURN_IF_ERROR(pre_tokenizer_->PreTokenize(&pieces));
    for (const auto& p : pieces) VC_RETURN_IF_ERROR(model_->Tokenize(p.text, &ids));
  }
  if (post_processor_) VC_RETURN_IF_ERROR(post_processor_->Process(&ids, add_special_tokens));
  return ids;
}

absl::StatusOr<std::string> HfTokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto it = added_by_id_.find(id);
    if (it != added_by_id_.end()) {
      const AddedToken& t = added_[it->second];
      if (skip_special_tokens && t.special) continue;
      tokens.push_back(t.content);
      continue;
    }
    const std::string* s = model_->IdToToken(id);
    if (s == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside the vocabulary (size ",
                                                     vocab_size_, ")"));
    }
    tokens.push_back(*s);
  }
  std::string text;
  if (decoder_) {
    VC_RETURN_IF_ERROR(decoder_->DecodeChain(&tokens));
    for (const auto& t : tokens) text += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text += ' ';
      text += tokens[i];
    }
  }
  if (config_.clean_up_tokenization_spaces) text = CleanUpTokenizationSpaces(std::move(text));
  return text;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadHfTokenizerFromString(const std::string& json_text,
                                                                          const std::string& name,
                                                                          TokenizerConfig config) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(name + ": not valid JSON");
  auto tok = std::make_unique<HfTokenizer>();
  tok->config_ = std::move(config);
  VC_RETURN_IF_ERROR(tok->Init(j, name));
  return std::unique_ptr<TextTokenizer>(std::move(tok));
}

absl::StatusOr<std::string> NormalizeForTest(const TextTokenizer& tokenizer, const std::string& text) {
  const auto* hf = dynamic_cast<const HfTokenizer*>(&tokenizer);
  if (hf == nullptr) return absl::InvalidArgumentError("not a tokenizer.json tokenizer");
  return hf->NormalizeOnly(text);
}

}  // namespace vc::tokenizer_internal
