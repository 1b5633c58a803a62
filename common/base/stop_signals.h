// Waiting for the signals that stop a process (SIGTERM, SIGINT, ...) with
// sigwait, as every long-running binary here does: the daemons, `vericache
// local` and the gateway block them before any thread starts (so that no
// thread is killed by one) and then wait for them on one thread.
#pragma once

#include <signal.h>

#include <initializer_list>

namespace vc {

// Blocks `signals` in the calling thread, and so in every thread it starts
// afterwards; returns their set.
sigset_t BlockSignals(std::initializer_list<int> signals);

// Waits until one of `set` (blocked in every thread) arrives; returns it.
int WaitForSignal(const sigset_t& set);

}  // namespace vc
