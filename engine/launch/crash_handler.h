// crash_handler.h — a rank that crashes says where: a fault (SIGSEGV,
// SIGBUS, SIGFPE, SIGILL) or an abort (SIGABRT) is reported as
//   <plugin> crashed in <entry>          (inside plugin code)
//   crashed in the engine                (anywhere else)
// with the step, as a failure report on the rank's channel (or on stderr
// without one), from the faulting thread's whereabouts (core/whereabouts.h);
// then the rank dies of the same signal, so the launcher sees it and names
// the signal too. Everything in the handler is async-signal-safe: fixed
// buffers, write(2), no allocation, no locks.
#pragma once

namespace ddp {

// Installs the handlers for this process (rank `rank`), with an alternate
// signal stack for the calling thread, so that a stack overflow there is
// reported too.
void install_crash_handler(int rank);

}  // namespace ddp
