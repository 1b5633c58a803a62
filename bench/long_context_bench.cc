// vc_long_context_bench: single-node long-context decoding (DESIGN.md
// sections 1 and 6) with the long-context runtime, four ways in one run:
//
//   full       full-KV decoding; the full KV is resident in the device arena,
//              so only as many requests run at once as their full KV fits
//              (the others wait)
//   lossy      compressed KV only, no verification (a baseline, NOT lossless)
//   staggered  VeriCache: compressed KV resident, full KV in the host tier,
//              copied into the device arena for each verify over a paced
//              link, reloads staggered by the ring scheduler
//   lock-step  VeriCache with every request drafting and verifying on the
//              same rounds (the ablation)
//
// Setup (defaults): stories260K, INT8 compressor, 32 concurrent requests of
// 400-token prompts generating to the end of the 512-token context (EOS
// ignored), draft length 32. Device arena budget = the compressed KV of all
// requests (prompt + generated tail, whole blocks) + the full KV of 2. The
// host-to-device link is paced so that one full-KV copy (at the mean context
// length of the run) takes --copy-iters (4) decode iterations, where a decode
// iteration is measured first in the same run: the median full-KV baseline
// iteration while the most requests it can hold run together.
//
// Prompts are the model's own seeded samples from BOS (--prompt-source
// model), so drafts are made on text like the model's; --prompt-source
// random uses uniform random tokens.
//
// Reported: generated tokens/s of each (ratios to full), copy stall time of
// the two VeriCache schedules (request-seconds ready to verify without the
// full KV, and engine idle time), device high-water vs budget, and whether
// VeriCache's outputs equal the full-KV outputs token for token, with
// PASS/FAIL lines for: staggered >= 1.5x full; staggered > lock-step;
// outputs identical; high-water <= budget. The exit status is 0 unless the
// run itself fails (use the PASS/FAIL lines).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "common/decode/full_decode.h"
#include "common/longctx/long_context_runtime.h"
#include "common/speculative/draft_verify.h"
#include "nlohmann/json.hpp"

#ifndef VC_DEFAULT_MODELS_DIR
#define VC_DEFAULT_MODELS_DIR ""
#endif

