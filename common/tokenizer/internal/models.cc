// The tokenizer.json models: BPE (merge ranks over symbol pairs, byte
// fallback, unknown-token fusing, subword prefix/suffix, ignore_merges) and
// Unigram (Viterbi over the vocabulary's log-probabilities).
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/internal/components.h"
#include "common/tokenizer/internal/unicode.h"

namespace vc::tokenizer_internal {
namespace {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct StringEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};
using VocabMap = absl::flat_hash_map<std::string, int32_t, StringHash, StringEq>;

std::string ByteTokenName(uint8_t b) { return absl::StrFormat("<0x%02X>", b); }

// ---------------------------------------------------------------- BPE

class BpeModel : public Model {
 public:
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const Json& j);

  absl::Status Tokenize(std::string_view word, std::vector<int32_t>* ids) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* IdToToken(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_token_[id]) return nullptr;
    return &id_to_token_[id];
  }
  int32_t size() const override { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* FindMerge(int32_t a, int32_t b) const {
    auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }
  void MergeSymbols(std::vector<int32_t>* syms) const;

  // Words repeat: each thread keeps the ids of the short words it has seen,
  // per model (a serial number, never reused, keys the caches).
  struct WordCache {
    absl::flat_hash_map<std::string, std::vector<int32_t>, StringHash, StringEq> words;
  };
  WordCache& ThreadCache() const;
  static constexpr size_t kCacheMaxWordBytes = 64;
  static constexpr size_t kCacheMaxWords = 1 << 15;
  absl::Status TokenizeUncached(std::string_view word, std::vector<int32_t>* ids) const;

  uint64_t serial_ = NextSerial();
  static uint64_t NextSerial() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1);
  }
  VocabMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string prefix_;  // continuing_subword_prefix
  std::string suffix_;  // end_of_word_suffix
  std::array<int32_t, 256> byte_ids_{};
  // Single-byte characters' ids with neither prefix nor suffix (the fast
  // path for ASCII): -1 when not in the vocabulary.
  std::array<int32_t, 128> ascii_ids_{};
};

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& j) {
  const std::string where = "model BPE";
  auto m = std::make_unique<BpeModel>();
  if (auto it = j.find("dropout"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) {
      return absl::InvalidArgumentError("model BPE: dropout is not supported (it must be null)");
    }
  }
  auto vocab = j.find("vocab");
  if (vocab == j.end() || !vocab->is_object()) return absl::InvalidArgumentError("model BPE: \"vocab\" must be an object");
  int32_t max_id = -1;
  m->vocab_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer()) return absl::InvalidArgumentError("model BPE: vocab ids must be integers");
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > (1 << 30)) return absl::InvalidArgumentError(absl::StrCat("model BPE: vocab id ", id, " out of range"));
    m->vocab_[it.key()] = static_cast<int32_t>(id);
    max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
  }
  m->id_to_token_.resize(max_id + 1);
  m->has_token_.assign(max_id + 1, false);
  for (const auto& [tok, id] : m->vocab_) {
    m->id_to_token_[id] = tok;
    m->has_token_[id] = true;
  }
  VC_ASSIGN_OR_RETURN(std::string unk, GetStringOr(j, "unk_token", "", where));
  if (!unk.empty()) {
    auto it = m->vocab_.find(unk);
    // The reference fails at encode time when it needs an unk that is not in
    // the vocabulary; failing at load is clearer.
    if (it == m->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model BPE: unk_token '", unk, "' is not in the vocabulary"));
    }
    m->unk_id_ = it->second;
  }
  VC_ASSIGN_OR_RETURN(m->fuse_unk_, GetBoolOr(j, "fuse_unk", false, where));
  VC_ASSIGN_OR_RETURN(m->byte_fallback_, GetBoolOr(j, "byte_fallback", false, where));
  VC_ASSIGN_OR_RETURN(m->ignore_merges_, GetBoolOr(j, "ignore_merges", false, where));
  VC_ASSIGN_OR_RETURN(m->prefix_, GetStringOr(j, "continuing_subword_prefix", "", where));
  VC_ASSIGN_OR_RETURN(m->suffix_, GetStringOr(j, "end_of_word_suffix", "", where));
  for (int b = 0; b < 256; ++b) {
    auto it = m->vocab_.find(ByteTokenName(static_cast<uint8_t>(b)));
    m->byte_ids_[b] = it == m->vocab_.end() ? -1 : it->second;
  }
  for (int c = 0; c < 128; ++c) {
    std::string s(1, static_cast<char>(c));
    auto it = m->vocab_.find(s);
    m->ascii_ids_[c] = it == m->vocab_.end() ? -1 : it->second;
  }

  auto merges = j.find("merges");
  if (merges == j.end() || !merges->is_array()) return absl::InvalidArgumentError("model BPE: \"merges\" must be a list");
  m->merges_.reserve(merges->size());
  int32_t rank = 0;
  for (const auto& entry : *merges) {
    std::string a, b;
    if (entry.is_string()) {
      const std::string& s = entry.get_ref<const std::string&>();
      if (s.rfind("#version", 0) == 0) continue;  // a merges.txt header line
      size_t sp = s.find(' ');
      if (sp == std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("model BPE: merge ", rank, " '", s, "' is not two tokens"));
      }
      if (sp == 0 || s.find(' ', sp + 1) != std::string::npos) {
        // A merge of tokens that themselves hold spaces ("   " from Llama 2's
        // export) cannot be split back unambiguously; the reference
        // implementations cannot apply such a merge either. It keeps its rank.
        ++rank;
        continue;
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
      a = entry[0].get<std::string>();
      b = entry[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("model BPE: merge ", rank, " must be \"a b\" or [a, b]"));
    }
    auto ia = m->vocab_.find(a), ib = m->vocab_.find(b), inew = m->vocab_.find(a + b);
    if (ia == m->vocab_.end() || ib == m->vocab_.end() || inew == m->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model BPE: merge ", rank, " ('", a, "', '", b, "') uses a token not in the vocabulary"));
    }
    m->merges_[PairKey(ia->second, ib->second)] = Merge{rank, inew->second};
    ++rank;
  }
  return m;
}

