// diagnose_test.cpp — the launcher's diagnosis (engine/launch/diagnose.h), a
// pure function: which rank is named, and in what words, from how each rank
// exited and the kind it reported — never from the words of its message.
#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <sys/wait.h>

#include "diagnose.h"
#include "error.h"
#include "failure.h"

namespace ddp {
namespace {

RankExit end(int status, int failed_order, bool stopped, bool completed) {
  RankExit e;
  e.status = status;
  e.failed_order = failed_order;
  e.stopped = stopped;
  e.completed = completed;
  return e;
}
// An exit 0 here is one that said it completed.
RankExit exited(int code, int failed_order = -1) { return end(W_EXITCODE(code, 0), failed_order, false, code == 0); }
RankExit killed(int sig, int failed_order) { return end(sig, failed_order, false, false); }
RankExit stopped() { return end(SIGKILL, -1, true, false); }  // killed by the launcher while it still ran

RankFailure report(ddp_status kind, const std::string& message, int64_t step = -1) {
  RankFailure f;
  f.kind = kind;
  f.message = message;
  f.step = step;
  return f;
}

const std::string kNote = "run.timeout_s = 3";
const std::string kTail = "ddp: stopped the other ranks; run failed\n";

TEST(Diagnose, EveryRankSucceededIsExitZeroAndSilent) {
  const Diagnosis d = diagnose({{exited(0), exited(0)}, false}, {std::nullopt, std::nullopt}, kNote);
  EXPECT_EQ(d.exit_code, 0);
  EXPECT_EQ(d.message, "");
}

TEST(Diagnose, InterruptedIs130) {
  const Diagnosis d = diagnose({{stopped(), stopped()}, true}, {std::nullopt, std::nullopt}, kNote);
  EXPECT_EQ(d.exit_code, 130);
  EXPECT_EQ(d.message, "ddp: interrupted; stopped all ranks\n");
}

// The first peer's echo follows, where the dead rank said nothing: what
// the peer saw (its collective, the strategy's unit).
TEST(Diagnose, ARankKilledByASignalIsNamedOverItsPeersEchoes) {
  // Rank 2 saw the connection drop first; rank 1 was the one killed.
  const WatchResult w{{exited(1, 2), killed(SIGKILL, 1), exited(1, 0)}, false};
  const Diagnosis d = diagnose(w, {report(DDP_ERR_COMM, "on_unit(layers.1, FORWARD_BEGIN): peer went away", 4),
                                   std::nullopt, report(DDP_ERR_COMM, "peer went away", 4)}, kNote);
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_EQ(d.message, "ddp: rank 1 failed: killed by signal 9 (Killed)\n"
                       "ddp: rank 2 reported in step 5: exited with code 1: peer went away\n" + kTail);
  // Without a peer's report (stopped before it said anything), the dead rank alone.
  const Diagnosis alone = diagnose({{stopped(), killed(SIGKILL, 0)}, false}, {std::nullopt, std::nullopt}, kNote);
  EXPECT_EQ(alone.message, "ddp: rank 1 failed: killed by signal 9 (Killed)\n" + kTail);
}

TEST(Diagnose, TimeoutsNameTheRanksThatWereStillRunning) {
  const WatchResult w{{exited(1, 0), exited(1, 1), stopped(), exited(1, 2)}, false};
  const Diagnosis d = diagnose(w, {report(DDP_ERR_TIMEOUT, "recv timed out", 17), report(DDP_ERR_COMM, "reset", 17),
                                   std::nullopt, report(DDP_ERR_TIMEOUT, "recv timed out", 17)}, kNote);
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_EQ(d.message,
            "ddp: rank 2 stopped responding: the other ranks timed out waiting (run.timeout_s = 3)\n"
            "ddp: rank 0 reported in step 18: exited with code 1: recv timed out\n" + kTail);
}

TEST(Diagnose, TheKindDecidesNotTheWords) {
  // A message that reads like a timeout, of kind comm, is the echo; the
  // plain error is the cause. (The old launcher matched "imed out".)
  const WatchResult w{{exited(1, 0), exited(1, 1)}, false};
  const Diagnosis d = diagnose(w, {report(DDP_ERR_COMM, "Timed out: Connection reset by peer"),
                                   report(DDP_ERR_INVALID_ARGUMENT, "run.toml:3:1: unknown key 'run.stpes'")},
                               kNote);
  EXPECT_EQ(d.message, "ddp: rank 1 failed: exited with code 1: run.toml:3:1: unknown key 'run.stpes'\n" + kTail);
}

TEST(Diagnose, OnEqualWeightTheFirstToFailIsNamed) {
  const WatchResult w{{exited(1, 1), exited(1, 0)}, false};
  const Diagnosis d = diagnose(w, {report(DDP_ERR_INTERNAL, "second"), report(DDP_ERR_INTERNAL, "first")}, kNote);
  EXPECT_EQ(d.message, "ddp: rank 1 failed: exited with code 1: first\n" + kTail);
}

TEST(Diagnose, ARankWithoutAReportIsNamedByItsExitCode) {
  const WatchResult w{{exited(0), exited(3, 0)}, false};
  const Diagnosis d = diagnose(w, {std::nullopt, std::nullopt}, kNote);
  EXPECT_EQ(d.message, "ddp: rank 1 failed: exited with code 3\n" + kTail);
}

TEST(Diagnose, ATimeoutWithNobodyStillRunningNamesTheRankThatTimedOut) {
  const WatchResult w{{exited(1, 0), exited(0)}, false};
  const Diagnosis d = diagnose(w, {report(DDP_ERR_TIMEOUT, "store: no answer"), std::nullopt}, kNote);
  EXPECT_EQ(d.message, "ddp: rank 0 failed: exited with code 1: store: no answer\n" + kTail);
}

TEST(Diagnose, FailuresAfterTheLauncherStoppedTheRunAreNotBlamed) {
  // Rank 1 failed first; rank 0 died of the launcher's SIGKILL afterwards.
  const WatchResult w{{stopped(), exited(1, 0)}, false};
  const Diagnosis d = diagnose(w, {std::nullopt, report(DDP_ERR_INTERNAL, "bad data", 2)}, kNote);
  EXPECT_EQ(d.message, "ddp: rank 1 failed in step 3: exited with code 1: bad data\n" + kTail);
}

TEST(Diagnose, ARankThatExitsZeroWithoutCompletingFailedInItsLastStep) {
  RankExit early = end(W_EXITCODE(0, 0), 0, false, false);
  early.last_step = 4;
  const WatchResult w{{exited(0), early}, false};
  EXPECT_TRUE(failed(early));
  EXPECT_FALSE(failed(exited(0)));
  const Diagnosis d = diagnose(w, {std::nullopt, std::nullopt}, kNote);
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_EQ(d.message, "ddp: rank 1 failed in step 5: exited with code 0 before completing its run\n" + kTail);
}

TEST(Diagnose, ACrashReportNamesThePluginBesideTheSignal) {
  const WatchResult w{{killed(SIGSEGV, 0), exited(1, 1)}, false};
  RankFailure crash = report(DDP_ERR_INTERNAL, "strategy plugin 'x' crashed in on_grad_ready", 2);
  const Diagnosis d = diagnose(w, {crash, report(DDP_ERR_COMM, "reset", 2)}, kNote);
  EXPECT_EQ(d.message,
            "ddp: rank 0 failed in step 3: killed by signal 11 (Segmentation fault): strategy plugin 'x' crashed "
            "in on_grad_ready\n" + kTail);
}

// What a rank says on its channel, line by line.
TEST(Channel, StepsFailuresAndCompletionAreHeard) {
  RankExit r;
  hear(r, "step 0");
  hear(r, "step 12");
  hear(r, "step x");  // garbled: ignored
  EXPECT_EQ(r.last_step, 12);
  hear(r, "failure {\"kind\":\"timeout\"}");
  hear(r, "failure {\"kind\":\"comm\"}");  // an echo after the cause
  EXPECT_EQ(r.failure, "{\"kind\":\"timeout\"}");
  EXPECT_FALSE(r.completed);
  hear(r, "completed");
  EXPECT_TRUE(r.completed);
}

// A rank's report carries the Error's kind, plugin, entry and step, through
// the line it sends.
TEST(FailureReport, AnErrorsFieldsRoundTripThroughItsLine) {
  Error e("strategy plugin 'naive': finish: gloo all_reduce (400 bytes): \"timed out\"", DDP_ERR_TIMEOUT);
  e.in_plugin("strategy plugin 'naive'", "finish").at_step(17);
  const std::string json = failure_json(failure_of(e, 2));
  EXPECT_EQ(json.rfind("{\"kind\":\"timeout\",\"rank\":2,\"step\":17,", 0), 0u) << json;
  EXPECT_EQ(json.find('\n'), std::string::npos);
  const std::optional<RankFailure> back = parse_failure(json);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->kind, DDP_ERR_TIMEOUT);
  EXPECT_EQ(back->rank, 2);
  EXPECT_EQ(back->step, 17);
  EXPECT_EQ(back->plugin, "strategy plugin 'naive'");
  EXPECT_EQ(back->entry, "finish");
  EXPECT_EQ(back->message, e.what());
  EXPECT_EQ(back->exit_code, 1) << "as run_rank exits after a report";
  RankFailure exited = failure_of(e, 2);
  exited.exit_code = 3;  // a plugin's exit(3), for mpirun's rank, whose code the launcher cannot see
  EXPECT_EQ(parse_failure(failure_json(exited))->exit_code, 3);
  EXPECT_EQ(parse_failure("{\"rank\": 1}")->exit_code, 1) << "a report without the field";
  EXPECT_EQ(parse_failure("{\"rank\": 1}")->signal, 0);
  EXPECT_EQ(parse_failure("{\"rank\": 1, \"signal\": 11}")->signal, 11) << "as the crash handler writes it";
}

TEST(FailureReport, AnyOtherExceptionIsAnInternalFailureWithItsText) {
  const RankFailure f = failure_of(std::runtime_error("boom"), 0);
  EXPECT_EQ(f.kind, DDP_ERR_INTERNAL);
  EXPECT_EQ(f.step, -1);
  EXPECT_EQ(f.plugin, "");
  EXPECT_EQ(f.message, "boom");
  EXPECT_EQ(failure_of(ConfigError("x.toml:1:1: bad"), 0).kind, DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(failure_of(std::bad_alloc(), 0).kind, DDP_ERR_OUT_OF_MEMORY);
}

TEST(FailureReport, AGarbledLineIsNoReport) {
  EXPECT_FALSE(parse_failure("not json"));
  EXPECT_FALSE(parse_failure("[1, 2]"));
  EXPECT_FALSE(parse_failure("{\"rank\": \"two\"}"));
}

}  // namespace
}  // namespace ddp