namespace vc {
namespace {

struct BenchOptions {
  std::string models_dir;
  std::string model = "stories260K.bin";
  int requests = 32;
  int prompt_len = 400;
  int64_t max_new = 0;  // 0: to the end of the context
  int draft_len = 32;
  std::string compressor = "int8";
  int bits = 0;
  double ratio = 0;
  int full_in_budget = 2;
  double copy_iters = 4;
  int window = 256;
  int threads = 0;
  int queue_depth = 8;
  double slot_ewma = 0.2;
  double rebook_drift = 0.25;
  std::string prompt_source = "model";
  uint64_t seed = 1;
  bool quick = false;
  std::string json;
};

struct ModeResult {
  std::string name;
  LongContextStats stats;
  CopyEngineStats copy;
  std::vector<std::vector<int32_t>> outputs;
  double tokens_per_second = 0;
  double mean_accepted = 0;  // drafts accepted per verify round
  double mean_draft = 0;
  int64_t rounds = 0;
  double median_iteration = 0;  // seconds, over iterations with the most requests in the pass
  int max_pass = 0;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::StatusOr<std::vector<std::vector<int32_t>>> MakePrompts(Engine& engine,
                                                              const BenchOptions& o) {
  const ModelConfig& c = engine.config();
  std::vector<std::vector<int32_t>> prompts;
  if (o.prompt_source == "random") {
    for (int i = 0; i < o.requests; ++i) {
      std::mt19937_64 rng(o.seed * 1000003 + i);
      std::vector<int32_t> p = {c.bos_id};
      while (static_cast<int>(p.size()) < o.prompt_len) {
        p.push_back(3 + static_cast<int32_t>(rng() % (c.vocab_size - 3)));
      }
      prompts.push_back(std::move(p));
    }
    return prompts;
  }
  if (o.prompt_source != "model") {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt-source must be model or random, got '", o.prompt_source, "'"));
  }
  // The model's own text: seeded samples from BOS, all requests batched.
  std::vector<std::unique_ptr<SpeculativeRequest>> gen;
  for (int i = 0; i < o.requests; ++i) {
    RequestOptions ro;
    ro.mode = DecodeMode::kFull;
    ro.max_new_tokens = o.prompt_len - 1;
    ro.ignore_eos = true;
    ro.sampling_mode = SamplingMode::kSeeded;
    ro.sampling.temperature = 1.0f;
    ro.sampling.seed = o.seed * 7919 + static_cast<uint64_t>(i);
    VC_ASSIGN_OR_RETURN(auto r, SpeculativeRequest::Create(engine, {c.bos_id}, ro));
    gen.push_back(std::move(r));
  }
  VC_RETURN_IF_ERROR(RunBatch(engine, gen).status());
  for (const auto& r : gen) {
    std::vector<int32_t> p = {c.bos_id};
    p.insert(p.end(), r->output().begin(), r->output().end());
    prompts.push_back(std::move(p));
  }
  return prompts;
}

absl::StatusOr<ModeResult> RunMode(Engine& engine, const std::string& name, LongContextOptions o,
                                   const std::vector<std::vector<int32_t>>& prompts) {
  o.record_trace = true;
  VC_ASSIGN_OR_RETURN(auto rt, LongContextRuntime::Create(engine, o));
  for (const auto& p : prompts) VC_RETURN_IF_ERROR(rt->Submit(p).status());
  std::fprintf(stderr, "  running %s ...\n", name.c_str());
  VC_RETURN_IF_ERROR(rt->Run());
  ModeResult r;
  r.name = name;
  r.stats = rt->stats();
  r.copy = rt->copy_stats();
  r.tokens_per_second = r.stats.generated_tokens / std::max(1e-9, r.stats.decode_seconds);
  int64_t accepted = 0, drafted = 0;
  for (int i = 0; i < rt->num_requests(); ++i) {
    r.outputs.push_back(rt->output(i));
    const RequestStats& st = rt->request(i).stats();
    for (int a : st.accept_lengths) accepted += a;
    for (int x : st.draft_lengths) drafted += x;
    r.rounds += st.verify_rounds;
  }
  if (r.rounds > 0) {
    r.mean_accepted = static_cast<double>(accepted) / r.rounds;
    r.mean_draft = static_cast<double>(drafted) / std::max<size_t>(1, r.rounds);
  }
  for (const IterationRecord& it : rt->trace())
    r.max_pass = std::max(r.max_pass, it.drafting + it.verifying);
  std::vector<double> full_passes;
  for (const IterationRecord& it : rt->trace()) {
    if (it.drafting + it.verifying == r.max_pass && it.drafting + it.verifying > 0) {
      full_passes.push_back(it.seconds);
    }
  }
  r.median_iteration = Median(full_passes);
  return r;
}

int Identical(const ModeResult& a, const ModeResult& b) {
  int same = 0;
  for (size_t i = 0; i < a.outputs.size() && i < b.outputs.size(); ++i)
    same += a.outputs[i] == b.outputs[i];
  return same;
}

nlohmann::json ToJson(const ModeResult& r, double full_tps) {
  const LongContextStats& s = r.stats;
  return {{"mode", r.name},
          {"tokens_per_second", r.tokens_per_second},
          {"ratio_to_full", r.tokens_per_second / full_tps},
          {"generated_tokens", s.generated_tokens},
          {"decode_seconds", s.decode_seconds},
          {"prefill_seconds", s.prefill_seconds},
          {"forward_seconds", s.forward_seconds},
          {"iterations", s.iterations},
          {"idle_iterations", s.idle_iterations},
          {"max_active", s.max_active},
          {"verifies", s.verifies},
          {"late_verifies", s.late_verifies},
          {"late_verify_slots", s.late_verify_slots},
          {"rebooks", s.rebooks},
          {"reloads", s.reloads},
          {"reload_bytes", s.reload_bytes},
          {"copy_busy_seconds", r.copy.busy_seconds},
          {"request_stall_seconds", s.request_stall_seconds},
          {"engine_idle_seconds", s.engine_idle_seconds},
          {"barrier_seconds", s.barrier_seconds},
          {"admissions_queued", s.admissions_queued},
          {"memory_deferred", s.memory_deferred},
          {"copy_queue_full", s.copy_queue_full},
          {"link_overrun_seconds", s.link_overrun_seconds},
          {"slot_seconds", s.slot_seconds},
          {"device_high_water", s.device_high_water},
          {"device_budget", s.device_budget},
          {"host_kv_bytes_read_in_decode", s.host_kv_bytes_read_in_decode},
          {"mean_accepted_per_round", r.mean_accepted},
          {"rounds", r.rounds}};
}

int Run(int argc, char** argv) {
  BenchOptions o;
  if (const char* env = std::getenv("VC_MODELS_DIR"); env != nullptr && *env != '\0') {
    o.models_dir = env;
  } else {
    o.models_dir = VC_DEFAULT_MODELS_DIR;
  }
  FlagSet flags(
      "vc_long_context_bench",
      "Single-node long-context decoding: full KV vs lossy vs VeriCache (staggered, lock-step) "
      "under one device budget, with paced host-to-device copies.");
  flags.Add("--models-dir", &o.models_dir, "DIR",
            "directory with the test models (default $VC_MODELS_DIR)");
  flags.Add("--model", &o.model, "FILE", "model file inside --models-dir");
  flags.Add("--requests", &o.requests, "N", "concurrent requests");
  flags.Add("--prompt-len", &o.prompt_len, "N", "prompt tokens per request (BOS included)");
  flags.Add("--max-new", &o.max_new, "N", "tokens to generate (0: to the end of the context)");
  flags.Add("--draft-len", &o.draft_len, "X", "VeriCache draft length");
  flags.Add("--compressor", &o.compressor, "NAME",
            "compressor for the drafts and the lossy baseline");
  flags.Add("--bits", &o.bits, "B", "quantiser bits (0: the method's default)");
  flags.Add("--ratio", &o.ratio, "C", "token-dropping ratio (0: not given)");
  flags.Add("--full-in-budget", &o.full_in_budget, "K",
            "device budget = compressed KV of every request + K full KVs");
  flags.Add("--copy-iters", &o.copy_iters, "N",
            "pace the link so one full-KV copy takes N decode iterations (<= 0: unlimited)");
  flags.Add("--window", &o.window, "W", "ring scheduler lookahead window in slots");
  flags.Add("--threads", &o.threads, "N", "engine threads (0: hardware threads)");
  flags.Add("--queue-depth", &o.queue_depth, "N", "copy engine queue depth");
  flags.Add("--slot-ewma", &o.slot_ewma, "W", "weight of the newest iteration time in T_slot");
  flags.Add("--rebook-drift", &o.rebook_drift, "F",
            "re-book reloads not started when T_slot drifts by more than F (<= 0: never)");
  flags.Add("--prompt-source", &o.prompt_source, "SRC",
            "model (the model's own samples) or random");
  flags.Add("--seed", &o.seed, "N", "seed of the prompts");
  flags.AddBool("--quick", &o.quick, "CI smoke run: 8 requests, 128-token prompts, 48 new tokens");
  flags.Add("--json", &o.json, "PATH", "also write the results as JSON to PATH");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(), flags.Help().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  if (o.quick) {
    if (!flags.was_set("--requests")) o.requests = 8;
    if (!flags.was_set("--prompt-len")) o.prompt_len = 128;
    if (!flags.was_set("--max-new")) o.max_new = 48;
    if (!flags.was_set("--draft-len")) o.draft_len = 16;
  }
  const std::string path = o.models_dir + "/" + o.model;
  auto model = Model::Load(path);
  if (!model.ok()) {
    std::fprintf(stderr, "cannot load %s: %s\n", path.c_str(),
                 std::string(model.status().message()).c_str());
    return 1;
  }
  EngineOptions eo;
  eo.backend.threads = o.threads;
  auto engine_or = Engine::Create(**model, eo);
  if (!engine_or.ok()) {
    std::fprintf(stderr, "%s\n", std::string(engine_or.status().message()).c_str());
    return 1;
  }
  Engine& engine = **engine_or;
  const ModelConfig& c = engine.config();
  if (o.max_new <= 0) o.max_new = c.max_seq_len - o.prompt_len;
  if (o.requests < 1 || o.prompt_len < 2 || o.max_new < 1 ||
      o.prompt_len + o.max_new > c.max_seq_len) {
    std::fprintf(stderr, "bad shape: %d requests, prompt %d + %ld new tokens, context %d\n",
                 o.requests, o.prompt_len, static_cast<long>(o.max_new), c.max_seq_len);
    return 2;
  }

  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  };
  std::fprintf(stderr, "making %d prompts (%s) ...\n", o.requests, o.prompt_source.c_str());
  auto prompts = MakePrompts(engine, o);
  if (!prompts.ok()) return fail(prompts.status());