void BpeModel::MergeSymbols(std::vector<int32_t>* syms) const {
  const size_t n = syms->size();
  if (n < 2) return;
  if (n <= 24) {
    // Short words: rescan for the best pair after each merge.
    std::vector<int32_t>& s = *syms;
    while (s.size() >= 2) {
      int32_t best_rank = std::numeric_limits<int32_t>::max();
      size_t best = 0;
      int32_t best_new = -1;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const Merge* mg = FindMerge(s[i], s[i + 1]);
        if (mg != nullptr && mg->rank < best_rank) {
          best_rank = mg->rank;
          best = i;
          best_new = mg->new_id;
        }
      }
      if (best_new < 0) break;
      s[best] = best_new;
      s.erase(s.begin() + static_cast<ptrdiff_t>(best) + 1);
    }
    return;
  }
  // Long words: a linked list of symbols and a heap of candidate merges,
  // lowest rank first, leftmost first among equal ranks; stale entries are
  // skipped when popped.
  std::vector<int32_t>& id = *syms;
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Cand {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const Merge* mg = FindMerge(id[pos], id[next[pos]])) heap.push({mg->rank, pos, mg->new_id});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    int32_t r = next[c.pos];
    const Merge* mg = FindMerge(id[c.pos], id[r]);
    if (mg == nullptr || mg->new_id != c.new_id || mg->rank != c.rank) continue;
    id[c.pos] = c.new_id;
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t out = 0;
  for (int32_t p = 0; p >= 0; p = next[p]) id[out++] = id[p];
  id.resize(out);
}

BpeModel::WordCache& BpeModel::ThreadCache() const {
  thread_local absl::flat_hash_map<uint64_t, WordCache> caches;
  return caches[serial_];
}

absl::Status BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return absl::OkStatus();
  if (word.size() > kCacheMaxWordBytes) return TokenizeUncached(word, ids);
  WordCache& cache = ThreadCache();
  if (auto it = cache.words.find(word); it != cache.words.end()) {
    ids->insert(ids->end(), it->second.begin(), it->second.end());
    return absl::OkStatus();
  }
  size_t before = ids->size();
  VC_RETURN_IF_ERROR(TokenizeUncached(word, ids));
  if (cache.words.size() >= kCacheMaxWords) cache.words.clear();
  cache.words.emplace(std::string(word), std::vector<int32_t>(ids->begin() + before, ids->end()));
  return absl::OkStatus();
}

