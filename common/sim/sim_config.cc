// The simulator's JSON configuration (bench/sim/README.md), its validation,
// and the JSON / CSV renderings of a result.
#include <cmath>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/costmodel/cost_model.h"
#include "common/sim/simulator.h"
#include "nlohmann/json.hpp"

namespace vc::sim {
namespace {

using nlohmann::json;

absl::Status Bad(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("config ", where, ": ", what));
}

// Every object is checked for unknown keys so that a typo is an error, not
// a silently ignored setting.
absl::Status KnownKeys(const json& obj, const std::string& where, std::set<std::string> keys) {
  if (!obj.is_object()) return Bad(where, "must be an object");
  for (const auto& [k, v] : obj.items()) {
    if (keys.count(k) == 0) {
      return Bad(where,
                 absl::StrCat("unknown key '", k, "' (known: ", absl::StrJoin(keys, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status GetNumber(const json& obj, const std::string& where, const char* key, double* out) {
  if (!obj.contains(key)) return absl::OkStatus();
  const json& v = obj.at(key);
  if (!v.is_number()) return Bad(absl::StrCat(where, ".", key), "must be a number");
  *out = v.get<double>();
  if (!std::isfinite(*out)) return Bad(absl::StrCat(where, ".", key), "must be finite");
  return absl::OkStatus();
}

template <typename Int>
absl::Status GetInt(const json& obj, const std::string& where, const char* key, Int* out) {
  if (!obj.contains(key)) return absl::OkStatus();
  const json& v = obj.at(key);
  if (!v.is_number_integer() && !v.is_number_unsigned()) {
    return Bad(absl::StrCat(where, ".", key), "must be an integer");
  }
  *out = v.get<Int>();
  return absl::OkStatus();
}

absl::Status GetBool(const json& obj, const std::string& where, const char* key, bool* out) {
  if (!obj.contains(key)) return absl::OkStatus();
  if (!obj.at(key).is_boolean()) return Bad(absl::StrCat(where, ".", key), "must be true or false");
  *out = obj.at(key).get<bool>();
  return absl::OkStatus();
}

absl::Status GetString(const json& obj, const std::string& where, const char* key,
                       std::string* out) {
  if (!obj.contains(key)) return absl::OkStatus();
  if (!obj.at(key).is_string()) return Bad(absl::StrCat(where, ".", key), "must be a string");
  *out = obj.at(key).get<std::string>();
  return absl::OkStatus();
}

absl::StatusOr<Distribution> ParseDistribution(const json& v, const std::string& where) {
  if (v.is_number()) return Distribution::Fixed(v.get<double>());
  VC_RETURN_IF_ERROR(KnownKeys(v, where, {"dist", "value", "min", "max", "mean", "stddev"}));
  std::string kind = "fixed";
  VC_RETURN_IF_ERROR(GetString(v, where, "dist", &kind));
  Distribution d;
  VC_RETURN_IF_ERROR(GetNumber(v, where, "value", &d.value));
  VC_RETURN_IF_ERROR(GetNumber(v, where, "min", &d.min));
  VC_RETURN_IF_ERROR(GetNumber(v, where, "max", &d.max));
  VC_RETURN_IF_ERROR(GetNumber(v, where, "mean", &d.mean));
  VC_RETURN_IF_ERROR(GetNumber(v, where, "stddev", &d.stddev));
  if (kind == "fixed") {
    d = Distribution::Fixed(d.value);
  } else if (kind == "uniform") {
    d.kind = Distribution::Kind::kUniform;
  } else if (kind == "normal") {
    d.kind = Distribution::Kind::kNormal;
    if (!v.contains("min")) d.min = 1;
    if (!v.contains("max")) d.max = 1e9;
  } else {
    return Bad(where + ".dist", absl::StrCat("'", kind, "' is not fixed|uniform|normal"));
  }
  return d;
}

template <typename Profile>
absl::StatusOr<Profile> ProfileFrom(const json& v, const std::string& where,
                                    absl::StatusOr<Profile> (*find)(const std::string&),
                                    std::string* name) {
  if (v.is_string()) {
    *name = v.get<std::string>();
  } else if (v.is_object() && v.contains("profile")) {
    if (!v.at("profile").is_string()) return Bad(where + ".profile", "must be a string");
    *name = v.at("profile").get<std::string>();
  } else {
    return Profile{};
  }
  auto p = find(*name);
  if (!p.ok()) return Bad(where, std::string(p.status().message()));
  return p;
}

}  // namespace

absl::Status SimConfig::Validate() const {
  auto positive = [](const char* what, double v) -> absl::Status {
    if (v > 0 && std::isfinite(v)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, " must be > 0, got ", v));
  };
  auto non_negative = [](const char* what, double v) -> absl::Status {
    if (v >= 0 && std::isfinite(v)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what, " must be >= 0, got ", v));
  };
  VC_RETURN_IF_ERROR(non_negative("hbm_bytes", hbm_bytes));
  VC_RETURN_IF_ERROR(positive("hbm_bytes_per_second", hbm_bytes_per_second));
  VC_RETURN_IF_ERROR(non_negative("flops", flops));
  VC_RETURN_IF_ERROR(non_negative("iteration_overhead_s", iteration_overhead_s));
  VC_RETURN_IF_ERROR(non_negative("host_link_bytes_per_second", host_link_bytes_per_second));
  VC_RETURN_IF_ERROR(non_negative("fast_link_bytes_per_second", fast_link_bytes_per_second));
  VC_RETURN_IF_ERROR(non_negative("slow_link_bytes_per_second", slow_link_bytes_per_second));
  VC_RETURN_IF_ERROR(non_negative("rtt_s", rtt_s));
  VC_RETURN_IF_ERROR(non_negative("weight_bytes", weight_bytes));
  VC_RETURN_IF_ERROR(non_negative("params", params));
  VC_RETURN_IF_ERROR(positive("kv_bytes_per_token", kv_bytes_per_token));
  if (hbm_bytes > 0 && weight_bytes >= hbm_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights (", weight_bytes, " bytes) do not fit in HBM (", hbm_bytes, ")"));
  }
  if (gpus < 1 || gpus > 4096) return absl::InvalidArgumentError("gpus must be in [1, 4096]");
  if (drafters < 1 || drafters > 4096)
    return absl::InvalidArgumentError("drafters must be in [1, 4096]");
  if (verifiers < 1 || verifiers > 4096) {
    return absl::InvalidArgumentError("verifiers must be in [1, 4096]");
  }
  if (requests < 1 || requests > 10'000'000) {
    return absl::InvalidArgumentError(absl::StrCat("requests must be in [1, 1e7], got ", requests));
  }
  if (arrival == Arrival::kPoisson) VC_RETURN_IF_ERROR(positive("arrival rate", arrival_rate));
  if (arrival == Arrival::kClosed && concurrency < 1) {
    return absl::InvalidArgumentError(absl::StrCat("concurrency must be >= 1, got ", concurrency));
  }
  VC_RETURN_IF_ERROR(prompt_tokens.Validate("prompt_tokens"));
  VC_RETURN_IF_ERROR(output_tokens.Validate("output_tokens"));
  if (max_batch < 0) return absl::InvalidArgumentError("max_batch must be >= 0");
  if (shared_prefixes < 0 || shared_prefixes > 10'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared_prefixes must be in [0, 1e7], got ", shared_prefixes));
  }
  if (!(ratio > 0 && ratio <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("ratio must be in (0, 1], got ", ratio));
  }
  if (draft_len < 1 || draft_len > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft_len must be in [1, 4096], got ", draft_len));
  }
  VC_RETURN_IF_ERROR(acceptance.Validate());
  VC_RETURN_IF_ERROR(non_negative("slot_seconds", slot_seconds));
  if (window_slots < 3 || window_slots > 1'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("window_slots must be in [3, 1e6], got ", window_slots));
  }
  VC_RETURN_IF_ERROR(positive("max_sim_seconds", max_sim_seconds));
  if (timeseries_max_points < 1)
    return absl::InvalidArgumentError("timeseries_max_points must be >= 1");
  return absl::OkStatus();
}

absl::StatusOr<SimConfig> ParseSimConfig(const std::string& json_text,
                                         const std::string& base_dir) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (j.is_discarded()) return absl::InvalidArgumentError("config: not valid JSON");
  VC_RETURN_IF_ERROR(KnownKeys(
      j, "(top level)",
      {"topology", "mode", "schedule", "hardware", "model", "cluster", "workload", "vericache",
       "scheduler", "seed", "max_sim_seconds", "timeseries_max_points", "description"}));
  SimConfig c;
  std::string s;
  s = "long-context";
  VC_RETURN_IF_ERROR(GetString(j, "", "topology", &s));
  if (s == "long-context") {
    c.topology = SimConfig::Topology::kLongContext;
  } else if (s == "remote-prefix") {
    c.topology = SimConfig::Topology::kRemotePrefix;
  } else {
    return Bad("topology", absl::StrCat("'", s, "' is not long-context|remote-prefix"));
  }
  s = "vericache";
  VC_RETURN_IF_ERROR(GetString(j, "", "mode", &s));
  if (s == "vericache") {
    c.mode = SimConfig::Mode::kVeriCache;
  } else if (s == "full") {
    c.mode = SimConfig::Mode::kFull;
  } else {
    return Bad("mode", absl::StrCat("'", s, "' is not vericache|full"));
  }
  s = "staggered";
  VC_RETURN_IF_ERROR(GetString(j, "", "schedule", &s));
  if (s == "staggered") {
    c.schedule = SimConfig::Schedule::kStaggered;
  } else if (s == "lock-step") {
    c.schedule = SimConfig::Schedule::kLockStep;
  } else {
    return Bad("schedule", absl::StrCat("'", s, "' is not staggered|lock-step"));
  }

  // Hardware: a profile name, or an object with an optional profile and
  // overrides.
  if (j.contains("hardware")) {
    const json& h = j.at("hardware");
    if (!h.is_string() && !h.is_object())
      return Bad("hardware", "must be a profile name or an object");
    std::string name;
    VC_ASSIGN_OR_RETURN(costmodel::HardwareProfile p,
                        ProfileFrom<costmodel::HardwareProfile>(
                            h, "hardware", &costmodel::FindHardwareProfile, &name));
    if (!name.empty()) {
      c.hbm_bytes = p.hbm_bytes;
      c.hbm_bytes_per_second = p.hbm_bytes_per_second;
      c.host_link_bytes_per_second = p.host_link_bytes_per_second;
      c.fast_link_bytes_per_second = p.fast_link_bytes_per_second;
      c.slow_link_bytes_per_second = p.slow_link_bytes_per_second;
      c.flops = p.flops;
    }
    if (h.is_object()) {
      VC_RETURN_IF_ERROR(
          KnownKeys(h, "hardware",
                    {"profile", "tp", "hbm_gb", "hbm_bw_gbps", "tflops", "host_link_gbps",
                     "fast_link_gbps", "slow_link_gbps", "iteration_overhead_ms"}));
      // A tensor-parallel group of `tp` GPUs acts as one: its memory, memory
      // bandwidth, FLOPs and host links add up (the store links do not).
      int tp = 1;
      VC_RETURN_IF_ERROR(GetInt(h, "hardware", "tp", &tp));
      if (tp < 1 || tp > 64) return Bad("hardware.tp", "must be in [1, 64]");
      c.hbm_bytes *= tp;
      c.hbm_bytes_per_second *= tp;
      c.host_link_bytes_per_second *= tp;
      c.flops *= tp;
      double v = -1;
      const std::pair<const char*, double*> gb[] = {
          {"hbm_gb", &c.hbm_bytes},
          {"hbm_bw_gbps", &c.hbm_bytes_per_second},
          {"host_link_gbps", &c.host_link_bytes_per_second},
          {"fast_link_gbps", &c.fast_link_bytes_per_second},
          {"slow_link_gbps", &c.slow_link_bytes_per_second}};
      for (const auto& [key, field] : gb) {
        v = -1;
        VC_RETURN_IF_ERROR(GetNumber(h, "hardware", key, &v));
        if (h.contains(key)) *field = v * costmodel::kGB;
      }
      if (h.contains("tflops")) {
        VC_RETURN_IF_ERROR(GetNumber(h, "hardware", "tflops", &v));
        c.flops = v * 1e12;
      }
      if (h.contains("iteration_overhead_ms")) {
        VC_RETURN_IF_ERROR(GetNumber(h, "hardware", "iteration_overhead_ms", &v));
        c.iteration_overhead_s = v / 1e3;
      }
    }
  }
  if (j.contains("model")) {
    const json& m = j.at("model");
    if (!m.is_string() && !m.is_object())
      return Bad("model", "must be a profile name or an object");
    std::string name;
    VC_ASSIGN_OR_RETURN(
        costmodel::ModelProfile p,
        ProfileFrom<costmodel::ModelProfile>(m, "model", &costmodel::FindModelProfile, &name));
    if (!name.empty()) {
      c.weight_bytes = p.weight_bytes;
      c.params = p.params;
      c.kv_bytes_per_token = p.kv_bytes_per_token();
    }
    if (m.is_object()) {
      VC_RETURN_IF_ERROR(
          KnownKeys(m, "model", {"profile", "weights_gb", "params_b", "kv_bytes_per_token"}));
      double v = 0;
      if (m.contains("weights_gb")) {
        VC_RETURN_IF_ERROR(GetNumber(m, "model", "weights_gb", &v));
        c.weight_bytes = v * costmodel::kGB;
      }
      if (m.contains("params_b")) {
        VC_RETURN_IF_ERROR(GetNumber(m, "model", "params_b", &v));
        c.params = v * 1e9;
      }
      VC_RETURN_IF_ERROR(GetNumber(m, "model", "kv_bytes_per_token", &c.kv_bytes_per_token));
    }
  }
  if (j.contains("cluster")) {
    const json& k = j.at("cluster");
    VC_RETURN_IF_ERROR(KnownKeys(
        k, "cluster",
        {"gpus", "drafters", "verifiers", "fast_link_shared", "slow_link_shared", "rtt_ms"}));
    VC_RETURN_IF_ERROR(GetInt(k, "cluster", "gpus", &c.gpus));
    VC_RETURN_IF_ERROR(GetInt(k, "cluster", "drafters", &c.drafters));
    VC_RETURN_IF_ERROR(GetInt(k, "cluster", "verifiers", &c.verifiers));
    VC_RETURN_IF_ERROR(GetBool(k, "cluster", "fast_link_shared", &c.fast_link_shared));
    VC_RETURN_IF_ERROR(GetBool(k, "cluster", "slow_link_shared", &c.slow_link_shared));
    double rtt_ms = c.rtt_s * 1e3;
    VC_RETURN_IF_ERROR(GetNumber(k, "cluster", "rtt_ms", &rtt_ms));
    c.rtt_s = rtt_ms / 1e3;
  }
  double prompt_kv_gb = 0;
  if (j.contains("workload")) {
    const json& w = j.at("workload");
    VC_RETURN_IF_ERROR(KnownKeys(
        w, "workload",
        {"requests", "arrival", "prompt_tokens", "output_tokens", "prompt_kv_gb", "grow_kv",
         "startup_transfer", "max_batch", "shared_prefixes", "prefix_sharing"}));
    VC_RETURN_IF_ERROR(GetInt(w, "workload", "requests", &c.requests));
    if (w.contains("arrival")) {
      const json& a = w.at("arrival");
      VC_RETURN_IF_ERROR(KnownKeys(a, "workload.arrival", {"process", "rate", "concurrency"}));
      std::string process = "closed";
      VC_RETURN_IF_ERROR(GetString(a, "workload.arrival", "process", &process));
      if (process == "poisson") {
        c.arrival = SimConfig::Arrival::kPoisson;
      } else if (process == "closed") {
        c.arrival = SimConfig::Arrival::kClosed;
      } else {
        return Bad("workload.arrival.process",
                   absl::StrCat("'", process, "' is not poisson|closed"));
      }
      VC_RETURN_IF_ERROR(GetNumber(a, "workload.arrival", "rate", &c.arrival_rate));
      VC_RETURN_IF_ERROR(GetInt(a, "workload.arrival", "concurrency", &c.concurrency));
    }
    if (w.contains("prompt_tokens")) {
      VC_ASSIGN_OR_RETURN(c.prompt_tokens,
                          ParseDistribution(w.at("prompt_tokens"), "workload.prompt_tokens"));
    }
    if (w.contains("output_tokens")) {
      VC_ASSIGN_OR_RETURN(c.output_tokens,
                          ParseDistribution(w.at("output_tokens"), "workload.output_tokens"));
    }
    VC_RETURN_IF_ERROR(GetNumber(w, "workload", "prompt_kv_gb", &prompt_kv_gb));
    VC_RETURN_IF_ERROR(GetBool(w, "workload", "grow_kv", &c.grow_kv));
    VC_RETURN_IF_ERROR(GetBool(w, "workload", "startup_transfer", &c.startup_transfer));
    VC_RETURN_IF_ERROR(GetInt(w, "workload", "max_batch", &c.max_batch));
    VC_RETURN_IF_ERROR(GetInt(w, "workload", "shared_prefixes", &c.shared_prefixes));
    VC_RETURN_IF_ERROR(GetBool(w, "workload", "prefix_sharing", &c.prefix_sharing));
  }
  if (j.contains("vericache")) {
    const json& v = j.at("vericache");
    VC_RETURN_IF_ERROR(KnownKeys(
        v, "vericache", {"ratio", "draft_len", "continuation", "kv_refresh", "acceptance"}));
    VC_RETURN_IF_ERROR(GetNumber(v, "vericache", "ratio", &c.ratio));
    VC_RETURN_IF_ERROR(GetInt(v, "vericache", "draft_len", &c.draft_len));
    VC_RETURN_IF_ERROR(GetBool(v, "vericache", "continuation", &c.continuation));
    VC_RETURN_IF_ERROR(GetBool(v, "vericache", "kv_refresh", &c.kv_refresh));
    if (v.contains("acceptance")) {
      const json& a = v.at("acceptance");
      VC_RETURN_IF_ERROR(
          KnownKeys(a, "vericache.acceptance", {"model", "p", "gamma", "csv", "draft_len"}));
      std::string model = "per-token";
      VC_RETURN_IF_ERROR(GetString(a, "vericache.acceptance", "model", &model));
      if (model == "per-token") {
        c.acceptance.kind = AcceptanceModel::Kind::kPerToken;
        VC_RETURN_IF_ERROR(GetNumber(a, "vericache.acceptance", "p", &c.acceptance.per_token));
      } else if (model == "fraction") {
        double gamma = -1;
        VC_RETURN_IF_ERROR(GetNumber(a, "vericache.acceptance", "gamma", &gamma));
        if (!(gamma >= 0 && gamma <= 1)) {
          return Bad("vericache.acceptance.gamma", "must be in [0, 1]");
        }
        c.acceptance.kind = AcceptanceModel::Kind::kPerToken;
        c.acceptance.per_token = costmodel::PerTokenFromFraction(gamma, std::max(1, c.draft_len));
      } else if (model == "empirical") {
        std::string csv;
        VC_RETURN_IF_ERROR(GetString(a, "vericache.acceptance", "csv", &csv));
        if (csv.empty())
          return Bad("vericache.acceptance.csv", "is required for the empirical model");
        if (csv[0] != '/' && !base_dir.empty()) csv = base_dir + "/" + csv;
        int len = 0;
        VC_RETURN_IF_ERROR(GetInt(a, "vericache.acceptance", "draft_len", &len));
        VC_ASSIGN_OR_RETURN(c.acceptance, LoadEmpiricalAcceptance(csv, len));
      } else {
        return Bad("vericache.acceptance.model",
                   absl::StrCat("'", model, "' is not per-token|fraction|empirical"));
      }
    }
  }
  if (j.contains("scheduler")) {
    const json& sc = j.at("scheduler");
    VC_RETURN_IF_ERROR(KnownKeys(sc, "scheduler", {"slot_ms", "window_slots", "pack_reloads"}));
    double slot_ms = c.slot_seconds * 1e3;
    VC_RETURN_IF_ERROR(GetNumber(sc, "scheduler", "slot_ms", &slot_ms));
    c.slot_seconds = slot_ms / 1e3;
    VC_RETURN_IF_ERROR(GetInt(sc, "scheduler", "window_slots", &c.window_slots));
    VC_RETURN_IF_ERROR(GetBool(sc, "scheduler", "pack_reloads", &c.pack_reloads));
  }
  VC_RETURN_IF_ERROR(GetInt(j, "", "seed", &c.seed));
  VC_RETURN_IF_ERROR(GetNumber(j, "", "max_sim_seconds", &c.max_sim_seconds));
  VC_RETURN_IF_ERROR(GetInt(j, "", "timeseries_max_points", &c.timeseries_max_points));
  if (prompt_kv_gb > 0) {
    // The prompt's full KV given directly: sets the bytes per token.
    c.kv_bytes_per_token = prompt_kv_gb * costmodel::kGB / c.prompt_tokens.Mean();
  }
  VC_RETURN_IF_ERROR(c.Validate());
  return c;
}

namespace {

json PercentilesJson(const Percentiles& p) {
  return {{"mean", p.mean}, {"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"max", p.max}};
}

const char* TopologyName(SimConfig::Topology t) {
  return t == SimConfig::Topology::kLongContext ? "long-context" : "remote-prefix";
}

}  // namespace

std::string ResultToJson(const SimConfig& c, const SimResult& r) {
  json j;
  j["topology"] = TopologyName(c.topology);
  j["mode"] = c.mode == SimConfig::Mode::kVeriCache ? "vericache" : "full";
  j["schedule"] = c.schedule == SimConfig::Schedule::kStaggered ? "staggered" : "lock-step";
  j["requests"] = r.requests;
  j["output_tokens"] = r.output_tokens;
  j["makespan_s"] = r.makespan_s;
  j["tokens_per_s"] = r.tokens_per_s;
  j["requests_per_s"] = r.requests_per_s;
  j["ttft_s"] = PercentilesJson(r.ttft_s);
  j["tpot_s"] = PercentilesJson(r.tpot_s);
  j["latency_s"] = PercentilesJson(r.latency_s);
  j["verify_stall_s"] = r.verify_stall_s;
  j["booking_wait_s"] = r.booking_wait_s;
  j["verifies"] = r.verifies;
  j["mean_accepted"] = r.mean_accepted;
  j["tokens_per_round"] = r.tokens_per_round;
  j["acceptance_fraction"] = c.mode == SimConfig::Mode::kVeriCache && c.draft_len > 0
                                 ? r.mean_accepted / c.draft_len
                                 : 0.0;
  j["drafted_tokens"] = r.drafted_tokens;
  j["wasted_drafts"] = r.wasted_drafts;
  j["continuation_kept"] = r.continuation_kept;
  j["mean_iteration_s"] = r.mean_iteration_s;
  j["slot_s"] = r.slot_seconds;
  j["lock_step_rounds"] = r.lock_step_rounds;
  j["link_seconds_per_round"] = r.link_seconds_per_round;
  j["scheduler"] = {{"admitted", r.admitted},
                    {"queued", r.queued},
                    {"beyond_window", r.beyond_window},
                    {"max_offset", r.max_offset},
                    {"memory_deferred", r.memory_deferred},
                    {"peak_memory_booked_bytes", r.peak_memory_booked_bytes}};
  j["startup_bytes"] = r.startup_bytes;
  j["reload_bytes"] = r.reload_bytes;
  j["refresh_bytes"] = r.refresh_bytes;
  j["refresh_wait_s"] = r.refresh_wait_s;
  j["startup_wait_s"] = r.startup_wait_s;
  j["prefix_sharing"] = {{"shared_prefixes", c.shared_prefixes},
                         {"sharing", c.shared_prefixes > 0 && c.prefix_sharing},
                         {"joins", r.shared_joins},
                         {"resident_shared", r.shared_resident}};
  j["links"] = json::array();
  for (const LinkReport& l : r.links) {
    j["links"].push_back({{"name", l.name},
                          {"bytes_per_second", l.bytes_per_second},
                          {"bytes", l.bytes},
                          {"busy_s", l.busy_s},
                          {"utilisation", l.utilisation},
                          {"transfers", l.transfers},
                          {"booked_peak_slot_s", l.booked_peak_slot_s},
                          {"overrun_s", l.overrun_s},
                          {"unbooked_s", l.unbooked_s}});
  }
  j["gpus"] = json::array();
  double peak = 0;
  for (const GpuReport& g : r.gpus) {
    peak = std::max(peak, g.peak_hbm_bytes);
    j["gpus"].push_back({{"name", g.name},
                         {"role", g.role},
                         {"iterations", g.iterations},
                         {"busy_s", g.busy_s},
                         {"mean_iteration_s", g.mean_iteration_s},
                         {"peak_hbm_bytes", g.peak_hbm_bytes},
                         {"peak_resident_bytes", g.peak_resident_bytes},
                         {"peak_transient_bytes", g.peak_transient_bytes},
                         {"idle_with_work_s", g.idle_with_work_s}});
  }
  j["peak_hbm_bytes"] = peak;
  return j.dump();
}

std::string TimeseriesCsv(const SimResult& r) {
  std::ostringstream os;
  os << "t_s,active,waiting";
  for (const LinkReport& l : r.links) os << ",link_busy:" << l.name;
  for (const std::string& n : r.scheduler_links) os << ",link_booked:" << n;
  for (const std::string& n : r.scheduler_gpus) os << ",memory_booked:" << n;
  for (const GpuReport& g : r.gpus) os << ",hbm_used:" << g.name;
  for (const GpuReport& g : r.gpus) os << ",transient_gb:" << g.name;
  os << "\n";
  for (const TimeSample& s : r.timeseries) {
    os << s.t << "," << s.active << "," << s.waiting;
    for (double v : s.link_busy) os << "," << v;
    for (double v : s.link_booked) os << "," << v;
    for (double v : s.memory_booked) os << "," << v;
    for (double v : s.hbm_used) os << "," << v;
    for (double v : s.transient_bytes) os << "," << v / 1e9;
    os << "\n";
  }
  return os.str();
}

}  // namespace vc::sim
