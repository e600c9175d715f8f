// isolated_test.cpp — run_isolated (engine/core/isolated.h): what a child's
// work returned or threw comes back; an exit, a crash or a hang in it is
// named with the plugin entry it was in, within the bound.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "error.h"
#include "isolated.h"
#include "whereabouts.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The message of the Error run_isolated throws for `body`.
std::string failure_of(const std::function<std::string()>& body, std::chrono::milliseconds bound = 5000ms) {
  try {
    ddp::run_isolated("checking", bound, body);
  } catch (const ddp::Error& e) {
    return e.what();
  }
  return "(no failure)";
}

TEST(Isolated, ReturnsWhatTheChildReturned) {
  EXPECT_EQ(ddp::run_isolated("checking", 5000ms, [] { return std::string("a\0b\nc", 5); }), std::string("a\0b\nc", 5));
  EXPECT_EQ(ddp::run_isolated("checking", 5000ms, [] { return std::string(1 << 20, 'x'); }).size(), size_t(1) << 20);
}

TEST(Isolated, RethrowsTheChildsErrorWithItsKind) {
  try {
    ddp::run_isolated("checking", 5000ms, []() -> std::string { throw ddp::ConfigError("x.toml: bad key"); });
    FAIL() << "no error";
  } catch (const ddp::Error& e) {
    EXPECT_STREQ(e.what(), "x.toml: bad key");
    EXPECT_EQ(e.status(), DDP_ERR_INVALID_ARGUMENT);
  }
}

TEST(Isolated, AnExitInAPluginEntryIsNamed) {
  EXPECT_EQ(failure_of([]() -> std::string {
              const ddp::whereabouts::Inside in("strategy plugin '/p/x.so'", "plan");
              std::exit(0);
            }),
            "checking: strategy plugin '/p/x.so' called exit(0) in plan");
  EXPECT_EQ(failure_of([]() -> std::string { std::exit(3); }),
            "checking: the check called exit(3) outside any plugin entry");
}

TEST(Isolated, ACrashInAPluginEntryIsNamed) {
  EXPECT_EQ(failure_of([]() -> std::string {
              const ddp::whereabouts::Inside in("strategy plugin '/p/x.so'", "its constructors (dlopen)");
              raise(SIGSEGV);
              return "";
            }),
            "checking: strategy plugin '/p/x.so' crashed in its constructors (dlopen) (SIGSEGV)");
  EXPECT_EQ(failure_of([]() -> std::string {
              const ddp::whereabouts::Inside in("transport plugin '/p/t.so'", "plan");
              abort();
            }),
            "checking: transport plugin '/p/t.so' crashed in plan (SIGABRT)");
}

TEST(Isolated, AHangEndsWithinTheBoundNamingTheEntry) {
  const auto began = Clock::now();
  EXPECT_EQ(failure_of(
                []() -> std::string {
                  const ddp::whereabouts::Inside in("strategy plugin '/p/x.so'", "plan");
                  for (;;) pause();
                },
                300ms),
            "checking: strategy plugin '/p/x.so' did not return from plan within 0.3 s");
  EXPECT_LT(Clock::now() - began, 3s);
}

TEST(Isolated, AChildThatIgnoresItsTimerIsKilledPastTheBound) {
  const auto began = Clock::now();
  EXPECT_EQ(failure_of(
                []() -> std::string {
                  sigset_t alarm;
                  sigemptyset(&alarm);
                  sigaddset(&alarm, SIGALRM);
                  sigprocmask(SIG_BLOCK, &alarm, nullptr);
                  for (;;) pause();
                },
                200ms),
            "checking: the check did not finish within 0.2 s");
  EXPECT_LT(Clock::now() - began, 5s);
}

TEST(Isolated, ANestedCallIsBoundedByWhatIsLeftOfItsParents) {
  const std::string inner = ddp::run_isolated("outer", 3000ms, [] {
    try {
      ddp::run_isolated("inner", 60000ms, []() -> std::string { for (;;) pause(); });
    } catch (const ddp::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no failure)");
  });
  // 3 s less the second the outer keeps to report, less what has passed.
  const std::string said = "inner: the check did not finish within ";
  ASSERT_EQ(inner.rfind(said, 0), 0u) << inner;
  const double bound_s = std::atof(inner.c_str() + said.size());
  EXPECT_TRUE(bound_s > 1.5 && bound_s <= 2.0) << inner;
}

// What plugin code forks may hold the pipe open after the child sent its
// result and ended: the result counts, and the fork goes with its group.
TEST(Isolated, AResultCountsOnceTheChildEndsWhateverItForked) {
  const auto began = Clock::now();
  EXPECT_EQ(ddp::run_isolated("checking", 5000ms, [] {
              if (fork() == 0) {
                for (;;) pause();
              }
              return std::string("done");
            }),
            "done");
  EXPECT_LT(Clock::now() - began, 3s);
}

// A run of calls into an entry that each return is not an entry that hung.
TEST(Isolated, AnEntryEnteredLateIsNotBlamedForTheBound) {
  const std::string said = failure_of(
      []() -> std::string {
        for (;;) {
          const ddp::whereabouts::Inside in("strategy plugin '/p/x.so'", "plan");
          usleep(1000);
        }
      },
      500ms);
  EXPECT_EQ(said.rfind("checking: the check did not finish within 0.5 s (it was in plan of strategy plugin '/p/x.so', "
                       "entered ", 0),
            0u)
      << said;
}

TEST(Isolated, EndingsWithoutAReport) {
  int killed = 0, exited = 0;
  if (pid_t pid = fork(); pid == 0) {
    raise(SIGKILL);
  } else {
    waitpid(pid, &killed, 0);
  }
  if (pid_t pid = fork(); pid == 0) {
    _exit(7);
  } else {
    waitpid(pid, &exited, 0);
  }
  EXPECT_EQ(ddp::isolated_ending("", killed, false, 30), "the check was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(ddp::isolated_ending("", exited, false, 30), "the check ended (exit code 7) without a result");
  EXPECT_EQ(ddp::isolated_ending("", killed, true, 30), "the check did not finish within 30 s");
  EXPECT_EQ(ddp::isolated_ending("H2400\tstrategy plugin 'a'\tplan", 0, false, 2.5),
            "strategy plugin 'a' did not return from plan within 2.5 s");
  EXPECT_EQ(ddp::isolated_ending("H200\tstrategy plugin 'a'\tplan", 0, false, 2.5),
            "the check did not finish within 2.5 s (it was in plan of strategy plugin 'a', entered 0.2 s before)");
  EXPECT_EQ(ddp::isolated_ending("H-1\t\t", 0, false, 1200), "the check did not finish within 1200 s");
  EXPECT_EQ(ddp::isolated_ending("C7\tstrategy plugin 'a'\t", 0, false, 1), "strategy plugin 'a' crashed (SIGBUS)");
}

}  // namespace
