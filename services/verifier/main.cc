// `vc-verifier`: the local pool's worker (DESIGN.md section 7). See
// services/worker/verifier_service.h.
#include "services/worker/worker_main.h"

int main(int argc, char** argv) {
  return vc::worker::RunWorkerMain(vc::worker::Role::kVerifier, argc, argv);
}
