#include "services/worker/peer_rows.h"

#include <openssl/rand.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/rpc/rpc.h"

namespace vc::worker {

namespace pb = ::vericache::v1;

namespace {

constexpr size_t kKeyBytes = 16;

bool IsWildcardHost(const std::string& host) {
  return host == "0.0.0.0" || host == "::" || host == "[::]" || host == "*";
}

}  // namespace

absl::Status CheckPeerDataAddress(const std::string& listen, const std::string& advertise) {
  std::string host;
  int port = 0;
  VC_RETURN_IF_ERROR(rpc::SplitHostPort("--peer-data-listen", listen, &host, &port));
  if (!advertise.empty()) {
    return rpc::SplitHostPort("--peer-data-advertise", advertise, &host, &port);
  }
  if (IsWildcardHost(host)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the peer data plane listens on ", listen,
                     ", which drafters cannot connect to: give the address they should use "
                     "(--peer-data-advertise HOST:PORT)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PeerRowsOutbox>> PeerRowsOutbox::Create(
    const PeerRowsOutboxOptions& options) {
  if (options.max_entries < 1) {
    return absl::InvalidArgumentError("peer rows: max_entries must be >= 1");
  }
  if (options.max_bytes < 1) return absl::InvalidArgumentError("peer rows: max_bytes must be >= 1");
  VC_RETURN_IF_ERROR(CheckPeerDataAddress(options.server.listen, options.advertise));
  std::unique_ptr<PeerRowsOutbox> box(new PeerRowsOutbox(options));
  PeerRowsOutbox* self = box.get();
  // Only fetches: a stage has nowhere to go.
  auto server = transport::DataPlaneServer::Create(
      options.server, [self](const std::string& key) { return self->Lookup(key); });
  if (!server.ok()) return server.status();
  box->server_ = std::move(server).value();
  box->address_ = options.advertise.empty() ? box->server_->address() : options.advertise;
  return box;
}

PeerRowsOutbox::~PeerRowsOutbox() { server_.reset(); }

absl::StatusOr<std::string> PeerRowsOutbox::Put(std::string* rows) {
  unsigned char raw[kKeyBytes];
  if (RAND_bytes(raw, sizeof(raw)) != 1) return absl::InternalError("peer rows: no randomness");
  std::string key(reinterpret_cast<const char*>(raw), sizeof(raw));
  std::lock_guard<std::mutex> lock(mu_);
  const auto size = static_cast<int64_t>(rows->size());
  if (static_cast<int>(rows_.size()) >= options_.max_entries ||
      bytes_ + size > options_.max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("peer rows: the outbox is full (", rows_.size(), " entries, ", bytes_,
                     " bytes; at most ", options_.max_entries, " and ", options_.max_bytes, ")"));
  }
  bytes_ += size;
  rows_.emplace(key, std::move(*rows));
  return key;
}

void PeerRowsOutbox::Remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rows_.find(key);
  if (it == rows_.end()) return;
  bytes_ -= static_cast<int64_t>(it->second.size());
  rows_.erase(it);
}

int PeerRowsOutbox::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(rows_.size());
}

int64_t PeerRowsOutbox::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

transport::LinkStats PeerRowsOutbox::SlowLinkStats() const {
  return server_->Stats(transport::LinkClass::kSlow);
}

absl::StatusOr<std::string> PeerRowsOutbox::Lookup(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rows_.find(key);
  if (it == rows_.end()) {
    return absl::NotFoundError("no such peer rows (their commit is over, or the key is wrong)");
  }
  return it->second;
}

absl::StatusOr<std::string> PeerRowsFetcher::Fetch(const pb::PeerRows& ref,
                                                   std::chrono::steady_clock::time_point deadline) {
  if (ref.data_plane().empty())
    return absl::InvalidArgumentError("peer rows: no data plane address");
  if (ref.key().size() != kKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer rows: the key is ", ref.key().size(), " bytes, not ", kKeyBytes));
  }
  if (ref.bytes() < 1 || ref.bytes() > options_.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer rows: ", ref.bytes(), " bytes is outside [1, ", options_.max_bytes, "]"));
  }
  VC_ASSIGN_OR_RETURN(std::shared_ptr<transport::DataPlaneClient> client,
                      ClientFor(ref.data_plane()));
  VC_ASSIGN_OR_RETURN(std::vector<std::string> values, client->Fetch({ref.key()}, deadline));
  if (values.size() != 1 || static_cast<int64_t>(values[0].size()) != ref.bytes()) {
    return absl::DataLossError(absl::StrCat("peer rows from ", ref.data_plane(), ": got ",
                                            values.empty() ? 0 : values[0].size(),
                                            " bytes, the commit said ", ref.bytes()));
  }
  return std::move(values[0]);
}

absl::StatusOr<std::shared_ptr<transport::DataPlaneClient>> PeerRowsFetcher::ClientFor(
    const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = clients_.begin(); it != clients_.end(); ++it) {
    if (it->first == address) {
      clients_.splice(clients_.begin(), clients_, it);
      return clients_.front().second;
    }
  }
  transport::DataPlaneClientOptions o;
  o.kind = options_.kind;
  o.server_address = address;
  o.link = transport::LinkClass::kSlow;
  o.max_response_bytes = options_.max_bytes;
  o.max_connections = options_.max_connections_per_peer;
  o.tls = options_.tls;
  auto client = transport::DataPlaneClient::Create(o);
  if (!client.ok()) return client.status();
  clients_.emplace_front(address, std::shared_ptr<transport::DataPlaneClient>(std::move(*client)));
  while (static_cast<int>(clients_.size()) > options_.max_peers) clients_.pop_back();
  return clients_.front().second;
}

}  // namespace vc::worker
