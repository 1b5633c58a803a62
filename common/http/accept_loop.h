// Starts a bound cpp-httplib server's accept loop on its own thread and
// returns once the loop runs: httplib's stop() is a no-op until then, so a
// server handed out earlier could not be stopped. Shared by the /metrics
// endpoint and the OpenAI gateway.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace vc::http {

// `server` must be bound (bind_to_port / bind_to_any_port) and outlive
// `*thread`. Internal naming `who` if the loop exited at start (`*thread` is
// joined then).
template <typename Server>
[[nodiscard]] absl::Status StartAcceptLoop(Server& server, std::thread* thread,
                                           const char* who) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  *thread = std::thread([&server, done] {
    server.listen_after_bind();
    done->store(true);
  });
  while (!server.is_running() && !done->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server.is_running()) {
    thread->join();
    return absl::InternalError(absl::StrCat(who, ": the HTTP accept loop exited at start"));
  }
  return absl::OkStatus();
}

}  // namespace vc::http
