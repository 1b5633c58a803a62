// `vericache client generate|status` and `vericache ingest`: talk to a
// running cluster through vc-coordinator's public API.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/base/flags.h"
#include "common/rpc/rpc.h"
#include "nlohmann/json.hpp"
#include "services/vericache/commands.h"
#include "vericache/v1/coordinator.grpc.pb.h"

namespace vc::cli {
namespace {

namespace pb = ::vericache::v1;

absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& flag, const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, absl::ByAnyChar(" ,\t\n"), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(flag + ": '" + std::string(piece) +
                                        "' is not an integer token id");
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<pb::Mode> ParseClusterMode(const std::string& mode) {
  if (mode == "vericache") return pb::MODE_VERICACHE;
  if (mode == "full_remote") return pb::MODE_FULL_REMOTE;
  if (mode == "full_local") return pb::MODE_FULL_LOCAL;
  if (mode == "lossy_remote") return pb::MODE_LOSSY_REMOTE;
  return absl::InvalidArgumentError("--mode must be vericache, full_remote, full_local or "
                                    "lossy_remote, got '" + mode + "'");
}

// How a command reaches the coordinator: address, TLS CA, API key. An
// endpoints file (vericache local --endpoints-file) supplies all three;
// explicit flags and VERICACHE_API_KEY take precedence over it.
struct AccessFlags {
  std::string coordinator = "127.0.0.1:7430";
  std::string api_key;
  std::string tls_ca;
  std::string tls_server_name;
  std::string endpoints_file;
  std::string tenant = "tenant-a";
};

void AddAccessFlags(FlagSet& flags, AccessFlags* a) {
  flags.Add("--coordinator", &a->coordinator, "HOST:PORT", "vc-coordinator address");
  flags.Add("--api-key", &a->api_key, "KEY",
            "API key sent as 'authorization: Bearer KEY' (default: $VERICACHE_API_KEY)");
  flags.Add("--tls-ca", &a->tls_ca, "PATH",
            "CA certificate of the coordinator's TLS port (empty: plaintext)");
  flags.Add("--tls-server-name", &a->tls_server_name, "NAME",
            "name the coordinator's certificate carries when it differs from the --coordinator "
            "host (e.g. its Service name through kubectl port-forward)");
  flags.Add("--endpoints-file", &a->endpoints_file, "PATH",
            "take the coordinator, its CA and an API key from a 'vericache local "
            "--endpoints-file' file");
  flags.Add("--tenant", &a->tenant, "NAME", "whose API key to take from --endpoints-file");
}

absl::StatusOr<rpc::ClientConfig> ResolveAccess(const FlagSet& flags, const AccessFlags& a) {
  rpc::ClientConfig c(a.coordinator);
  if (!a.endpoints_file.empty()) {
    std::ifstream in(a.endpoints_file);
    if (!in) return absl::InvalidArgumentError("--endpoints-file " + a.endpoints_file + ": cannot read");
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError("--endpoints-file " + a.endpoints_file + ": not a JSON object");
    }
    if (j.contains("coordinator") && j["coordinator"].is_string()) {
      c.address = j["coordinator"].get<std::string>();
    }
    if (j.contains("tls_ca") && j["tls_ca"].is_string()) c.tls.ca = j["tls_ca"].get<std::string>();
    if (j.contains("api_keys") && j["api_keys"].is_object() && j["api_keys"].contains(a.tenant) &&
        j["api_keys"][a.tenant].is_string()) {
      c.api_key = j["api_keys"][a.tenant].get<std::string>();
    } else if (j.contains("api_keys")) {
      return absl::InvalidArgumentError("--endpoints-file has no API key of tenant '" + a.tenant + "'");
    }
  }
  if (flags.was_set("--coordinator")) c.address = a.coordinator;
  if (flags.was_set("--tls-ca")) c.tls.ca = a.tls_ca;
  c.tls.server_name = a.tls_server_name;
  if (const char* env = std::getenv("VERICACHE_API_KEY"); env != nullptr && *env != '\0') {
    c.api_key = env;
  }
  if (flags.was_set("--api-key")) c.api_key = a.api_key;
  if (absl::Status s = rpc::ValidateTlsFiles(c.tls, /*need_identity=*/false); !s.ok()) return s;
  return c;
}

struct ClientFlags {
  AccessFlags access;
  std::string prompt_ids;
  std::string prefix_id;
  std::string suffix_ids;
  int64_t max_new_tokens = 64;
  bool ignore_eos = false;
  std::string mode = "vericache";
  std::string compressor;
  double ratio = 0;
  int bits = 0;
  int draft_len = 0;
  std::string sampling;
  float temperature = 0;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  std::string tenant_salt;
  int64_t deadline_ms = 120000;
  std::string request_id;
  bool json = false;
  bool stream = false;
  bool online_update = false;
};

int RunClientGenerate(int argc, char** argv) {
  const std::string cmd = "client generate";
  ClientFlags f;
  FlagSet flags("vericache client generate",
                "Generate through a running cluster's coordinator (same request flags as\n"
                "'vericache generate'; --mode takes the cluster modes).");
  AddAccessFlags(flags, &f.access);
  flags.Add("--prompt-ids", &f.prompt_ids, "\"ID ID ...\"", "prompt as token ids");
  flags.Add("--prefix-id", &f.prefix_id, "HEX", "a registered prefix (vericache ingest) ...");
  flags.Add("--suffix-ids", &f.suffix_ids, "\"ID ID ...\"", "... followed by these token ids");
  flags.Add("--max-new-tokens", &f.max_new_tokens, "N", "tokens to generate at most");
  flags.AddBool("--ignore-eos", &f.ignore_eos, "do not stop at EOS");
  flags.Add("--mode", &f.mode, "MODE",
            "vericache | full_remote | full_local | lossy_remote (lossy_remote is a baseline, "
            "NOT lossless)");
  flags.Add("--compressor", &f.compressor, "NAME",
            "drafter's KV compressor (default: the coordinator's first --ingest-variants entry)");
  flags.Add("--ratio", &f.ratio, "C", "token-dropping compression ratio c in (0, 1]");
  flags.Add("--bits", &f.bits, "B", "quantiser bits (2, 4 or 8)");
  flags.Add("--draft-len", &f.draft_len, "X", "drafts per verify round (0: the coordinator's)");
  flags.AddBool("--online-update", &f.online_update,
                "vericache/lossy_remote: fold accepted tokens into the drafter's compressed KV by "
                "the compressor's online rule (see 'vericache compressors'), so its view stays "
                "near the budget instead of keeping every generated token exact");
  flags.Add("--sampling", &f.sampling, "MODE",
            "greedy | seeded (default: greedy, or seeded with --temperature > 0)");
  flags.Add("--temperature", &f.temperature, "T", "sampling temperature");
  flags.Add("--top-k", &f.top_k, "K", "top-k filter when sampling (0 = all)");
  flags.Add("--top-p", &f.top_p, "P", "nucleus filter when sampling (1 = off)");
  flags.Add("--seed", &f.seed, "S", "sampling seed");
  flags.Add("--tenant-salt", &f.tenant_salt, "TEXT",
            "tenant salt of the KV keys (only without authentication; the coordinator derives "
            "it from the API key otherwise)");
  flags.Add("--deadline-ms", &f.deadline_ms, "N", "give up after N ms");
  flags.Add("--request-id", &f.request_id, "ID", "request id (for cancel/status)");
  flags.AddBool("--json", &f.json, "print one JSON object on stdout");
  flags.AddBool("--stream", &f.stream, "print tokens as they are verified (text mode)");
  if (absl::Status s = flags.Parse(argc, argv, 3); !s.ok()) return Fail(cmd, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  absl::StatusOr<rpc::ClientConfig> access = ResolveAccess(flags, f.access);
  if (!access.ok()) return Fail(cmd, access.status());
  pb::GenerateRequest req;
  if (f.prompt_ids.empty() == f.prefix_id.empty()) {
    return BadInput(cmd, "give exactly one of --prompt-ids or --prefix-id");
  }
  if (!f.prompt_ids.empty()) {
    auto ids = ParseIdList("--prompt-ids", f.prompt_ids);
    if (!ids.ok()) return Fail(cmd, ids.status());
    for (int32_t id : *ids) req.add_prompt_ids(id);
  } else {
    req.set_prefix_id(f.prefix_id);
    auto ids = ParseIdList("--suffix-ids", f.suffix_ids);
    if (!ids.ok()) return Fail(cmd, ids.status());
    for (int32_t id : *ids) req.add_suffix_ids(id);
  }
  auto mode = ParseClusterMode(f.mode);
  if (!mode.ok()) return Fail(cmd, mode.status());
  req.set_mode(*mode);
  if (f.max_new_tokens < 1) return BadInput(cmd, "--max-new-tokens must be >= 1");
  if (f.deadline_ms < 1) return BadInput(cmd, "--deadline-ms must be >= 1");
  req.set_max_new_tokens(f.max_new_tokens);
  req.set_ignore_eos(f.ignore_eos);
  req.set_compressor(f.compressor);
  if (flags.was_set("--ratio") && !(f.ratio > 0 && f.ratio <= 1)) {
    return BadInput(cmd, "--ratio must be in (0, 1]");
  }
  req.set_ratio(f.ratio);
  req.set_bits(f.bits);
  req.set_draft_len(f.draft_len);
  // The coordinator validates the mode and the compressor's online rule.
  req.set_online_update(f.online_update);
  const std::string sampling =
      f.sampling.empty() ? (f.temperature > 0 ? "seeded" : "greedy") : f.sampling;
  if (sampling == "greedy") {
    if (f.temperature > 0 || flags.was_set("--top-k") || flags.was_set("--top-p") ||
        flags.was_set("--seed")) {
      return BadInput(cmd, "--temperature/--top-k/--top-p/--seed need --sampling seeded");
    }
    req.mutable_sampling()->set_mode(pb::SamplingConfig::GREEDY);
  } else if (sampling == "seeded") {
    if (!(f.temperature > 0)) return BadInput(cmd, "--sampling seeded needs --temperature > 0");
    req.mutable_sampling()->set_mode(pb::SamplingConfig::SEEDED);
  } else if (sampling == "rejection") {
    req.mutable_sampling()->set_mode(pb::SamplingConfig::REJECTION);
  } else {
    return BadInput(cmd, "--sampling must be greedy or seeded, got '" + sampling + "'");
  }
  req.mutable_sampling()->set_temperature(f.temperature);
  req.mutable_sampling()->set_top_k(f.top_k);
  req.mutable_sampling()->set_top_p(f.top_p);
  req.mutable_sampling()->set_seed(f.seed);
  req.set_tenant_salt(f.tenant_salt);
  req.set_request_id(f.request_id);
  req.set_deadline_ms(f.deadline_ms);

  auto stub = pb::Coordinator::NewStub(rpc::MakeChannel(*access, 64 << 20));
  auto ctx = rpc::ContextWithTimeout(*access, std::chrono::milliseconds(f.deadline_ms + 5000));
  const auto t0 = std::chrono::steady_clock::now();
  auto reader = stub->Generate(ctx.get(), req);
  pb::GenerateResponse msg;
  pb::GenerateTotals totals;
  std::vector<int32_t> accepts;
  bool got_final = false;
  double first_ms = -1;
  while (reader->Read(&msg)) {
    if (first_ms < 0 && msg.tokens_size() > 0) {
      first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    if (msg.has_round() && msg.round().drafted() > 0) accepts.push_back(msg.round().accepted());
    if (f.stream && !f.json) {
      for (int32_t t : msg.tokens()) std::printf("%d ", t);
      std::fflush(stdout);
    }
    if (msg.final()) {
      totals = msg.totals();
      got_final = true;
    }
  }
  const grpc::Status s = reader->Finish();
  if (!s.ok()) return Fail(cmd, rpc::FromGrpcStatus(s, "coordinator " + access->address));
  if (!got_final) return Fail(cmd, absl::InternalError("the stream ended without a final message"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<int32_t> tokens(totals.tokens().begin(), totals.tokens().end());
  const double mean_accept =
      accepts.empty() ? 0.0 : std::accumulate(accepts.begin(), accepts.end(), 0.0) / accepts.size();
  if (f.json) {
    nlohmann::json j;
    j["mode"] = f.mode;
    j["tokens"] = tokens;
    j["tokens_per_s"] = seconds > 0 ? tokens.size() / seconds : 0.0;
    j["seconds"] = seconds;
    j["ttft_ms"] = totals.ttft_ms();
    j["client_ttft_ms"] = first_ms;
    j["stopped_at_eos"] = totals.stopped_at_eos();
    j["prefix_tokens"] = totals.prefix_tokens();
    j["ingested"] = totals.ingested();
    if (f.mode != "full_local") {
      j["compressor"] = totals.compressor();
      j["compression_ratio"] = totals.compression_ratio();
    }
    if (f.mode == "vericache" || f.mode == "lossy_remote") {
      j["online_update"] = f.online_update;
      j["online_folds"] = totals.online_folds();
      j["drafter_kv_bytes_peak"] = totals.drafter_kv_peak_bytes();
    }
    if (f.mode == "lossy_remote") j["lossy"] = true;
    if (f.mode == "vericache") {
      j["accept_lengths"] = accepts;
      j["mean_accepted"] = mean_accept;
      j["verify_rounds"] = totals.verify_rounds();
      j["drafted_tokens"] = totals.drafted_tokens();
      j["wasted_drafts"] = totals.drafted_tokens() - totals.accepted_drafts();
      j["fallbacks"] = totals.fallbacks();
      j["continuation_hits"] = totals.continuation_hits();
      // The pool's separate draft model (first 16 hex digits of its id), or
      // null when the drafters run the target; with one, no refresh bytes.
      j["draft_model"] = totals.draft_model().empty() ? nlohmann::json(nullptr)
                                                      : nlohmann::json(totals.draft_model());
      j["refresh_bytes"] = totals.refresh_bytes();
    }
    j["verifier"] = totals.verifier();
    j["drafter"] = totals.drafter();
    std::cout << j.dump() << std::endl;
  } else {
    if (!f.stream) {
      for (int32_t t : tokens) std::printf("%d ", t);
    }
    std::printf("\n");
    std::fprintf(stderr, "[%s: %zu tokens in %.2f s, TTFT %.1f ms%s]\n", f.mode.c_str(),
                 tokens.size(), seconds, totals.ttft_ms(),
                 f.mode == "lossy_remote" ? "; LOSSY (unverified)" : "");
  }
  return kExitOk;
}

int RunClientStatus(int argc, char** argv) {
  const std::string cmd = "client status";
  AccessFlags a;
  FlagSet flags("vericache client status", "Print the cluster's status as JSON.");
  AddAccessFlags(flags, &a);
  if (absl::Status s = flags.Parse(argc, argv, 3); !s.ok()) return Fail(cmd, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  absl::StatusOr<rpc::ClientConfig> access = ResolveAccess(flags, a);
  if (!access.ok()) return Fail(cmd, access.status());
  const std::string& coordinator = access->address;
  auto stub = pb::Coordinator::NewStub(rpc::MakeChannel(*access, 64 << 20));
  auto ctx = rpc::ContextWithTimeout(*access, std::chrono::milliseconds(10000));
  pb::ClusterStatusRequest req;
  pb::ClusterStatusResponse resp;
  const grpc::Status s = stub->ClusterStatus(ctx.get(), req, &resp);
  if (!s.ok()) return Fail(cmd, rpc::FromGrpcStatus(s, "coordinator " + coordinator));
  nlohmann::json j;
  j["model_id"] = resp.model_id();
  j["active_requests"] = resp.active_requests();
  j["queued_requests"] = resp.queued_requests();
  j["completed_requests"] = resp.completed_requests();
  j["slot_seconds"] = resp.slot_seconds();
  j["lock_step"] = resp.lock_step();
  j["workers"] = nlohmann::json::array();
  for (const auto& w : resp.workers()) {
    j["workers"].push_back({{"address", w.address()}, {"role", w.role()}, {"healthy", w.healthy()},
                            {"sessions", w.sessions()}, {"kv_bytes", w.kv_bytes()}});
  }
  std::cout << j.dump() << std::endl;
  return kExitOk;
}

}  // namespace

int RunClient(int argc, char** argv) {
  if (argc < 3 || std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h") {
    std::fputs("usage: vericache client generate|status [flags]   (--help on each)\n",
               argc < 3 ? stderr : stdout);
    return argc < 3 ? kExitBadInput : kExitOk;
  }
  const std::string sub = argv[2];
  if (sub == "generate") return RunClientGenerate(argc, argv);
  if (sub == "status") return RunClientStatus(argc, argv);
  return BadInput("client", "unknown subcommand '" + sub + "' (generate, status)");
}

int RunPrefix(int argc, char** argv) {
  const std::string cmd = "prefix";
  if (argc < 3 || std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h") {
    std::fputs("usage: vericache prefix pin|unpin|delete --prefix-id HEX [--coordinator HOST:PORT]\n"
               "  [--api-key KEY] [--tls-ca PATH] [--endpoints-file PATH]\n"
               "  [--variants LIST] [--tenant-salt TEXT]: pin, unpin or delete a registered prefix\n"
               "  (its chunks, its stored variants and its manifest) in the cluster's store\n",
               argc < 3 ? stderr : stdout);
    return argc < 3 ? kExitBadInput : kExitOk;
  }
  const std::string sub = argv[2];
  pb::ManagePrefixRequest req;
  if (sub == "pin") {
    req.set_action(pb::ManagePrefixRequest::PIN);
  } else if (sub == "unpin") {
    req.set_action(pb::ManagePrefixRequest::UNPIN);
  } else if (sub == "delete") {
    req.set_action(pb::ManagePrefixRequest::DELETE);
  } else {
    return BadInput(cmd, "unknown subcommand '" + sub + "' (pin, unpin, delete)");
  }
  AccessFlags a;
  std::string prefix_id, variants, tenant_salt;
  FlagSet flags("vericache prefix " + sub, "Pin, unpin or delete a registered prefix.");
  AddAccessFlags(flags, &a);
  flags.Add("--prefix-id", &prefix_id, "HEX", "the prefix (from vericache ingest; required)");
  flags.Add("--variants", &variants, "LIST", "its compressed variants (default: the coordinator's)");
  flags.Add("--tenant-salt", &tenant_salt, "TEXT", "tenant salt it was registered with");
  if (absl::Status s = flags.Parse(argc, argv, 3); !s.ok()) return Fail(cmd, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (prefix_id.empty()) return BadInput(cmd, "--prefix-id is required");
  absl::StatusOr<rpc::ClientConfig> access = ResolveAccess(flags, a);
  if (!access.ok()) return Fail(cmd, access.status());
  const std::string& coordinator = access->address;
  req.set_prefix_id(prefix_id);
  req.set_variants(variants);
  req.set_tenant_salt(tenant_salt);
  auto stub = pb::Coordinator::NewStub(rpc::MakeChannel(*access, 64 << 20));
  auto ctx = rpc::ContextWithTimeout(*access, std::chrono::milliseconds(30000));
  pb::ManagePrefixResponse resp;
  const grpc::Status s = stub->ManagePrefix(ctx.get(), req, &resp);
  if (!s.ok()) return Fail(cmd, rpc::FromGrpcStatus(s, "coordinator " + coordinator));
  std::printf("%s: %d store entries\n", sub.c_str(), resp.entries());
  return kExitOk;
}

int RunIngest(int argc, char** argv) {
  const std::string cmd = "ingest";
  AccessFlags a;
  std::string prompt_ids;
  std::string variants;
  std::string tenant_salt;
  bool json = false;
  FlagSet flags("vericache ingest",
                "Register a prefix: the cluster prefills it once, stores its full KV and its\n"
                "compressed variants, and answers a prefix id for 'client generate --prefix-id'.");
  AddAccessFlags(flags, &a);
  flags.Add("--prompt-ids", &prompt_ids, "\"ID ID ...\"", "the prefix's token ids (required)");
  flags.Add("--variants", &variants, "LIST",
            "compressed variants, e.g. snapkv:0.25,kivi:4 (default: the coordinator's)");
  flags.Add("--tenant-salt", &tenant_salt, "TEXT", "tenant salt of the KV keys");
  flags.AddBool("--json", &json, "print one JSON object on stdout");
  if (absl::Status s = flags.Parse(argc, argv, 2); !s.ok()) return Fail(cmd, s);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (prompt_ids.empty()) return BadInput(cmd, "--prompt-ids is required");
  auto ids = ParseIdList("--prompt-ids", prompt_ids);
  if (!ids.ok()) return Fail(cmd, ids.status());
  absl::StatusOr<rpc::ClientConfig> access = ResolveAccess(flags, a);
  if (!access.ok()) return Fail(cmd, access.status());
  const std::string& coordinator = access->address;
  pb::RegisterPrefixRequest req;
  for (int32_t id : *ids) req.add_tokens(id);
  req.set_variants(variants);
  req.set_tenant_salt(tenant_salt);
  auto stub = pb::Coordinator::NewStub(rpc::MakeChannel(*access, 64 << 20));
  auto ctx = rpc::ContextWithTimeout(*access, std::chrono::milliseconds(120000));
  pb::RegisterPrefixResponse resp;
  const grpc::Status s = stub->RegisterPrefix(ctx.get(), req, &resp);
  if (!s.ok()) return Fail(cmd, rpc::FromGrpcStatus(s, "coordinator " + coordinator));
  if (json) {
    nlohmann::json j;
    j["prefix_id"] = resp.prefix_id();
    j["prefix_tokens"] = resp.prefix_tokens();
    j["already_stored"] = resp.already_stored();
    j["variants"] = nlohmann::json::array();
    for (const auto& v : resp.variants()) {
      j["variants"].push_back({{"description", v.description()},
                               {"target_ratio", v.target_ratio()},
                               {"achieved_ratio", v.achieved_ratio()},
                               {"bytes", v.bytes()}});
    }
    std::cout << j.dump() << std::endl;
  } else {
    std::printf("%s\n", resp.prefix_id().c_str());
    std::fprintf(stderr, "[%d tokens stored in whole chunks%s]\n", resp.prefix_tokens(),
                 resp.already_stored() ? ", already stored" : "");
  }
  return kExitOk;
}

}  // namespace vc::cli