  RequestOptions ro;
  ro.max_new_tokens = o.max_new;
  ro.ignore_eos = true;
  ro.compressor.name = o.compressor;
  ro.compressor.bits = o.bits;
  ro.compressor.ratio = o.ratio;
  ro.draft.draft_len = o.draft_len;
  ro.draft.max_draft_len = std::max(ro.draft.max_draft_len, o.draft_len);
  auto fp = MeasureKvFootprint(engine, (*prompts)[0], ro);
  if (!fp.ok()) return fail(fp.status());
  const int64_t budget =
      o.requests * fp->compressed_resident_bytes + o.full_in_budget * fp->full_kv_bytes;

  LongContextOptions base;
  base.request = ro;
  base.device_budget_bytes = budget;
  base.window_slots = o.window;
  base.copy.queue_depth = o.queue_depth;
  base.slot_ewma_weight = o.slot_ewma;
  base.rebook_drift = o.rebook_drift;

  // 1. Full-KV decoding under the budget; its iterations calibrate the link.
  LongContextOptions full = base;
  full.mode = DecodeMode::kFull;
  auto full_r = RunMode(engine, "full", full, *prompts);
  if (!full_r.ok()) return fail(full_r.status());
  // 2. Lossy.
  LongContextOptions lossy = base;
  lossy.mode = DecodeMode::kLossy;
  auto lossy_r = RunMode(engine, "lossy", lossy, *prompts);
  if (!lossy_r.ok()) return fail(lossy_r.status());

