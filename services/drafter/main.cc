// `vc-drafter`: the remote pool's worker (DESIGN.md section 7). See
// services/worker/drafter_service.h.
#include "services/worker/worker_main.h"

int main(int argc, char** argv) {
  return vc::worker::RunWorkerMain(vc::worker::Role::kDrafter, argc, argv);
}