absl::Status BpeModel::TokenizeUncached(std::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      ids->push_back(it->second);
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(word.size());
  bool last_was_unk = false;
  const bool plain = prefix_.empty() && suffix_.empty();
  std::string scratch;
  size_t pos = 0;
  while (pos < word.size()) {
    size_t start = pos;
    unsigned char lead = static_cast<unsigned char>(word[pos]);
    pos += std::min<size_t>(Utf8Len(lead), word.size() - pos);
    std::string_view ch = word.substr(start, pos - start);
    int32_t found = -1;
    if (plain && lead < 0x80) {
      found = ascii_ids_[lead];
    } else if (plain) {
      auto it = vocab_.find(ch);
      if (it != vocab_.end()) found = it->second;
    } else {
      scratch.clear();
      if (start > 0) scratch += prefix_;
      scratch += ch;
      if (pos == word.size()) scratch += suffix_;
      auto it = vocab_.find(scratch);
      if (it != vocab_.end()) found = it->second;
    }
    if (found >= 0) {
      syms.push_back(found);
      last_was_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) syms.push_back(byte_ids_[b]);
        last_was_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && last_was_unk)) syms.push_back(*unk_id_);
      last_was_unk = true;
    }
  }
  MergeSymbols(&syms);
  ids->insert(ids->end(), syms.begin(), syms.end());
  return absl::OkStatus();
}

// ------------------------------------------------------------ Unigram

class UnigramModel : public Model {
 public:
  static absl::StatusOr<std::unique_ptr<UnigramModel>> FromJson(const Json& j);

  absl::Status Tokenize(std::string_view word, std::vector<int32_t>* ids) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* IdToToken(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return nullptr;
    return &pieces_[id];
  }
  int32_t size() const override { return static_cast<int32_t>(pieces_.size()); }

 private:
  // A byte trie over the pieces: children in a flat hash map keyed by
  // (node << 8 | byte); a node's piece id or -1.
  int32_t Child(int32_t node, unsigned char b) const {
    auto it = trie_.find((static_cast<uint64_t>(node) << 8) | b);
    return it == trie_.end() ? -1 : it->second;
  }

  std::vector<std::string> pieces_;
  std::vector<double> scores_;
  VocabMap vocab_;
  absl::flat_hash_map<uint64_t, int32_t> trie_;
  std::vector<int32_t> node_piece_;
  int32_t unk_id_ = 0;
  double unk_score_ = 0;
  bool byte_fallback_ = false;
  std::array<int32_t, 256> byte_ids_{};
};

absl::StatusOr<std::unique_ptr<UnigramModel>> UnigramModel::FromJson(const Json& j) {
  const std::string where = "model Unigram";
  auto m = std::make_unique<UnigramModel>();
  auto vocab = j.find("vocab");
  if (vocab == j.end() || !vocab->is_array()) return absl::InvalidArgumentError("model Unigram: \"vocab\" must be a list");
  double min_score = std::numeric_limits<double>::infinity();
  m->node_piece_.push_back(-1);  // the root
  for (const auto& entry : *vocab) {
    if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() || !entry[1].is_number()) {
      return absl::InvalidArgumentError("model Unigram: vocab entries must be [piece, score]");
    }
    int32_t id = static_cast<int32_t>(m->pieces_.size());
    std::string piece = entry[0].get<std::string>();
    double score = entry[1].get<double>();
    min_score = std::min(min_score, score);
    m->vocab_.emplace(piece, id);
    // Trie insert.
    int32_t node = 0;
    for (unsigned char b : piece) {
      int32_t child = m->Child(node, b);
      if (child < 0) {
        child = static_cast<int32_t>(m->node_piece_.size());
        m->node_piece_.push_back(-1);
        m->trie_[(static_cast<uint64_t>(node) << 8) | b] = child;
      }
      node = child;
    }
    if (node != 0 && m->node_piece_[node] < 0) m->node_piece_[node] = id;
    m->pieces_.push_back(std::move(piece));
    m->scores_.push_back(score);
  }
  if (m->pieces_.empty()) return absl::InvalidArgumentError("model Unigram: empty vocabulary");
  VC_ASSIGN_OR_RETURN(int64_t unk, GetIntOr(j, "unk_id", -1, where));
  if (unk < 0 || unk >= static_cast<int64_t>(m->pieces_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("model Unigram: unk_id ", unk, " is not a vocabulary index"));
  }
  m->unk_id_ = static_cast<int32_t>(unk);
  // The reference's penalty for an unknown character (kUnkPenalty).
  m->unk_score_ = min_score - 10.0;
  VC_ASSIGN_OR_RETURN(m->byte_fallback_, GetBoolOr(j, "byte_fallback", false, where));
  for (int b = 0; b < 256; ++b) {
    auto it = m->vocab_.find(ByteTokenName(static_cast<uint8_t>(b)));
    m->byte_ids_[b] = it == m->vocab_.end() ? -1 : it->second;
  }
  return m;
}

