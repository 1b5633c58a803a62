#include "services/worker/worker_main.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/flags.h"
#include "common/engine/engine.h"
#include "common/kvstore/chunk_key.h"
#include "common/kvstore/kv_cipher.h"
#include "common/kvstore/seal.h"
#include "common/model/model.h"
#include "common/model/quantized_weights.h"
#include "common/rpc/rpc.h"
#include "common/speculative/draft_verify.h"
#include "kernels/kernels.h"
#include "kernels/quantized.h"
#include "services/common/daemon.h"
#include "services/common/store_client.h"
#include "services/worker/drafter_service.h"
#include "services/worker/verifier_service.h"

namespace vc::worker {
namespace {

constexpr char kVersion[] = "0.2.0";

struct Flags {
  daemon::ServerOptions server;
  std::string model;
  std::string kvstore;
  std::string data_plane = "tcp";
  // Data plane mutual TLS (tcp; an authenticated handshake + MACs on ucx):
  // the same files as this daemon's gRPC --tls-cert/--tls-key/--tls-ca;
  // empty = plaintext.
  transport::DataPlaneTlsOptions data_tls;
  // Kernel backend of the engine (kernels::CreateBackend): cpu, or cuda in
  // builds with the CUDA backend.
  std::string backend = "cpu";
  int threads = 0;
  int tensor_parallel = 1;
  int64_t max_batch_tokens = 4096;
  // Tokens of the engine's throwaway pass at start (EngineOptions); 0: none.
  int64_t warmup_tokens = EngineOptions{}.warmup_tokens;
  int max_requests = 256;
  int64_t arena_bytes = int64_t{1} << 30;
  int64_t rpc_timeout_ms = 10000;
  int64_t session_idle_seconds = 120;
  bool prefix_aware = true;     // verifier
  double batch_gather_ms = 2;   // verifier
  int continuation_tokens = 8;  // drafter
  // verifier: the peer data plane the refresh rows of peer rounds wait on
  // (empty: no peer rounds), the address drafters reach it at, and its
  // slow-link pacing (as the store's --slow-link-* flags).
  std::string peer_data_listen = "auto";
  std::string peer_data_advertise;
  double slow_link_bytes_per_second = 0;
  double slow_link_latency_ms = 0;
  std::string seal_key;        // PEM Ed25519 private key: seal what this worker writes
  std::string seal_trust;      // public keys: check the seal of what this worker reads
  std::string kv_secret_file;  // the cluster KV secret: encrypt / decrypt KV at rest
  // drafter: f32, int8 or int4 (kernels::ParseWeightFormat)
  std::string draft_weights = "f32";
  // A separate draft model of the target's vocabulary: the drafter drafts
  // with it, the verifier makes its prefix variants at ingest.
  std::string draft_model;
};

}  // namespace

int RunWorkerMain(Role role, int argc, char** argv) {
  const bool verifier = role == Role::kVerifier;
  const std::string name = verifier ? "vc-verifier" : "vc-drafter";
  Flags f;
  f.server.name = name;
  f.server.version = kVersion;
  f.server.listen = verifier ? "127.0.0.1:7410" : "127.0.0.1:7420";
  FlagSet flags(name, verifier
                          ? "VeriCache verifier worker (local pool): loads full KV over the fast "
                            "link just in time and verifies drafts in one pass."
                          : "VeriCache drafter worker (remote pool): fetches compressed KV over "
                            "the slow link and drafts tokens for many requests at once.");
  flags.Add("--listen", &f.server.listen, "HOST:PORT", "gRPC address (port 0 picks a free one)");
  flags.Add("--model", &f.model, "PATH",
            "model file (llama2.c .bin) or Hugging Face directory (required)");
  flags.Add("--kvstore", &f.kvstore, "HOST:PORT", "vc-kvstore gRPC address (required)");
  flags.Add("--data-plane", &f.data_plane, "tcp|ucx",
            "data plane transport (must match the store)");
  flags.Add("--threads", &f.threads, "N", "compute threads (0 = all cores); never changes results");
  flags.Add("--backend", &f.backend, "cpu|cuda",
            "kernel backend (cuda: in builds with the CUDA backend, every kernel on the GPU; a "
            "parity backend that copies its operands per call, not yet a faster one); never "
            "changes results");
  flags.Add("--tensor-parallel", &f.tensor_parallel, "N",
            "tensor-parallel degree (ranks as threads on the cpu; N GPUs with nccl); must divide "
            "the model's reduction block count and n_kv_heads; never changes results");
  flags.Add("--max-batch-tokens", &f.max_batch_tokens, "N", "largest forward pass in tokens");
  flags.Add("--warmup-tokens", &f.warmup_tokens, "N",
            "tokens of a throwaway forward pass run at start, so that the first request's "
            "passes do not pay for first touches of weights and buffers (0: none; at most the "
            "model's context and --max-batch-tokens); never changes results");
  flags.Add("--max-requests", &f.max_requests, "N", "request sessions held at once");
  flags.Add("--arena-bytes", &f.arena_bytes, "N", "KV bytes this worker may hold");
  daemon::AddTlsFlags(flags, &f.server.tls);
  flags.Add("--metrics-listen", &f.server.metrics_listen, "HOST:PORT",
            "Prometheus /metrics address (empty: off)");
  flags.Add("--rpc-timeout-ms", &f.rpc_timeout_ms, "N", "deadline of calls this worker makes");
  flags.Add("--max-message-bytes", &f.server.max_message_bytes, "N",
            "largest gRPC message sent or received");
  flags.Add("--session-idle-seconds", &f.session_idle_seconds, "N",
            "release sessions untouched this long (their coordinator is gone)");
  if (verifier) {
    flags.AddBool("--prefix-aware", &f.prefix_aware,
                  "verify requests that share a stored prefix with one load "
                  "(--prefix-aware=false disables)");
    flags.Add("--batch-gather-ms", &f.batch_gather_ms, "X",
              "wait this long for more due verifies before a pass");
    flags.Add("--peer-data-listen", &f.peer_data_listen, "auto|off|HOST:PORT",
              "data plane address of peer rounds: drafters fetch the exact K/V rows of each "
              "round here, over the slow link (auto: --listen's host, a free port; port 0 "
              "picks a free one; off: no peer rounds, the coordinator must relay them)");
    flags.Add("--peer-data-advertise", &f.peer_data_advertise, "HOST:PORT",
              "the address drafters reach --peer-data-listen at (default: the bound address; "
              "required when it listens on 0.0.0.0)");
    flags.Add("--slow-link-bytes-per-second", &f.slow_link_bytes_per_second, "N",
              "pace the rows drafters fetch from the peer data plane to this many bytes per "
              "second (the slow link; 0: unpaced), as vc-kvstore paces its fetches");
    flags.Add("--slow-link-latency-ms", &f.slow_link_latency_ms, "X",
              "one-way latency added to each peer data plane response (slow link)");
    flags.Add("--draft-model", &f.draft_model, "PATH",
              "the drafter pool's separate draft model (same vocabulary as --model): loaded "
              "once and used only at ingest, to make the prefix variants from its own prefill "
              "(keyed with its id); verification always runs --model");
  } else {
    flags.Add("--continuation-tokens", &f.continuation_tokens, "N",
              "drafts made ahead while a window is verified (speculative continuation; 0 off)");
    flags.Add("--draft-weights", &f.draft_weights, "f32|int8|int4",
              "draft with a copy of the model whose projection and classifier weights are "
              "quantised at load (int8 per output row, int4 in groups of 32 inputs); drafts "
              "still attend over the compressed KV, and verification stays exact");
    flags.Add("--draft-model", &f.draft_model, "PATH",
              "draft with this separate model (same vocabulary as --model) over its own prefix "
              "variants, which verifiers started with the same --draft-model make at ingest; "
              "no KV refresh (rejected rows roll back, accepted tokens are re-run); "
              "--draft-weights then quantise it");
  }
  flags.Add("--seal-key", &f.seal_key, "FILE",
            "Ed25519 private key (PEM) sealing the KV entries this worker writes "
            "(empty: written unsealed)");
  flags.Add("--seal-trust", &f.seal_trust, "FILE",
            "public keys (64 hex digits a line) whose seals KV entries must carry to be used "
            "(empty: read unchecked)");
  flags.Add("--kv-secret-file", &f.kv_secret_file, "FILE",
            "cluster KV secret (at least 32 bytes, read once at start): encrypt the KV this "
            "worker writes and decrypt what it reads, per tenant (empty: KV in plaintext; "
            "needs mutual TLS and authenticated tenants)");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    return daemon::BadFlags(name, std::string(s.message()));
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (f.model.empty()) return daemon::BadFlags(name, "--model is required");
  if (f.kvstore.empty()) return daemon::BadFlags(name, "--kvstore is required");
  if (f.data_plane != "tcp" && f.data_plane != "ucx") {
    return daemon::BadFlags(name, "--data-plane must be tcp or ucx");
  }
  if (f.threads < 0) return daemon::BadFlags(name, "--threads must be >= 0");
  if (absl::Status s = kernels::CheckBackendName(f.backend); !s.ok()) {
    return daemon::BadFlags(name, absl::StrCat("--backend: ", s.message()));
  }
  if (f.max_batch_tokens < 1) return daemon::BadFlags(name, "--max-batch-tokens must be >= 1");
  if (f.max_requests < 1) return daemon::BadFlags(name, "--max-requests must be >= 1");
  if (f.arena_bytes < 1) return daemon::BadFlags(name, "--arena-bytes must be >= 1");
  if (f.rpc_timeout_ms < 1) return daemon::BadFlags(name, "--rpc-timeout-ms must be >= 1");
  if (f.session_idle_seconds < 1)
    return daemon::BadFlags(name, "--session-idle-seconds must be >= 1");
  if (f.batch_gather_ms < 0) return daemon::BadFlags(name, "--batch-gather-ms must be >= 0");
  if (f.continuation_tokens < 0)
    return daemon::BadFlags(name, "--continuation-tokens must be >= 0");
  if (!(f.slow_link_bytes_per_second >= 0)) {
    return daemon::BadFlags(name, "--slow-link-bytes-per-second must be >= 0");
  }
  if (!(f.slow_link_latency_ms >= 0))
    return daemon::BadFlags(name, "--slow-link-latency-ms must be >= 0");
  if (f.peer_data_listen == "auto") {
    // The interface the daemon serves on, any free port.
    std::string host;
    int port = 0;
    if (absl::Status s = rpc::SplitHostPort("--listen", f.server.listen, &host, &port); !s.ok()) {
      return daemon::BadFlags(name, std::string(s.message()));
    }
    f.peer_data_listen = absl::StrCat(host, ":0");
  } else if (f.peer_data_listen == "off" || f.peer_data_listen.empty()) {
    f.peer_data_listen.clear();
    if (!f.peer_data_advertise.empty()) {
      return daemon::BadFlags(name, "--peer-data-advertise needs --peer-data-listen");
    }
  }
  if (verifier && !f.peer_data_listen.empty()) {
    if (absl::Status s = CheckPeerDataAddress(f.peer_data_listen, f.peer_data_advertise); !s.ok()) {
      return daemon::BadFlags(name, std::string(s.message()));
    }
  }
  // Parsed before the model loads, so a typo costs no load time.
  auto draft_weights = kernels::ParseWeightFormat(f.draft_weights);
  if (!draft_weights.ok()) {
    return daemon::BadFlags(name,
                            absl::StrCat("--draft-weights: ", draft_weights.status().message()));
  }
  // The engine refuses this too, but only after the model has loaded.
  if (*draft_weights != kernels::WeightFormat::kF32 && f.backend != "cpu") {
    return daemon::BadFlags(name, absl::StrCat("--draft-weights ", f.draft_weights,
                                               " needs --backend cpu (quantised drafting runs on "
                                               "the cpu kernels)"));
  }
  if (*draft_weights != kernels::WeightFormat::kF32 && f.tensor_parallel != 1) {
    return daemon::BadFlags(name, "--draft-weights int8/int4 needs --tensor-parallel 1");
  }
  if (absl::Status s = daemon::ValidateServerOptions(f.server); !s.ok()) {
    return daemon::BadFlags(name, std::string(s.message()));
  }
  std::shared_ptr<const kvstore::SealSigner> seal_signer;
  std::shared_ptr<const kvstore::SealTrust> seal_trust;
  if (!f.seal_key.empty()) {
    auto signer = kvstore::SealSigner::FromPemFile(f.seal_key);
    if (!signer.ok()) {
      return daemon::BadFlags(name, absl::StrCat("--seal-key: ", signer.status().message()));
    }
    seal_signer = std::move(*signer);
  }
  if (!f.seal_trust.empty()) {
    auto trust = kvstore::SealTrust::FromFile(f.seal_trust);
    if (!trust.ok()) {
      return daemon::BadFlags(name, absl::StrCat("--seal-trust: ", trust.status().message()));
    }
    seal_trust = std::make_shared<const kvstore::SealTrust>(std::move(*trust));
  }
  std::shared_ptr<const kvstore::KvKeyring> kv_keyring;
  if (!f.kv_secret_file.empty()) {
    // Keys are per tenant, and tenants exist only with authentication: a
    // plaintext, unauthenticated cluster has nothing to keep apart, and
    // anyone could ask this worker to decrypt for any tenant salt.
    if (f.server.tls.cert.empty() || f.server.tls.ca.empty()) {
      return daemon::BadFlags(name,
                              "--kv-secret-file needs mutual TLS (--tls-cert, --tls-key, "
                              "--tls-ca): KV encryption requires authentication");
    }
    auto ring = kvstore::KvKeyring::FromFile(f.kv_secret_file);
    if (!ring.ok()) {
      return daemon::BadFlags(name, absl::StrCat("--kv-secret-file: ", ring.status().message()));
    }
    kv_keyring = std::make_shared<const kvstore::KvKeyring>(std::move(*ring));
  }
  daemon::InstallCrashReporter(argv[0]);
  daemon::BlockDrainSignals();

  auto model = Model::Load(f.model);
  if (!model.ok()) return daemon::Fail(name, model.status().ToString());
  if (absl::Status s = CheckTensorParallel((*model)->config(), f.tensor_parallel); !s.ok()) {
    return daemon::BadFlags(name, std::string(s.message()));
  }
  // The draft model is checked against the target before anything starts:
  // drafts of another vocabulary would be ids the target reads differently.
  std::unique_ptr<Model> draft_model;
  kvstore::ModelId draft_model_id;
  if (!f.draft_model.empty()) {
    auto dm = Model::Load(f.draft_model);
    if (!dm.ok()) {
      return daemon::BadFlags(name, absl::StrCat("--draft-model: ", dm.status().message()));
    }
    if (absl::Status s = CheckDraftVocabulary(**model, **dm); !s.ok()) {
      return daemon::BadFlags(name, absl::StrCat("--draft-model: ", s.message()));
    }
    if (!verifier) {
      if (absl::Status s = CheckTensorParallel((*dm)->config(), f.tensor_parallel); !s.ok()) {
        return daemon::BadFlags(name, absl::StrCat("--draft-model: ", s.message()));
      }
    }
    draft_model_id = kvstore::DraftModelId(**dm);
    draft_model = std::move(dm).value();
    // The id the coordinator's --draft-model-id pins.
    f.server.listening_note = absl::StrCat("draft_model ", draft_model_id.Hex());
  }
  // What this worker's engine runs: a drafter with --draft-model drafts
  // with that model; everything else runs the target.
  const Model& engine_model = !verifier && draft_model ? *draft_model : **model;
  // Bounded here rather than clamped by the engine, so a value that would
  // not be run as given is refused.
  const int64_t max_warmup =
      std::min<int64_t>(engine_model.config().max_seq_len, f.max_batch_tokens);
  if (f.warmup_tokens < 0 || f.warmup_tokens > max_warmup) {
    return daemon::BadFlags(
        name,
        absl::StrCat("--warmup-tokens must be between 0 and ", max_warmup,
                     " (the smaller of the model's context, ", engine_model.config().max_seq_len,
                     ", and --max-batch-tokens, ", f.max_batch_tokens, ")"));
  }
  EngineOptions eo;
  eo.warmup_tokens = f.warmup_tokens;
  eo.backend.name = f.backend;
  eo.backend.threads = f.threads;
  eo.tensor_parallel = f.tensor_parallel;
  eo.max_batch_tokens = f.max_batch_tokens;
  // A drafter with --draft-weights drafts on a quantised copy made here, at
  // load. Its KV layout is the model's, so the store's variants, chunk keys,
  // seals and the numerics version it reports stay the target's: drafting
  // never has to be exact, only verification (on the f32 model) does.
  std::unique_ptr<QuantizedWeights> quantized;
  if (*draft_weights != kernels::WeightFormat::kF32) {
    QuantizeOptions qo;
    qo.format = *draft_weights;
    auto q = QuantizedWeights::Create(engine_model, qo);
    if (!q.ok()) return daemon::Fail(name, q.status().ToString());
    quantized = std::move(q).value();
    eo.quantized = quantized.get();
  }
  auto engine = Engine::Create(engine_model, eo);
  if (!engine.ok()) return daemon::Fail(name, engine.status().ToString());
  if (f.backend != "cpu") {  // says which device, in the daemon's log
    std::fprintf(stderr, "%s: kernel backend %s\n", name.c_str(),
                 (*engine)->backend().name().c_str());
  }
  // The verifier's draft engine makes ingest variants only, one at a time
  // on the batch thread, so it needs no tensor parallelism.
  std::unique_ptr<Engine> draft_engine;
  if (verifier && draft_model) {
    EngineOptions deo = eo;
    deo.tensor_parallel = 1;
    auto de = Engine::Create(*draft_model, deo);
    if (!de.ok()) return daemon::Fail(name, de.status().ToString());
    draft_engine = std::move(de).value();
  }
  const kvstore::ModelId model_id = kvstore::ComputeModelId(**model);

  daemon::StoreClientOptions so;
  so.control_address = f.kvstore;
  so.data_plane = f.data_plane;
  f.data_tls = {f.server.tls.cert, f.server.tls.key, f.server.tls.ca};
  so.data_tls = f.data_tls;
  so.link = verifier ? transport::LinkClass::kFast : transport::LinkClass::kSlow;
  so.timeout = std::chrono::milliseconds(f.rpc_timeout_ms);
  so.max_message_bytes = static_cast<int>(f.server.max_message_bytes);
  // Entries are sealed for, and checked against, this worker's model and
  // numerics version (the same ones its chunk keys hash).
  so.seal_signer = seal_signer;
  so.seal_trust = seal_trust;
  so.kv_keyring = kv_keyring;
  so.seal_context.model_id = model_id;
  so.seal_context.numerics_version = NumericsVersionFor((*model)->config());
  so.tls = f.server.tls;  // mutual TLS towards the store with this worker's certificate
  // Declared before the store client, which counts its retries in it.
  metrics::Registry registry;
  so.metrics = &registry;
  auto store = daemon::StoreClient::Create(so);
  if (!store.ok()) return daemon::Fail(name, store.status().ToString());

  std::unique_ptr<PeerRowsOutbox> peer_rows;
  if (verifier && !f.peer_data_listen.empty()) {
    PeerRowsOutboxOptions po;
    po.server.kind = f.data_plane;
    po.server.listen = f.peer_data_listen;
    po.server.tls = f.data_tls;
    po.server.slow.bytes_per_second = f.slow_link_bytes_per_second;
    po.server.slow.latency_seconds = f.slow_link_latency_ms / 1000;
    po.advertise = f.peer_data_advertise;
    auto box = PeerRowsOutbox::Create(po);
    if (!box.ok()) {
      if (box.status().code() == absl::StatusCode::kInvalidArgument) {
        return daemon::BadFlags(name, std::string(box.status().message()));
      }
      return daemon::Fail(name, absl::StrCat("peer data plane: ", box.status().ToString()));
    }
    peer_rows = std::move(box).value();
    // Launchers read it (vericache local pins the port across restarts).
    absl::StrAppend(&f.server.listening_note, f.server.listening_note.empty() ? "" : " ",
                    "peer_data ", peer_rows->address());
  }
  std::unique_ptr<VerifierService> verifier_service;
  std::unique_ptr<DrafterService> drafter_service;
  grpc::Service* service = nullptr;
  if (verifier) {
    VerifierOptions vo;
    vo.max_sessions = f.max_requests;
    vo.prefix_aware = f.prefix_aware;
    vo.arena_bytes = f.arena_bytes;
    vo.gather = std::chrono::microseconds(static_cast<int64_t>(f.batch_gather_ms * 1000));
    vo.session_idle = std::chrono::seconds(f.session_idle_seconds);
    vo.data_plane = f.data_plane;
    vo.draft_engine = draft_engine.get();
    vo.draft_model_id = draft_model_id;
    vo.peer_rows = peer_rows.get();
    vo.peer_tls = f.server.tls;  // this worker's certificate towards drafters
    vo.peer_max_message_bytes = static_cast<int>(f.server.max_message_bytes);
    vo.peer_timeout = std::chrono::milliseconds(f.rpc_timeout_ms);
    verifier_service =
        std::make_unique<VerifierService>(engine->get(), model_id, store->get(), &registry, vo);
    service = verifier_service.get();
  } else {
    DrafterOptions dopt;
    dopt.max_sessions = f.max_requests;
    dopt.continuation_tokens = f.continuation_tokens;
    dopt.arena_bytes = f.arena_bytes;
    dopt.session_idle = std::chrono::seconds(f.session_idle_seconds);
    dopt.data_plane = f.data_plane;
    dopt.peer_rows.kind = f.data_plane;
    dopt.peer_rows.tls = f.data_tls;
    if (draft_model) {
      dopt.target_config = &(*model)->config();
      dopt.draft_model_id = draft_model_id;
    }
    drafter_service =
        std::make_unique<DrafterService>(engine->get(), model_id, store->get(), &registry, dopt);
    service = drafter_service.get();
  }
  auto server = daemon::Server::Start(f.server, {service}, &registry);
  if (!server.ok()) return daemon::Fail(name, server.status().ToString());
  return (*server)->WaitForSignalAndDrain([&] {
    if (verifier_service) verifier_service->Shutdown();
    if (drafter_service) drafter_service->Shutdown();
  });
}

}  // namespace vc::worker
