// Token-count distributions, the acceptance model and its CSV reader.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/costmodel/cost_model.h"
#include "common/sim/simulator.h"

namespace vc::sim {
namespace {

// Uniform in [0, 1) from the generator's raw bits (independent of the
// standard library's distribution algorithms, so runs are reproducible
// everywhere).
double Uniform01(std::mt19937_64& rng) { return (rng() >> 11) * 0x1.0p-53; }

}  // namespace

absl::Status Distribution::Validate(const char* what) const {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
  };
  switch (kind) {
    case Kind::kFixed:
      if (!(value >= 1 && std::isfinite(value)))
        return bad(absl::StrCat("must be >= 1, got ", value));
      break;
    case Kind::kUniform:
      if (!(min >= 1 && max >= min && std::isfinite(max))) {
        return bad(absl::StrCat("uniform needs 1 <= min <= max, got ", min, "..", max));
      }
      break;
    case Kind::kNormal:
      if (!(mean >= 1 && stddev >= 0 && std::isfinite(mean) && std::isfinite(stddev))) {
        return bad("normal needs mean >= 1 and stddev >= 0");
      }
      if (!(min >= 1 && max >= min && std::isfinite(max))) {
        return bad(absl::StrCat("normal needs clamp bounds 1 <= min <= max, got ", min, "..", max));
      }
      break;
  }
  return absl::OkStatus();
}

double Distribution::Mean() const {
  switch (kind) {
    case Kind::kFixed:
      return std::round(value);
    case Kind::kUniform:
      return (std::round(min) + std::round(max)) / 2;
    case Kind::kNormal:
      return std::clamp(mean, min, max);
  }
  return value;
}

int64_t Distribution::Sample(std::mt19937_64& rng) const {
  switch (kind) {
    case Kind::kFixed:
      return std::llround(value);
    case Kind::kUniform: {
      const int64_t lo = std::llround(min), hi = std::llround(max);
      return lo + static_cast<int64_t>(Uniform01(rng) * static_cast<double>(hi - lo + 1));
    }
    case Kind::kNormal: {
      // Box-Muller.
      const double u1 = 1 - Uniform01(rng), u2 = Uniform01(rng);
      const double z = std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
      return std::llround(std::clamp(mean + stddev * z, min, max));
    }
  }
  return std::llround(value);
}

absl::Status AcceptanceModel::Validate() const {
  if (kind == Kind::kPerToken) {
    if (!(per_token >= 0 && per_token <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("acceptance: per-token probability must be in [0, 1], got ", per_token));
    }
    return absl::OkStatus();
  }
  if (empirical.empty())
    return absl::InvalidArgumentError("acceptance: empirical distribution is empty");
  if (empirical_draft_len < 1) {
    return absl::InvalidArgumentError("acceptance: empirical distribution needs its draft length");
  }
  for (int a : empirical) {
    if (a < 0 || a > empirical_draft_len) {
      return absl::InvalidArgumentError(absl::StrCat("acceptance: accepted count ", a,
                                                     " outside [0, ", empirical_draft_len, "]"));
    }
  }
  return absl::OkStatus();
}

int AcceptanceModel::Sample(int drafted, std::mt19937_64& rng) const {
  if (drafted <= 0) return 0;
  if (kind == Kind::kPerToken) {
    if (per_token >= 1) return drafted;
    if (per_token <= 0) return 0;
    // Successes before the first failure: geometric by inversion.
    const double u = 1 - Uniform01(rng);
    const double k = std::floor(std::log(u) / std::log(per_token));
    return static_cast<int>(std::min<double>(k, drafted));
  }
  int accepted = 0;
  while (accepted < drafted) {
    const int a = empirical[static_cast<size_t>(Uniform01(rng) * empirical.size())];
    if (a < empirical_draft_len) return std::min(drafted, accepted + a);
    // The whole measured draft was accepted: what follows is a fresh round.
    accepted += a;
  }
  return drafted;
}

double AcceptanceModel::BonusMatch() const {
  if (kind == Kind::kPerToken) return per_token;
  return costmodel::PerTokenFromFraction(MeanFraction(empirical_draft_len), empirical_draft_len);
}

