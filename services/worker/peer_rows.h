// The worker-to-worker path of a round's exact K/V rows (peer rounds, issue
// 14): after a verify the verifier holds the rows of the accepted tokens in
// a PeerRowsOutbox, served by a data plane server of its own whose slow
// link class is paced like the store's; the drafter fetches them with a
// PeerRowsFetcher when the verifier's Commit names them (CommitRequest.
// refresh_from). The bytes never pass through the coordinator, travel over
// the cluster's data plane (TCP or UCX, mutual TLS when the cluster has
// it) and are paced on the slow link.
//
// The outbox is bounded (entries and bytes), each entry lives only while
// its Commit is in flight (the verifier removes it when the Commit
// returns), and its key is 16 random bytes: a peer that can reach the data
// plane but was not named in a Commit cannot guess one.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "common/transport/data_plane.h"
#include "vericache/v1/worker.pb.h"

namespace vc::worker {

// InvalidArgument, naming --peer-data-advertise, when `listen` (HOST:PORT)
// is a wildcard address (0.0.0.0, ::) and `advertise` is empty: drafters
// could not be told where to connect. Also for a malformed address.
absl::Status CheckPeerDataAddress(const std::string& listen, const std::string& advertise);

struct PeerRowsOutboxOptions {
  // The data plane server the rows are served from: its kind, listen
  // address, TLS and slow-link pacing (the drafter's fetches use the slow
  // link class). Fast-link pacing is unused.
  transport::DataPlaneServerOptions server;
  // HOST:PORT drafters are told to fetch from; empty: the bound address
  // (which must then not be a wildcard such as 0.0.0.0).
  std::string advertise;
  int max_entries = 1024;
  int64_t max_bytes = int64_t{256} << 20;
};

class PeerRowsOutbox {
 public:
  // InvalidArgument for bad options (a wildcard bound address without
  // `advertise`); the server's own errors (Unavailable if it cannot bind).
  static absl::StatusOr<std::unique_ptr<PeerRowsOutbox>> Create(
      const PeerRowsOutboxOptions& options);
  ~PeerRowsOutbox();

  // The address drafters fetch from.
  const std::string& address() const { return address_; }
  // Holds `*rows` (moved out) under a fresh random key (returned) until
  // Remove. ResourceExhausted past max_entries or max_bytes (`*rows` left
  // as it was).
  absl::StatusOr<std::string> Put(std::string* rows);
  void Remove(const std::string& key);
  int entries() const;
  int64_t bytes() const;
  // What the slow link of the server carried.
  transport::LinkStats SlowLinkStats() const;

 private:
  explicit PeerRowsOutbox(const PeerRowsOutboxOptions& options) : options_(options) {}
  absl::StatusOr<std::string> Lookup(const std::string& key) const;

  PeerRowsOutboxOptions options_;
  std::string address_;
  mutable std::mutex mu_;
  std::map<std::string, std::string> rows_;
  int64_t bytes_ = 0;
  // Declared last: destroyed first, so no fetch reads rows_ after it goes.
  std::unique_ptr<transport::DataPlaneServer> server_;
};

struct PeerRowsFetcherOptions {
  std::string kind = "tcp";  // the cluster's data plane
  transport::DataPlaneTlsOptions tls;
  // Verifiers' data planes held open at once (the least recently used
  // beyond is closed).
  int max_peers = 64;
  // Connections to one verifier's data plane held at once: the commits of
  // that many of its sessions fetch in parallel.
  int max_connections_per_peer = 8;
  // Largest rows accepted (checked against PeerRows.bytes before the fetch
  // and by the client on the response).
  int64_t max_bytes = int64_t{64} << 20;
};

class PeerRowsFetcher {
 public:
  explicit PeerRowsFetcher(const PeerRowsFetcherOptions& options) : options_(options) {}
  // The rows `ref` names, exactly ref.bytes() long. InvalidArgument for a
  // malformed reference (no address, no key, a size out of bounds);
  // DataLoss if the fetched value has another size; the data plane's own
  // errors otherwise (NotFound: the verifier no longer holds them).
  absl::StatusOr<std::string> Fetch(const vericache::v1::PeerRows& ref,
                                    std::chrono::steady_clock::time_point deadline);

 private:
  absl::StatusOr<std::shared_ptr<transport::DataPlaneClient>> ClientFor(const std::string& address);

  PeerRowsFetcherOptions options_;
  std::mutex mu_;
  // By address, most recently used first.
  std::list<std::pair<std::string, std::shared_ptr<transport::DataPlaneClient>>> clients_;
};

}  // namespace vc::worker
