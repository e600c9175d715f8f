// isolated.h — third-party code the launcher must run, run where it cannot
// take the launcher down or make it lie.
//
// Before any rank starts, the launcher runs plugin code: the constructors
// dlopen runs, a descriptor it reads, a plan entry (`ddp run`'s fit check
// and its search for a setting that fits, `ddp plan`, `ddp plugins`,
// `ddp bench-comm`'s transport check). run_isolated runs such work in a
// child process (fork, no exec) bounded in time, and hands back what it
// returned, or the Error it threw (message and kind), or why it ended
// otherwise, named with the plugin entry it was in (whereabouts::Inside):
//   "<what>: <plugin> called exit(0) in <entry>"
//   "<what>: <plugin> crashed in <entry> (SIGSEGV)"
//   "<what>: <plugin> did not return from <entry> within 30 s"
//   "<what>: the check did not finish within 30 s (it was in <entry> of
//    <plugin>, entered 0.2 s before)"   (an entry called again and again)
//   "<what>: the check was killed by signal 9 (SIGKILL)"
// A call inside an isolated child is bounded by what is left of its
// parent's bound, less a second for the parent to report.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace ddp {

// Runs `body` in a child process and returns its result. Throws Error: the
// one `body` threw (its message and kind), or one naming `what` (where not
// empty) and how the child ended (an exit, a crash, no end within `bound`).
std::string run_isolated(const std::string& what, std::chrono::milliseconds bound,
                         const std::function<std::string()>& body);

// What is left of the bound of the isolated child this runs in (less the
// second it keeps to report); the maximum outside one.
std::chrono::milliseconds isolated_time_left();

// How a child ended, from what it reported and its wait status, as the
// sentence run_isolated's Error gives after "<what>: ". `report` is the
// child's last record ("X<code>", "C<signal>", "H<ms in its entry, or -1>";
// each then "\t<plugin>\t<entry>"; "" for none); `timed_out`: the parent killed it
// past its bound. Pure.
std::string isolated_ending(const std::string& report, int wait_status, bool timed_out, double bound_s);

}  // namespace ddp