double AcceptanceModel::MeanFraction(int draft_len) const {
  if (draft_len <= 0) return 0;
  if (kind == Kind::kPerToken) {
    return costmodel::MeanAcceptedGeometric(per_token, draft_len) / draft_len;
  }
  // Exact for draft_len <= empirical_draft_len; the renewal above otherwise.
  double sum = 0;
  if (draft_len <= empirical_draft_len) {
    for (int a : empirical) sum += std::min(a, draft_len);
    return sum / empirical.size() / draft_len;
  }
  double full = 0;
  for (int a : empirical) {
    sum += a;
    full += a == empirical_draft_len;
  }
  const double mean = sum / empirical.size(), p_full = full / empirical.size();
  // Renewal: each block contributes its mean while all previous blocks were full.
  double expected = 0, weight = 1;
  int covered = 0;
  while (covered < draft_len && weight > 1e-12) {
    expected += weight * std::min<double>(mean, draft_len - covered);
    covered += empirical_draft_len;
    weight *= p_full;
  }
  return std::min(1.0, expected / draft_len);
}

absl::StatusOr<AcceptanceModel> LoadEmpiricalAcceptance(const std::string& path,
                                                        int draft_len_if_absent) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("acceptance CSV '", path, "' cannot be read"));
  std::string line;
  if (!std::getline(in, line)) {
    return absl::InvalidArgumentError(absl::StrCat("acceptance CSV '", path, "' is empty"));
  }
  std::vector<std::string> header = absl::StrSplit(line, ',');
  int col_accepted = -1, col_count = -1, col_len = -1;
  for (size_t i = 0; i < header.size(); ++i) {
    const std::string name(absl::StripAsciiWhitespace(header[i]));
    if (name == "accepted") col_accepted = static_cast<int>(i);
    if (name == "count") col_count = static_cast<int>(i);
    if (name == "draft_len") col_len = static_cast<int>(i);
  }
  if (col_accepted < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("acceptance CSV '", path, "': no 'accepted' column in the header"));
  }
  AcceptanceModel m;
  m.kind = AcceptanceModel::Kind::kEmpirical;
  m.empirical_draft_len = draft_len_if_absent;
  int line_no = 1;
  constexpr int64_t kMaxRounds = 10'000'000;  // bound the expanded table
  while (std::getline(in, line)) {
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    std::vector<std::string> cells = absl::StrSplit(line, ',');
    auto cell = [&](int col, int64_t* out) -> absl::Status {
      if (col >= static_cast<int>(cells.size()) ||
          !absl::SimpleAtoi(absl::StripAsciiWhitespace(cells[col]), out)) {
        return absl::InvalidArgumentError(absl::StrCat("acceptance CSV '", path, "' line ", line_no,
                                                       ": column ", col + 1, " is not an integer"));
      }
      return absl::OkStatus();
    };
    int64_t accepted = 0, count = 1, len = 0;
    if (auto s = cell(col_accepted, &accepted); !s.ok()) return s;
    if (col_count >= 0) {
      if (auto s = cell(col_count, &count); !s.ok()) return s;
    }
    if (col_len >= 0) {
      if (auto s = cell(col_len, &len); !s.ok()) return s;
      if (m.empirical_draft_len > 0 && len != m.empirical_draft_len && line_no > 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "acceptance CSV '", path, "' line ", line_no, ": draft_len ", len,
            " differs from earlier rows (", m.empirical_draft_len, "); one draft length per file"));
      }
      m.empirical_draft_len = static_cast<int>(len);
    }
    if (count < 0 || static_cast<int64_t>(m.empirical.size()) + count > kMaxRounds) {
      return absl::InvalidArgumentError(
          absl::StrCat("acceptance CSV '", path, "' line ", line_no, ": bad count ", count));
    }
    m.empirical.insert(m.empirical.end(), count, static_cast<int>(accepted));
  }
  if (auto s = m.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("acceptance CSV '", path, "': ", s.message()));
  }
  return m;
}

}  // namespace vc::sim