  const double t_iter = full_r->median_iteration;
  const int64_t mean_copy_bytes = (o.prompt_len + o.max_new / 2) * c.kv_bytes_per_token();
  const double bandwidth = o.copy_iters > 0 ? mean_copy_bytes / (o.copy_iters * t_iter) : 0.0;
  // 3. and 4. VeriCache, staggered and lock-step, over the paced link.
  LongContextOptions vc = base;
  vc.mode = DecodeMode::kVeriCache;
  vc.copy.bytes_per_second = bandwidth;
  vc.initial_slot_seconds = std::max(1e-4, lossy_r->median_iteration);
  vc.schedule = LongContextOptions::Schedule::kStaggered;
  auto stag_r = RunMode(engine, "staggered", vc, *prompts);
  if (!stag_r.ok()) return fail(stag_r.status());
  vc.schedule = LongContextOptions::Schedule::kLockStep;
  auto lock_r = RunMode(engine, "lock-step", vc, *prompts);
  if (!lock_r.ok()) return fail(lock_r.status());

  // ---- Report ----
  const double full_tps = full_r->tokens_per_second;
  std::printf(
      "vc_long_context_bench: %s, %d requests x (%d prompt + %ld new tokens), %s prompts, "
      "compressor %s (c = %.3f), draft length %d, %d engine threads\n",
      o.model.c_str(), o.requests, o.prompt_len, static_cast<long>(o.max_new),
      o.prompt_source.c_str(), o.compressor.c_str(), fp->compression_ratio, o.draft_len,
      engine.backend().threads());
  std::printf(
      "device budget: %ld bytes = %d x %ld compressed (prefix %ld + tail) + %d x %ld full KV\n",
      static_cast<long>(budget), o.requests, static_cast<long>(fp->compressed_resident_bytes),
      static_cast<long>(fp->compressed_prefix_bytes), o.full_in_budget,
      static_cast<long>(fp->full_kv_bytes));
  std::printf(
      "decode iteration (full KV, %d requests in the pass, median) = %.2f ms; "
      "draft iteration (lossy, %d requests) = %.2f ms\n",
      full_r->max_pass, 1e3 * t_iter, lossy_r->max_pass, 1e3 * lossy_r->median_iteration);
  if (bandwidth > 0) {
    std::printf(
        "link paced to %.2f MB/s: a %ld-byte full-KV copy takes %.2f ms = %.1f decode iterations\n",
        bandwidth / 1e6, static_cast<long>(mean_copy_bytes), 1e3 * mean_copy_bytes / bandwidth,
        o.copy_iters);
  } else {
    std::printf("link unlimited\n");
  }
  std::printf("\n%-10s %10s %8s %7s %9s %8s %9s %9s %10s %10s %9s\n", "mode", "tok/s", "x full",
              "active", "decode s", "verifies", "accepted", "link busy", "stall req-s", "idle s",
              "hw/budget");
  for (const ModeResult* r : {&*full_r, &*lossy_r, &*stag_r, &*lock_r}) {
    const LongContextStats& s = r->stats;
    std::printf("%-10s %10.1f %8.3f %7d %9.2f %8ld %9.2f %8.0f%% %10.2f %10.2f %9.3f\n",
                r->name.c_str(), r->tokens_per_second, r->tokens_per_second / full_tps,
                s.max_active, s.decode_seconds, static_cast<long>(s.verifies), r->mean_accepted,
                100.0 * r->copy.busy_seconds / std::max(1e-9, s.decode_seconds),
                s.request_stall_seconds, s.engine_idle_seconds,
                static_cast<double>(s.device_high_water) / budget);
  }
  std::printf(
      "(lossy is compressed-KV decoding without verification: NOT lossless, a baseline only)\n");
  for (const ModeResult* r : {&*stag_r, &*lock_r}) {
    const LongContextStats& s = r->stats;
    std::printf(
        "%s: copy stall %.2f request-seconds (engine idle %.2f s), %ld reloads (%.1f MB), "
        "%ld late verifies (%ld slots in all), %ld re-bookings, %ld queued admissions, link "
        "overrun %.3f s, barrier wait %.2f request-seconds, T_slot %.2f ms, host KV read in "
        "decode %ld bytes\n",
        r->name.c_str(), s.request_stall_seconds, s.engine_idle_seconds,
        static_cast<long>(s.reloads), s.reload_bytes / 1e6, static_cast<long>(s.late_verifies),
        static_cast<long>(s.late_verify_slots), static_cast<long>(s.rebooks),
        static_cast<long>(s.admissions_queued), s.link_overrun_seconds, s.barrier_seconds,
        1e3 * s.slot_seconds, static_cast<long>(s.host_kv_bytes_read_in_decode));
  }
  const int same_stag = Identical(*stag_r, *full_r);
  const int same_lock = Identical(*lock_r, *full_r);
  const int same_lossy = Identical(*lossy_r, *full_r);
  std::printf("outputs equal to full-KV: staggered %d/%d, lock-step %d/%d (lossy %d/%d)\n",
              same_stag, o.requests, same_lock, o.requests, same_lossy, o.requests);
  if (bandwidth > 0) {
    // The link's floor: every verify needs one full-KV copy, and the link
    // moves one at a time (DESIGN.md section 6, T_xfer = B*KV_full/(x*BW)).
    std::printf(
        "link floor for VeriCache: %ld reloads, %.1f MB / %.2f MB/s = %.2f s of link time "
        "(full-KV decoding took %.2f s in all); %.1f tokens per verify round\n",
        static_cast<long>(stag_r->stats.reloads), stag_r->copy.bytes / 1e6, bandwidth / 1e6,
        stag_r->copy.bytes / bandwidth, full_r->stats.decode_seconds, stag_r->mean_accepted + 1);
  }

