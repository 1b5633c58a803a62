// Prometheus-style metrics for every VeriCache daemon: a thread-safe registry
// of counter, gauge and histogram families with labels, rendered in the text
// exposition format 0.0.4 (served over HTTP by metrics_server.h).
//
//   vc::metrics::Registry registry;
//   auto requests = registry.AddCounter("vc_requests_total", "Requests served.",
//                                       {"method"});
//   vc::metrics::Counter& gets = (*requests)->Labels({"get"});  // keep it
//   gets.Inc();                                                  // lock-free
//
// Families are created once (name, help, label names, and bucket bounds for
// histograms); Labels() returns a child whose address is stable for the life
// of the registry, so hot paths look it up once and keep the reference.
// Updates are lock-free atomics; Labels() and Expose() take a per-family lock.
//
// Cardinality is bounded: once a family holds `max_label_sets_per_family`
// label sets, further new label sets all map to one overflow child whose every
// label value is kOverflowLabelValue, and the family counts those calls
// (overflow_count()). Registries are neither copyable nor movable.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vc::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// Label value given to the overflow child of a family that hit its bound.
inline constexpr char kOverflowLabelValue[] = "__overflow__";

struct RegistryOptions {
  // Maximum distinct label sets per family (not counting the overflow
  // child). Default 10000; 0 is treated as 1.
  size_t max_label_sets_per_family = 10000;
};

// A monotonically increasing value.
class Counter {
 public:
  // Adds v. Negative and NaN increments are ignored (a counter never goes
  // down); they are counted in dropped_increments().
  void Inc(double v = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }
  uint64_t dropped_increments() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
  std::atomic<uint64_t> dropped_{0};
};

// A value that can go up and down.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Inc(double v = 1.0) { value_.fetch_add(v, std::memory_order_relaxed); }
  void Dec(double v = 1.0) { value_.fetch_sub(v, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into fixed buckets. Bucket i counts v <= bounds[i]
// (and > bounds[i-1]); values above the last bound (and NaN) land in +Inf.
class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0.0;
    uint64_t count = 0;                // == cumulative.back()
  };
  Snapshot Collect() const;

 private:
  const std::vector<double>* bounds_;  // owned by the family
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_->size() + 1
  std::atomic<double> sum_{0.0};
};

namespace internal {
// Type-erased part of a family, used by the registry for exposition.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  const std::vector<double>& buckets() const { return buckets_; }
  MetricType type() const { return type_; }
  // Appends this family's HELP, TYPE and samples; nothing if it has no child.
  virtual void Expose(std::string* out) const = 0;

 protected:
  FamilyBase(MetricType type, std::string name, std::string help,
             std::vector<std::string> label_names, std::vector<double> buckets, size_t max_sets);
  MetricType type_;
  std::string name_;
  std::string help_;
  std::vector<std::string> label_names_;
  std::vector<double> buckets_;  // histograms only
  size_t max_sets_;
};
}  // namespace internal

// A named metric with a fixed set of label names; one child per label set.
template <typename T>
class Family : public internal::FamilyBase {
 public:
  // The child for these label values (in label-name order), created on first
  // use. Aborts if the number of values differs from the number of label
  // names (a programming error); use TryLabels to get a Status instead.
  T& Labels(const std::vector<std::string>& values);
  absl::StatusOr<T*> TryLabels(const std::vector<std::string>& values);
  // The single child of a family without labels.
  T& Get() { return Labels({}); }

  // Number of Labels() calls that went to the overflow child.
  uint64_t overflow_count() const { return overflow_.load(std::memory_order_relaxed); }
  // Distinct label sets held, not counting the overflow child.
  size_t size() const;

  void Expose(std::string* out) const override;

  Family(MetricType type, std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> buckets, size_t max_sets);

 private:
  std::unique_ptr<T> NewChild() const;

  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_;  // guarded by mu_
  bool has_overflow_child_ = false;                                  // guarded by mu_
  std::atomic<uint64_t> overflow_{0};
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

// Owns metric families. Add*() validates per the Prometheus data model:
// metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names match
// [a-zA-Z_][a-zA-Z0-9_]* without a "__" prefix and without duplicates, and
// histograms may not use the label "le"; violations are InvalidArgument.
// Registering a name again with the same type, help, label names (and
// buckets) returns the existing family; any other difference, or a sample
// name that clashes with another family's (e.g. "x_count" next to histogram
// "x"), is AlreadyExists.
class Registry {
 public:
  explicit Registry(RegistryOptions options = {});
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  [[nodiscard]] absl::StatusOr<CounterFamily*> AddCounter(const std::string& name, const std::string& help,
                                                          std::vector<std::string> label_names = {});
  [[nodiscard]] absl::StatusOr<GaugeFamily*> AddGauge(const std::string& name, const std::string& help,
                                                      std::vector<std::string> label_names = {});
  // `buckets`: upper bounds, finite and strictly increasing, at least one;
  // the +Inf bucket is implicit.
  [[nodiscard]] absl::StatusOr<HistogramFamily*> AddHistogram(const std::string& name,
                                                              const std::string& help,
                                                              std::vector<std::string> label_names,
                                                              std::vector<double> buckets);

  // Text exposition format 0.0.4: families sorted by name, children sorted
  // by label values.
  std::string Expose() const;

 private:
  absl::StatusOr<internal::FamilyBase*> Add(MetricType type, const std::string& name,
                                            const std::string& help,
                                            std::vector<std::string> label_names,
                                            std::vector<double> buckets);

  RegistryOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<internal::FamilyBase>> families_;  // guarded by mu_
  std::set<std::string> sample_names_;                                      // guarded by mu_
};

// Registers gauge vericache_build_info{version="..."} with value 1.
[[nodiscard]] absl::Status RegisterBuildInfo(Registry& registry, const std::string& version);

// Helpers exposed for tests and for other exporters.
bool IsValidMetricName(const std::string& name);
bool IsValidLabelName(const std::string& name);
// Formats a sample value so Prometheus parses it back exactly: shortest
// round-trip decimal, "+Inf", "-Inf" or "NaN".
std::string FormatValue(double v);

}  // namespace vc::metrics
