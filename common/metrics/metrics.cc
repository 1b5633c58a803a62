#include "common/metrics/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace vc::metrics {
namespace {

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

const char* TypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// HELP text escapes backslash and newline.
void AppendEscapedHelp(const std::string& s, std::string* out) {
  for (char c : s) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else {
      out->push_back(c);
    }
  }
}

// Label values also escape the double quote.
void AppendEscapedLabelValue(const std::string& s, std::string* out) {
  for (char c : s) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '"') {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

// Appends `{a="x",b="y"}` (plus an optional trailing le label), or nothing
// when there are no labels at all.
void AppendLabels(const std::vector<std::string>& names, const std::vector<std::string>& values,
                  const std::string* le, std::string* out) {
  if (names.empty() && le == nullptr) return;
  out->push_back('{');
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out->push_back(',');
    out->append(names[i]);
    out->append("=\"");
    AppendEscapedLabelValue(values[i], out);
    out->push_back('"');
  }
  if (le != nullptr) {
    if (!names.empty()) out->push_back(',');
    out->append("le=\"");
    out->append(*le);
    out->push_back('"');
  }
  out->push_back('}');
}

void AppendSample(const std::string& name, const std::vector<std::string>& label_names,
                  const std::vector<std::string>& values, const std::string* le, const std::string& value,
                  std::string* out) {
  out->append(name);
  AppendLabels(label_names, values, le, out);
  out->push_back(' ');
  out->append(value);
  out->push_back('\n');
}

void AppendChild(const internal::FamilyBase& f, const std::vector<std::string>& values, const Counter& c,
                 std::string* out) {
  AppendSample(f.name(), f.label_names(), values, nullptr, FormatValue(c.Value()), out);
}

void AppendChild(const internal::FamilyBase& f, const std::vector<std::string>& values, const Gauge& g,
                 std::string* out) {
  AppendSample(f.name(), f.label_names(), values, nullptr, FormatValue(g.Value()), out);
}

void AppendChild(const internal::FamilyBase& f, const std::vector<std::string>& values, const Histogram& h,
                 std::string* out) {
  const Histogram::Snapshot s = h.Collect();
  const std::string bucket_name = f.name() + "_bucket";
  for (size_t i = 0; i < s.cumulative.size(); ++i) {
    const std::string le = i < f.buckets().size() ? FormatValue(f.buckets()[i]) : std::string("+Inf");
    AppendSample(bucket_name, f.label_names(), values, &le, std::to_string(s.cumulative[i]), out);
  }
  AppendSample(f.name() + "_sum", f.label_names(), values, nullptr, FormatValue(s.sum), out);
  AppendSample(f.name() + "_count", f.label_names(), values, nullptr, std::to_string(s.count), out);
}

// The names of the sample lines a family produces.
std::vector<std::string> SampleNames(MetricType type, const std::string& name) {
  if (type == MetricType::kHistogram) return {name + "_bucket", name + "_sum", name + "_count"};
  return {name};
}

}  // namespace

bool IsValidMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = IsAlpha(c) || c == '_' || c == ':' || (i > 0 && IsDigit(c));
    if (!ok) return false;
  }
  return true;
}

bool IsValidLabelName(const std::string& name) {
  if (name.empty()) return false;
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = IsAlpha(c) || c == '_' || (i > 0 && IsDigit(c));
    if (!ok) return false;
  }
  return true;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

// ---- Children ---------------------------------------------------------------

