// transport_helper_test.cpp — the transport authors' helper,
// plugins/include/ddp/transport.hpp, on a fake host: the error path (fail,
// and a job's failure text and status), the argument checks with their exact
// refusals, and launch_job's contract (run once, or only released when
// cancelled or refused). No engine and no transport: the header alone.
// Also the checks on a group's communicator (its size given) and of split's
// request (ABI 1.9).
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ddp/transport.hpp>

namespace {

using namespace std::chrono_literals;
namespace dp = ddp::plugin;

// A ddp_host with what the helper calls: set_error (kept, and counted) and
// launch_host_func (queued, run by run_next, or refused with `refuse`).
struct FakeHost {
  explicit FakeHost(int world_size = 4) {
    host.ctx = this;
    host.world_size = world_size;
    host.timeout_ms = 1000;
    host.set_error = [](void* ctx, const char* message) {
      auto* self = static_cast<FakeHost*>(ctx);
      self->error = message;
      ++self->errors_set;
    };
    host.launch_host_func = [](void* ctx, ddp_stream, ddp_host_func fn, void* user) {
      auto* self = static_cast<FakeHost*>(ctx);
      if (self->refuse != DDP_OK) {
        self->error = "launch refused";
        return self->refuse;
      }
      self->queued.emplace_back(fn, user);
      return DDP_OK;
    };
  }
  FakeHost(const FakeHost&) = delete;
  FakeHost& operator=(const FakeHost&) = delete;

  const ddp_host* get() const { return &host; }
  // Runs the oldest queued job as the stream's executor would.
  ddp_status run_next(bool cancelled = false) {
    auto [fn, user] = queued.front();
    queued.erase(queued.begin());
    return fn(user, cancelled ? 1 : 0);
  }