  int64_t max_hw = 0;
  bool hw_ok = true;
  for (const ModeResult* r : {&*full_r, &*lossy_r, &*stag_r, &*lock_r}) {
    max_hw = std::max(max_hw, r->stats.device_high_water);
    hw_ok = hw_ok && r->stats.device_high_water <= budget;
  }
  const double stag_ratio = stag_r->tokens_per_second / full_tps;
  auto line = [](bool ok, const std::string& what) {
    std::printf("%s: %s\n", ok ? "PASS" : "FAIL", what.c_str());
  };
  std::printf("\n");
  line(stag_ratio >= 1.5, absl::StrCat("staggered >= 1.5x full (", stag_ratio, "x)"));
  line(stag_r->tokens_per_second > lock_r->tokens_per_second,
       absl::StrCat("staggered > lock-step (", stag_r->tokens_per_second, " vs ",
                    lock_r->tokens_per_second, " tok/s)"));
  line(same_stag == o.requests && same_lock == o.requests,
       absl::StrCat("outputs identical to full-KV decoding (staggered ", same_stag, "/", o.requests,
                    ", lock-step ", same_lock, "/", o.requests, ")"));
  line(hw_ok, absl::StrCat("device high-water <= budget (", max_hw, " <= ", budget, ")"));

  if (!o.json.empty()) {
    nlohmann::json j;
    j["model"] = o.model;
    j["requests"] = o.requests;
    j["prompt_len"] = o.prompt_len;
    j["max_new"] = o.max_new;
    j["draft_len"] = o.draft_len;
    j["compressor"] = o.compressor;
    j["compression_ratio"] = fp->compression_ratio;
    j["device_budget"] = budget;
    j["decode_iteration_seconds"] = t_iter;
    j["draft_iteration_seconds"] = lossy_r->median_iteration;
    j["link_bytes_per_second"] = bandwidth;
    j["copy_iters"] = o.copy_iters;
    j["modes"] = nlohmann::json::array();
    for (const ModeResult* r : {&*full_r, &*lossy_r, &*stag_r, &*lock_r})
      j["modes"].push_back(ToJson(*r, full_tps));
    j["identical"] = {{"staggered", same_stag}, {"lock_step", same_lock}, {"lossy", same_lossy}};
    std::ofstream(o.json) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace vc

int main(int argc, char** argv) { return vc::Run(argc, argv); }