absl::Status UnigramModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  const size_t n = word.size();
  if (n == 0) return absl::OkStatus();
  // best[i]: the best segmentation of word[0, i): its score, the id of its
  // last token and where that token starts.
  struct Node {
    double score = 0;
    int32_t id = -1;
    size_t start = 0;
    bool set = false;
  };
  std::vector<Node> best(n + 1);
  best[0].set = true;
  size_t pos = 0;
  while (pos < n) {
    size_t char_len = std::min<size_t>(Utf8Len(static_cast<unsigned char>(word[pos])), n - pos);
    if (best[pos].set) {
      const double base = best[pos].score;
      bool has_single = false;
      int32_t node = 0;
      for (size_t k = pos; k < n; ++k) {
        node = Child(node, static_cast<unsigned char>(word[k]));
        if (node < 0) break;
        int32_t id = node_piece_[node];
        if (id < 0) continue;
        size_t end = k + 1;
        // Keys end on character boundaries because pieces are whole UTF-8.
        double cand = base + (id == unk_id_ ? unk_score_ : scores_[id]);
        Node& b = best[end];
        if (!b.set || cand > b.score) b = Node{cand, id, pos, true};
        if (end - pos == char_len) has_single = true;
      }
      if (!has_single) {
        double cand = base + unk_score_;
        Node& b = best[pos + char_len];
        if (!b.set || cand > b.score) b = Node{cand, unk_id_, pos, true};
      }
    }
    pos += char_len;
  }
  // Backtrack.
  std::vector<std::pair<size_t, size_t>> spans;  // [start, end) per token
  std::vector<int32_t> toks;
  for (size_t end = n; end > 0;) {
    const Node& b = best[end];
    if (!b.set) return absl::InternalError("unigram lattice has no path");
    toks.push_back(b.id);
    spans.emplace_back(b.start, end);
    end = b.start;
  }
  std::reverse(toks.begin(), toks.end());
  std::reverse(spans.begin(), spans.end());
  // Consecutive unknowns fuse into one; with byte fallback an unknown span
  // becomes its bytes' tokens when they all exist.
  for (size_t i = 0; i < toks.size();) {
    if (toks[i] != unk_id_) {
      ids->push_back(toks[i]);
      ++i;
      continue;
    }
    size_t j = i;
    while (j < toks.size() && toks[j] == unk_id_) ++j;
    std::string_view text = word.substr(spans[i].first, spans[j - 1].second - spans[i].first);
    bool bytes_ok = byte_fallback_;
    if (bytes_ok) {
      for (unsigned char b : text) bytes_ok = bytes_ok && byte_ids_[b] >= 0;
    }
    if (bytes_ok) {
      for (unsigned char b : text) ids->push_back(byte_ids_[b]);
    } else {
      ids->push_back(unk_id_);
    }
    i = j;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> MakeModel(const Json& j) {
  std::string type = TypeOf(j);
  if (type.empty() && j.is_object()) {
    // Files written before "type" was serialised: guess as the reference does.
    if (j.contains("merges")) type = "BPE";
    else if (j.contains("vocab") && j["vocab"].is_array()) type = "Unigram";
  }
  if (type == "BPE") {
    VC_ASSIGN_OR_RETURN(auto m, BpeModel::FromJson(j));
    return std::unique_ptr<Model>(std::move(m));
  }
  if (type == "Unigram") {
    VC_ASSIGN_OR_RETURN(auto m, UnigramModel::FromJson(j));
    return std::unique_ptr<Model>(std::move(m));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported model type '", type, "'"));
}

}  // namespace vc::tokenizer_internal