  ddp_host host{};
  std::string error;
  int errors_set = 0;
  ddp_status refuse = DDP_OK;
  std::vector<std::pair<ddp_host_func, void*>> queued;
};

ddp_buffer floats(void* ptr, size_t count) { return ddp_buffer{ptr, count, DDP_FLOAT32, DDP_DEVICE_CPU}; }

// ---------------------------------------------------------------- error path

TEST(TransportHelperFail, SetsTheTextAndReturnsTheStatus) {
  FakeHost h;
  EXPECT_EQ(dp::fail(h.get(), DDP_ERR_COMM, "peer 3 went away"), DDP_ERR_COMM);
  EXPECT_EQ(h.error, "peer 3 went away");
  EXPECT_EQ(h.errors_set, 1);
}

TEST(TransportHelperNames, BytesDescribeAndDeviceName) {
  float x[4] = {};
  EXPECT_EQ(dp::bytes_of(floats(x, 1024)), 4096u);
  EXPECT_EQ(dp::bytes_of(ddp_buffer{x, 3, DDP_BFLOAT16, DDP_DEVICE_CPU}), 6u);
  EXPECT_EQ(dp::bytes_of(ddp_buffer{x, 3, static_cast<ddp_dtype>(7), DDP_DEVICE_CPU}), 0u);
  EXPECT_EQ(dp::describe("all_reduce", floats(x, 1024)), "all_reduce (4096 bytes)");
  EXPECT_EQ(dp::describe("broadcast", ddp_buffer{x, 2, DDP_FLOAT64, DDP_DEVICE_CUDA}), "broadcast (16 bytes)");
  EXPECT_EQ(dp::device_name(DDP_DEVICE_CPU), "cpu");
  EXPECT_EQ(dp::device_name(DDP_DEVICE_CUDA), "cuda");
  EXPECT_EQ(dp::device_name(7), "device 7");
}

// ------------------------------------------------------------ argument checks

TEST(TransportHelperCheckBuffer, NullArgumentIsRefusedBeforeTheTransportsRules) {
  FakeHost h;
  int own_calls = 0;
  auto own = [&](const ddp_buffer&) {
    ++own_calls;
    return DDP_OK;
  };
  EXPECT_EQ(dp::check_buffer(h.get(), nullptr, "all_reduce", own), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, "all_reduce: NULL buffer");
  EXPECT_EQ(own_calls, 0);
  EXPECT_EQ(dp::null_buffer(h.get(), "all_gather"), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, "all_gather: NULL buffer");
}

TEST(TransportHelperCheckBuffer, TransportsRulesComeBeforeTheNullPointer) {
  FakeHost h;
  const ddp_buffer no_data = floats(nullptr, 4);
  auto gpu_only = [&](const ddp_buffer& b) {
    return b.device == DDP_DEVICE_CUDA ? DDP_OK : dp::fail(h.get(), DDP_ERR_UNSUPPORTED, "broadcast: not on the GPU");
  };
  EXPECT_EQ(dp::check_buffer(h.get(), &no_data, "broadcast", gpu_only), DDP_ERR_UNSUPPORTED);
  EXPECT_EQ(h.error, "broadcast: not on the GPU");
  EXPECT_EQ(dp::check_buffer(h.get(), &no_data, "broadcast"), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, "broadcast: NULL buffer");
}

TEST(TransportHelperCheckBuffer, EmptyBufferMayHaveNoDataAndValidOnesPass) {
  FakeHost h;
  float x[2] = {};
  const ddp_buffer empty = floats(nullptr, 0), valid = floats(x, 2);
  EXPECT_EQ(dp::check_buffer(h.get(), &empty, "all_reduce"), DDP_OK);
  EXPECT_EQ(dp::check_buffer(h.get(), &valid, "all_reduce"), DDP_OK);
  EXPECT_EQ(h.errors_set, 0);
}

TEST(TransportHelperCheckRoot, ARankOfTheWorld) {
  FakeHost h(/*world_size=*/2);
  EXPECT_EQ(dp::check_root(h.get(), 0), DDP_OK);
  EXPECT_EQ(dp::check_root(h.get(), 1), DDP_OK);
  EXPECT_EQ(h.errors_set, 0);
  EXPECT_EQ(dp::check_root(h.get(), 2), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, "broadcast: root 2 out of range");
  EXPECT_EQ(dp::check_root(h.get(), -1), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, "broadcast: root -1 out of range");
}

TEST(TransportHelperShapes, AllGatherRecvHoldsWorldTimesSend) {
  FakeHost h(/*world_size=*/4);
  float x[16] = {};
  const std::string refusal = "all_gather: recv must hold send.count * world_size elements of send's dtype";
  EXPECT_EQ(dp::check_all_gather(h.get(), floats(x, 2), floats(x, 8)), DDP_OK);
  EXPECT_EQ(dp::check_all_gather(h.get(), floats(x, 0), floats(x, 0)), DDP_OK);
  EXPECT_EQ(h.errors_set, 0);
  EXPECT_EQ(dp::check_all_gather(h.get(), floats(x, 2), floats(x, 7)), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, refusal);
  h.error.clear();
  EXPECT_EQ(dp::check_all_gather(h.get(), floats(x, 4), floats(x, 4)), DDP_ERR_INVALID_ARGUMENT);  // reduce_scatter's
  EXPECT_EQ(h.error, refusal);
  h.error.clear();
  const ddp_buffer doubles{x, 8, DDP_FLOAT64, DDP_DEVICE_CPU};
  EXPECT_EQ(dp::check_all_gather(h.get(), floats(x, 2), doubles), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, refusal);

  FakeHost alone(/*world_size=*/1);
  EXPECT_EQ(dp::check_all_gather(alone.get(), floats(x, 3), floats(x, 3)), DDP_OK);
}

TEST(TransportHelperShapes, ReduceScatterSendHoldsWorldTimesRecv) {
  FakeHost h(/*world_size=*/3);
  float x[16] = {};
  const std::string refusal = "reduce_scatter: send must hold recv.count * world_size elements of recv's dtype";
  EXPECT_EQ(dp::check_reduce_scatter(h.get(), floats(x, 12), floats(x, 4)), DDP_OK);
  EXPECT_EQ(h.errors_set, 0);
  EXPECT_EQ(dp::check_reduce_scatter(h.get(), floats(x, 4), floats(x, 12)), DDP_ERR_INVALID_ARGUMENT);  // all_gather's
  EXPECT_EQ(h.error, refusal);
  h.error.clear();
  EXPECT_EQ(dp::check_reduce_scatter(h.get(), floats(x, 13), floats(x, 4)), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, refusal);
  h.error.clear();
  const ddp_buffer ints{x, 4, DDP_INT32, DDP_DEVICE_CPU};
  EXPECT_EQ(dp::check_reduce_scatter(h.get(), floats(x, 12), ints), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, refusal);
}

// ------------------------------------------------------------------ groups

// The overloads that take a communicator's size (a group's, ABI 1.9): its
// ranks bound the root and set the counts; at the world's size they word
// a refusal as the world's overloads do.
TEST(TransportHelperGroupSize, RootAndCountsAreTheGroupsAndTheWordsSayWhichSize) {
  FakeHost h(/*world_size=*/4);
  float x[16] = {};
  EXPECT_EQ(dp::check_root(h.get(), 1, 2), DDP_OK);
  EXPECT_EQ(dp::check_all_gather(h.get(), floats(x, 3), floats(x, 6), 2), DDP_OK);
  EXPECT_EQ(dp::check_reduce_scatter(h.get(), floats(x, 6), floats(x, 3), 2), DDP_OK);
  EXPECT_EQ(dp::check_all_gather(h.get(), floats(x, 3), floats(x, 3), 1), DDP_OK);
  EXPECT_EQ(h.errors_set, 0);

  EXPECT_EQ(dp::check_root(h.get(), 2, 2), DDP_ERR_INVALID_ARGUMENT);  // a rank of the world, not of the group
  EXPECT_EQ(h.error, "broadcast: root 2 out of range (a group of 2 ranks)");
  EXPECT_EQ(dp::check_root(h.get(), 1, 1), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, "broadcast: root 1 out of range (a group of 1 rank)");
  EXPECT_EQ(dp::check_all_gather(h.get(), floats(x, 3), floats(x, 12), 2), DDP_ERR_INVALID_ARGUMENT);  // the world's
  EXPECT_EQ(h.error, "all_gather: recv must hold send.count * the group's size (2) elements of send's dtype");
  EXPECT_EQ(dp::check_reduce_scatter(h.get(), floats(x, 12), floats(x, 3), 2), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, "reduce_scatter: send must hold recv.count * the group's size (2) elements of recv's dtype");
  const ddp_buffer doubles{x, 6, DDP_FLOAT64, DDP_DEVICE_CPU};
  EXPECT_EQ(dp::check_all_gather(h.get(), floats(x, 3), doubles, 2), DDP_ERR_INVALID_ARGUMENT);

  // At the world's size, the world's words, as the old overloads have them.
  EXPECT_EQ(dp::check_root(h.get(), 4, 4), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, "broadcast: root 4 out of range");
  EXPECT_EQ(dp::check_all_gather(h.get(), floats(x, 2), floats(x, 7), 4), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, "all_gather: recv must hold send.count * world_size elements of send's dtype");
  EXPECT_EQ(dp::check_reduce_scatter(h.get(), floats(x, 7), floats(x, 2), 4), DDP_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h.error, "reduce_scatter: send must hold recv.count * world_size elements of recv's dtype");
}

ddp_split request(int color, int rank, int size, const char* tag) {
  ddp_split how{};
  how.struct_size = sizeof(ddp_split);
  how.color = color;
  how.key = 0;
  how.rank = rank;
  how.size = size;
  how.tag = tag;
  return how;
}

TEST(TransportHelperSplit, RefusesWhatNoGroupCanBe) {
  FakeHost h(/*world_size=*/4);
  ddp_split good = request(3, 1, 2, "ddp.group.1.3");
  EXPECT_EQ(dp::check_split(h.get(), &good, 4, "mine"), DDP_OK);
  ddp_split alone = request(0, 0, 1, "t");
  EXPECT_EQ(dp::check_split(h.get(), &alone, 1, "mine"), DDP_OK);
  ddp_split whole = request(0, 3, 4, "t");
  EXPECT_EQ(dp::check_split(h.get(), &whole, 4, "mine"), DDP_OK);
  EXPECT_EQ(h.errors_set, 0);

  const std::string limits = ": a group has 1 to the parent's ranks, and its rank is below its size";
  auto refused = [&](const ddp_split* how, int parent, const std::string& text) {
    h.error.clear();
    EXPECT_EQ(dp::check_split(h.get(), how, parent, "mine"), DDP_ERR_INVALID_ARGUMENT) << text;
    EXPECT_EQ(h.error, "mine split: " + text);
  };
  refused(nullptr, 4, "NULL request");
  ddp_split how = request(-2, 0, 1, "t");
  refused(&how, 4, "color -2 is negative");
  how = request(0, 2, 2, "t");
  refused(&how, 4, "rank 2 of a group of 2 ranks, from a parent of 4" + limits);
  how = request(0, -1, 2, "t");
  refused(&how, 4, "rank -1 of a group of 2 ranks, from a parent of 4" + limits);
  how = request(0, 0, 0, "t");
  refused(&how, 4, "rank 0 of a group of 0 ranks, from a parent of 4" + limits);
  how = request(0, 0, 3, "t");
  refused(&how, 2, "rank 0 of a group of 3 ranks, from a parent of 2" + limits);  // a nested split's parent
  how = request(0, 0, 1, "");
  refused(&how, 4, "no tag (the group's name in the rendezvous)");
  how = request(0, 0, 1, nullptr);
  refused(&how, 4, "no tag (the group's name in the rendezvous)");
  how = request(0, 0, 1, "t");
  how.struct_size = offsetof(ddp_split, tag);  // an engine whose request ends before the tag
  refused(&how, 4, "the request is " + std::to_string(offsetof(ddp_split, tag)) +
                       " bytes; its fields through tag take " +
                       std::to_string(offsetof(ddp_split, tag) + sizeof(const char*)));
}

// ------------------------------------------------------------------ jobs

TEST(TransportHelperJob, RunsOnceOnTheStreamAndIsReleased) {
  FakeHost h;
  auto token = std::make_shared<int>(0);
  EXPECT_EQ(dp::launch_job(h.get(), nullptr, "gloo", "all_reduce (4 bytes)", [token] { ++*token; }), DDP_OK);
  ASSERT_EQ(h.queued.size(), 1u);
  EXPECT_EQ(*token, 0);  // enqueued, not run
  EXPECT_EQ(h.run_next(), DDP_OK);
  EXPECT_EQ(*token, 1);
  EXPECT_EQ(token.use_count(), 1);  // the job and its closure are gone
  EXPECT_EQ(h.errors_set, 0);
}

TEST(TransportHelperJob, CancelledJobOnlyReleases) {
  FakeHost h;
  auto token = std::make_shared<int>(0);
  ASSERT_EQ(dp::launch_job(h.get(), nullptr, "gloo", "barrier", [token] { ++*token; }), DDP_OK);
  EXPECT_EQ(h.run_next(/*cancelled=*/true), DDP_OK);
  EXPECT_EQ(*token, 0);
  EXPECT_EQ(token.use_count(), 1);
}

TEST(TransportHelperJob, RefusedLaunchReturnsItsStatusAndReleasesTheJob) {
  FakeHost h;
  h.refuse = DDP_ERR_UNSUPPORTED;
  auto token = std::make_shared<int>(0);
  EXPECT_EQ(dp::launch_job(h.get(), nullptr, "gloo", "barrier", [token] { ++*token; }), DDP_ERR_UNSUPPORTED);
  EXPECT_EQ(h.error, "launch refused");  // the host's text stays
  EXPECT_TRUE(h.queued.empty());
  EXPECT_EQ(*token, 0);
  EXPECT_EQ(token.use_count(), 1);
}

TEST(TransportHelperJob, MoveOnlyClosure) {
  FakeHost h;
  auto owned = std::make_unique<int>(41);
  int seen = 0;
  ASSERT_EQ(dp::launch_job(h.get(), nullptr, "mpi", "barrier", [&seen, owned = std::move(owned)] { seen = *owned + 1; }),
            DDP_OK);
  EXPECT_EQ(h.run_next(), DDP_OK);
  EXPECT_EQ(seen, 42);
}

TEST(TransportHelperJob, StatusOfAJobThatReturnsOneIsItsOwn) {
  FakeHost h;
  ASSERT_EQ(dp::launch_job(h.get(), nullptr, "nccl", std::string(),
                           [&] { return dp::fail(h.get(), DDP_ERR_COMM, "rank 0: the communicator was aborted"); }),
            DDP_OK);
  ASSERT_EQ(dp::launch_job(h.get(), nullptr, "nccl", std::string(), [] { return DDP_OK; }), DDP_OK);
  EXPECT_EQ(h.run_next(), DDP_ERR_COMM);
  EXPECT_EQ(h.error, "rank 0: the communicator was aborted");  // not prefixed: the job set it
  EXPECT_EQ(h.run_next(), DDP_OK);
  EXPECT_EQ(h.errors_set, 1);
}

// An exception becomes "<transport> <what>: <what()>" and the default status.
TEST(TransportHelperJob, ExceptionsBecomeStatusAndNamedText) {
  FakeHost h;
  auto failing = [&](auto thrower) {
    EXPECT_EQ(dp::launch_job(h.get(), nullptr, "gloo", "all_reduce (4000 bytes)", thrower), DDP_OK);
    return h.run_next();
  };
  EXPECT_EQ(failing([] { throw std::runtime_error("Connection reset by peer"); }), DDP_ERR_INTERNAL);
  EXPECT_EQ(h.error, "gloo all_reduce (4000 bytes): Connection reset by peer");
  EXPECT_EQ(failing([] { throw dp::Failure(DDP_ERR_TIMEOUT, "not complete within 1000 ms"); }), DDP_ERR_TIMEOUT);
  EXPECT_EQ(h.error, "gloo all_reduce (4000 bytes): not complete within 1000 ms");
  EXPECT_EQ(failing([] { throw std::bad_alloc(); }), DDP_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(h.error, "gloo all_reduce (4000 bytes): std::bad_alloc");
  EXPECT_EQ(failing([] { throw 7; }), DDP_ERR_INTERNAL);
  EXPECT_EQ(h.error, "gloo all_reduce (4000 bytes): unknown exception");
}

TEST(TransportHelperJob, FailureWhoseTextIsSetKeepsTheHostsText) {
  FakeHost h;
  ASSERT_EQ(dp::launch_job(h.get(), nullptr, "mpi", "barrier", [&] {
              dp::check(dp::fail(h.get(), DDP_ERR_COMM, "the host's own words"));
            }),
            DDP_OK);
  EXPECT_EQ(h.run_next(), DDP_ERR_COMM);
  EXPECT_EQ(h.error, "the host's own words");
  EXPECT_EQ(h.errors_set, 1);
}

TEST(TransportHelperJob, EmptyWhatNamesTheTransportAlone) {
  FakeHost h;
  ASSERT_EQ(dp::launch_job(h.get(), nullptr, "nccl", std::string(), [] { throw std::runtime_error("boom"); }), DDP_OK);
  EXPECT_EQ(h.run_next(), DDP_ERR_INTERNAL);
  EXPECT_EQ(h.error, "nccl: boom");
}

// A transport's own status_of sees the exception, the host and how long the
// job ran (gloo: an I/O error that took the run's timeout is a timeout).
ddp_status timeout_if_slow(const std::exception&, const ddp_host* host, std::chrono::steady_clock::duration took) noexcept {
  return took >= std::chrono::milliseconds(host->timeout_ms) ? DDP_ERR_TIMEOUT : DDP_ERR_COMM;
}

TEST(TransportHelperJob, OwnStatusOfSeesHowLongTheJobRan) {
  FakeHost h;
  h.host.timeout_ms = 50;
  auto quick = [] { throw std::runtime_error("reset"); };
  auto slow = [] {
    std::this_thread::sleep_for(60ms);
    throw std::runtime_error("timed out");
  };
  ASSERT_EQ(dp::launch_job(h.get(), nullptr, "gloo", "barrier", quick, timeout_if_slow), DDP_OK);
  ASSERT_EQ(dp::launch_job(h.get(), nullptr, "gloo", "barrier", slow, timeout_if_slow), DDP_OK);
  EXPECT_EQ(h.run_next(), DDP_ERR_COMM);
  EXPECT_EQ(h.error, "gloo barrier: reset");
  EXPECT_EQ(h.run_next(), DDP_ERR_TIMEOUT);
  EXPECT_EQ(h.error, "gloo barrier: timed out");
}

}  // namespace
