// Shared by the cluster suites that look at what the store holds: the raw
// chunk keys of a prompt (as the coordinator keys them) and one entry read
// back over the store's control plane.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/kvstore/chunk_key.h"
#include "common/rpc/rpc.h"
#include "gtest/gtest.h"
#include "vericache/v1/kvstore.grpc.pb.h"

namespace vc::clustertest {

// The raw chunk keys of `tokens` under `model_id` and `tenant_salt` (empty
// when authentication is off).
inline std::vector<std::string> RawChunkKeys(const kvstore::ModelId& model_id,
                                             const std::vector<int32_t>& tokens, int chunk_tokens,
                                             const std::string& tenant_salt = "") {
  kvstore::ChunkKeyOptions ko;
  ko.chunk_tokens = chunk_tokens;
  ko.tenant_salt = tenant_salt;
  auto keys = kvstore::ChunkKeysForTokens(ko, model_id, tokens);
  EXPECT_TRUE(keys.ok()) << keys.status();
  std::vector<std::string> raw;
  if (!keys.ok()) return raw;
  for (const auto& k : *keys) raw.push_back(k.Raw());
  return raw;
}

// The stored bytes under `key` (empty, with a test failure, if Get fails).
inline std::string GetStoreEntry(::vericache::v1::KvStore::Stub& store, const std::string& key) {
  ::vericache::v1::GetRequest req;
  req.set_key(key);
  ::vericache::v1::GetResponse resp;
  auto ctx = rpc::ContextWithTimeout(std::chrono::seconds(10));
  const grpc::Status s = store.Get(ctx.get(), req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.value();
}

}  // namespace vc::clustertest
