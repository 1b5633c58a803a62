#include "common/base/stop_signals.h"

#include <pthread.h>

namespace vc {

sigset_t BlockSignals(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (const int sig : signals) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int WaitForSignal(const sigset_t& set) {
  int sig = 0;
  // sigwait fails only for an invalid set (EINVAL); a retry costs nothing.
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

}  // namespace vc