void Counter::Inc(double v) {
  if (!(v >= 0.0)) {  // negative or NaN
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  value_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), counts_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  // First bound >= v; NaN compares false everywhere and lands in +Inf.
  const size_t i = static_cast<size_t>(
      std::lower_bound(bounds_->begin(), bounds_->end(), v) - bounds_->begin());
  counts_[std::isnan(v) ? bounds_->size() : i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot s;
  s.cumulative.resize(bounds_->size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

// ---- Families ----------------------------------------------------------------

namespace internal {
FamilyBase::FamilyBase(MetricType type, std::string name, std::string help,
                       std::vector<std::string> label_names, std::vector<double> buckets,
                       size_t max_sets)
    : type_(type),
      name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      buckets_(std::move(buckets)),
      max_sets_(max_sets) {}
}  // namespace internal

template <typename T>
Family<T>::Family(MetricType type, std::string name, std::string help, std::vector<std::string> label_names,
                  std::vector<double> buckets, size_t max_sets)
    : FamilyBase(type, std::move(name), std::move(help), std::move(label_names), std::move(buckets),
                 max_sets) {}

template <typename T>
std::unique_ptr<T> Family<T>::NewChild() const {
  if constexpr (std::is_same_v<T, Histogram>) {
    return std::make_unique<Histogram>(&buckets_);
  } else {
    return std::make_unique<T>();
  }
}

template <typename T>
absl::StatusOr<T*> Family<T>::TryLabels(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("metric ", name_, " has ", label_names_.size(),
                                                   " label names but got ", values.size(), " values"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = children_.find(values);
  if (it != children_.end()) return it->second.get();
  const size_t held = children_.size() - (has_overflow_child_ ? 1 : 0);
  if (held >= max_sets_) {
    overflow_.fetch_add(1, std::memory_order_relaxed);
    std::vector<std::string> overflow_key(label_names_.size(), kOverflowLabelValue);
    auto& child = children_[overflow_key];
    if (child == nullptr) {
      child = NewChild();
      has_overflow_child_ = true;
    }
    return child.get();
  }
  auto& child = children_[values];
  child = NewChild();
  return child.get();
}

template <typename T>
T& Family<T>::Labels(const std::vector<std::string>& values) {
  auto child = TryLabels(values);
  VC_CHECK(child.ok(), "Family::Labels: wrong number of label values");
  return **child;
}

template <typename T>
size_t Family<T>::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return children_.size() - (has_overflow_child_ ? 1 : 0);
}

template <typename T>
void Family<T>::Expose(std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (children_.empty()) return;
  out->append("# HELP ");
  out->append(name_);
  out->push_back(' ');
  AppendEscapedHelp(help_, out);
  out->append("\n# TYPE ");
  out->append(name_);
  out->push_back(' ');
  out->append(TypeName(type_));
  out->push_back('\n');
  for (const auto& [values, child] : children_) AppendChild(*this, values, *child, out);
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- Registry ------------------------------------------------------------------

Registry::Registry(RegistryOptions options) : options_(options) {
  if (options_.max_label_sets_per_family == 0) options_.max_label_sets_per_family = 1;
}

Registry::~Registry() = default;

absl::StatusOr<internal::FamilyBase*> Registry::Add(MetricType type, const std::string& name,
                                                    const std::string& help,
                                                    std::vector<std::string> label_names,
                                                    std::vector<double> buckets) {
  if (!IsValidMetricName(name)) return absl::InvalidArgumentError(absl::StrCat("invalid metric name '", name, "'"));
  std::set<std::string> seen;
  for (const std::string& l : label_names) {
    if (!IsValidLabelName(l)) {
      return absl::InvalidArgumentError(absl::StrCat("metric ", name, ": invalid label name '", l, "'"));
    }
    if (type == MetricType::kHistogram && l == "le") {
      return absl::InvalidArgumentError(absl::StrCat("histogram ", name, ": label name 'le' is reserved"));
    }
    if (!seen.insert(l).second) {
      return absl::InvalidArgumentError(absl::StrCat("metric ", name, ": duplicate label name '", l, "'"));
    }
  }
  if (type == MetricType::kHistogram) {
    if (buckets.empty()) return absl::InvalidArgumentError(absl::StrCat("histogram ", name, ": no buckets"));
    for (size_t i = 0; i < buckets.size(); ++i) {
      if (!std::isfinite(buckets[i])) {
        return absl::InvalidArgumentError(absl::StrCat("histogram ", name, ": bucket bounds must be finite"));
      }
      if (i > 0 && !(buckets[i] > buckets[i - 1])) {
        return absl::InvalidArgumentError(
            absl::StrCat("histogram ", name, ": bucket bounds must be strictly increasing"));
      }
    }
  }

  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    const internal::FamilyBase& f = *it->second;
    if (f.type() == type && f.help() == help && f.label_names() == label_names && f.buckets() == buckets) {
      return it->second.get();
    }
    return absl::AlreadyExistsError(
        absl::StrCat("metric ", name, " is already registered with a different definition"));
  }
  const std::vector<std::string> samples = SampleNames(type, name);
  for (const std::string& s : samples) {
    if (sample_names_.count(s) > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("metric ", name, ": sample name ", s, " clashes with another family"));
    }
  }
  const size_t max_sets = options_.max_label_sets_per_family;
  std::unique_ptr<internal::FamilyBase> family;
  const bool no_labels = label_names.empty();
  switch (type) {
    case MetricType::kCounter:
      family = std::make_unique<CounterFamily>(type, name, help, std::move(label_names), std::move(buckets), max_sets);
      if (no_labels) static_cast<CounterFamily*>(family.get())->Get();
      break;
    case MetricType::kGauge:
      family = std::make_unique<GaugeFamily>(type, name, help, std::move(label_names), std::move(buckets), max_sets);
      if (no_labels) static_cast<GaugeFamily*>(family.get())->Get();
      break;
    case MetricType::kHistogram:
      family =
          std::make_unique<HistogramFamily>(type, name, help, std::move(label_names), std::move(buckets), max_sets);
      if (no_labels) static_cast<HistogramFamily*>(family.get())->Get();
      break;
  }
  sample_names_.insert(samples.begin(), samples.end());
  internal::FamilyBase* raw = family.get();
  families_.emplace(name, std::move(family));
  return raw;
}

absl::StatusOr<CounterFamily*> Registry::AddCounter(const std::string& name, const std::string& help,
                                                    std::vector<std::string> label_names) {
  VC_ASSIGN_OR_RETURN(internal::FamilyBase * f, Add(MetricType::kCounter, name, help, std::move(label_names), {}));
  return static_cast<CounterFamily*>(f);
}

absl::StatusOr<GaugeFamily*> Registry::AddGauge(const std::string& name, const std::string& help,
                                                std::vector<std::string> label_names) {
  VC_ASSIGN_OR_RETURN(internal::FamilyBase * f, Add(MetricType::kGauge, name, help, std::move(label_names), {}));
  return static_cast<GaugeFamily*>(f);
}

absl::StatusOr<HistogramFamily*> Registry::AddHistogram(const std::string& name, const std::string& help,
                                                        std::vector<std::string> label_names,
                                                        std::vector<double> buckets) {
  VC_ASSIGN_OR_RETURN(internal::FamilyBase * f,
                      Add(MetricType::kHistogram, name, help, std::move(label_names), std::move(buckets)));
  return static_cast<HistogramFamily*>(f);
}

std::string Registry::Expose() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, family] : families_) family->Expose(&out);
  return out;
}

absl::Status RegisterBuildInfo(Registry& registry, const std::string& version) {
  VC_ASSIGN_OR_RETURN(GaugeFamily * g,
                      registry.AddGauge("vericache_build_info", "VeriCache build information.", {"version"}));
  g->Labels({version}).Set(1);
  return absl::OkStatus();
}

}  // namespace vc::metrics
