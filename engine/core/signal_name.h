// signal_name.h — a signal's name as messages give it ("SIGSEGV"), for the
// crash handler, isolated checks and the BLAS probe's stop signals.
// Async-signal-safe.
#pragma once

#include <csignal>

namespace ddp {

inline const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    case SIGSYS: return "SIGSYS";
    case SIGTRAP: return "SIGTRAP";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
  }
  return "a signal";
}

}  // namespace ddp
