// main() of vc-verifier and vc-drafter: flags, model loading, the KV store
// client, the role's service, and the daemon scaffolding.
#pragma once

namespace vc::worker {

enum class Role { kVerifier, kDrafter };

// Exit codes: 0 ok (drained), 1 runtime failure, 2 bad flags.
int RunWorkerMain(Role role, int argc, char** argv);

}  // namespace vc::worker
