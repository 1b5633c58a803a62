// Shared by the worker services' in-process tests (verifier_open_test,
// peer_round_test): the test model, one-thread engines, and a store client
// that points nowhere (sessions without a stored prefix never fetch).
#pragma once

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "services/common/store_client.h"

namespace vc::worker::testing {

// An engine of `model` on one thread (optionally drafting on `quantized`).
inline absl::StatusOr<std::unique_ptr<Engine>> OneThreadEngine(
    const Model& model, const QuantizedWeights* quantized = nullptr) {
  EngineOptions eo;
  eo.backend.threads = 1;
  eo.quantized = quantized;
  return Engine::Create(model, eo);
}

// Nothing listens there; the data address is given, so Create asks nothing
// of the store.
inline absl::StatusOr<std::unique_ptr<daemon::StoreClient>> NowhereStore() {
  daemon::StoreClientOptions so;
  so.control_address = "127.0.0.1:1";
  so.data_address = "127.0.0.1:1";
  return daemon::StoreClient::Create(so);
}

}  // namespace vc::worker::testing
