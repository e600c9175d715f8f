// device_test.cpp — the CPU device without communication: memory accounting
// (current and peak per category), CpuDevice allocation, in-order streams,
// sticky stream failure and how events report it, cross-stream waits,
// inline streams; events on device-like streams (native events, as on a
// GPU), and the plugin host's rules there (device calls refused inside a
// device stream's host function, a failed event's error from event_query).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cpu_host.h"
#include "device.h"
#include "device_like_stream.h"
#include "error.h"
#include "mapped.h"
#include "update_rules.h"
#include "whereabouts.h"
#if DDP_WITH_CUDA
#include "gpu.h"
#include "process.h"
#endif

namespace ddp {
namespace {

using namespace std::chrono_literals;
using test::DeviceLikeStream;

// The message `f` throws as ddp::Error, or "" if it does not throw.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ----------------------------------------------------------- MemoryTracker

TEST(MemoryTracker, StartsAtZero) {
  MemoryTracker m;
  for (int c = 0; c < kMemCategories; ++c) {
    EXPECT_EQ(m.current(static_cast<MemCategory>(c)), 0u);
    EXPECT_EQ(m.peak(static_cast<MemCategory>(c)), 0u);
  }
  EXPECT_EQ(m.total_peak(), 0u);
}

TEST(MemoryTracker, CurrentAndPeakPerCategory) {
  MemoryTracker m;
  m.add(MemCategory::Parameters, 100);
  m.add(MemCategory::Gradients, 40);
  m.add(MemCategory::Parameters, 50);
  EXPECT_EQ(m.current(MemCategory::Parameters), 150u);
  EXPECT_EQ(m.peak(MemCategory::Parameters), 150u);
  EXPECT_EQ(m.current(MemCategory::Gradients), 40u);
  EXPECT_EQ(m.peak(MemCategory::Gradients), 40u);
  EXPECT_EQ(m.current(MemCategory::OptimizerState), 0u);
  EXPECT_EQ(m.current(MemCategory::CommBuffers), 0u);
  EXPECT_EQ(m.current(MemCategory::Activations), 0u);
  EXPECT_EQ(m.total_peak(), 190u);

  m.sub(MemCategory::Parameters, 120);
  EXPECT_EQ(m.current(MemCategory::Parameters), 30u);
  EXPECT_EQ(m.peak(MemCategory::Parameters), 150u);  // peaks stay
  EXPECT_EQ(m.total_peak(), 190u);

  // The total peak is of the sum, not the sum of per-category peaks: 30 + 40
  // + 100 = 170 < 190 leaves it; 30 + 40 + 130 = 200 raises it.
  m.add(MemCategory::Activations, 100);
  EXPECT_EQ(m.total_peak(), 190u);
  m.add(MemCategory::Activations, 30);
  EXPECT_EQ(m.peak(MemCategory::Activations), 130u);
  EXPECT_EQ(m.total_peak(), 200u);
  EXPECT_EQ(m.peak(MemCategory::Parameters), 150u);
}

TEST(MemoryTracker, ResetPeaksDropsToCurrent) {
  MemoryTracker m;
  m.add(MemCategory::CommBuffers, 1000);
  m.add(MemCategory::OptimizerState, 64);
  m.sub(MemCategory::CommBuffers, 600);
  EXPECT_EQ(m.peak(MemCategory::CommBuffers), 1000u);
  EXPECT_EQ(m.total_peak(), 1064u);

  m.reset_peaks();
  EXPECT_EQ(m.peak(MemCategory::CommBuffers), 400u);
  EXPECT_EQ(m.current(MemCategory::CommBuffers), 400u);
  EXPECT_EQ(m.peak(MemCategory::OptimizerState), 64u);
  EXPECT_EQ(m.peak(MemCategory::Parameters), 0u);
  EXPECT_EQ(m.total_peak(), 464u);

  // A new window measures from the reset.
  m.add(MemCategory::CommBuffers, 100);
  m.sub(MemCategory::CommBuffers, 500);
  EXPECT_EQ(m.peak(MemCategory::CommBuffers), 500u);
  EXPECT_EQ(m.current(MemCategory::CommBuffers), 0u);
  EXPECT_EQ(m.total_peak(), 564u);
}

TEST(MemoryTracker, ConcurrentAddsAndSubsBalance) {
  MemoryTracker m;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&m] {
      for (int i = 0; i < 10000; ++i) {
        m.add(MemCategory::Activations, 8);
        m.sub(MemCategory::Activations, 8);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(m.current(MemCategory::Activations), 0u);
  EXPECT_GE(m.peak(MemCategory::Activations), 8u);
  EXPECT_LE(m.peak(MemCategory::Activations), 32u);
}

TEST(MemCategoryNames, AsInTheAbi) {
  EXPECT_STREQ(to_string(MemCategory::Parameters), "parameters");
  EXPECT_STREQ(to_string(MemCategory::Gradients), "gradients");
  EXPECT_STREQ(to_string(MemCategory::OptimizerState), "optimizer_state");
  EXPECT_STREQ(to_string(MemCategory::CommBuffers), "comm_buffers");
  EXPECT_STREQ(to_string(MemCategory::Activations), "activations");
}

// --------------------------------------------------------------- CpuDevice

TEST(CpuDevice, KindAndStreams) {
  CpuDevice device;
  EXPECT_EQ(device.kind(), DDP_DEVICE_CPU);
  EXPECT_EQ(device.compute_stream().name(), "compute");
  EXPECT_EQ(device.comm_stream().name(), "comm");
  EXPECT_NE(&device.compute_stream(), &device.comm_stream());
}

TEST(CpuDevice, AllocIsAlignedAndAccounted) {
  CpuDevice device;
  const size_t sizes[] = {1, 3, 63, 64, 65, 100, 4096, 12345};
  std::vector<void*> ptrs;
  size_t total = 0;
  for (size_t bytes : sizes) {
    void* p = device.alloc(bytes, MemCategory::Gradients);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes << " bytes";
    total += bytes;
    EXPECT_EQ(device.memory().current(MemCategory::Gradients), total);
    ptrs.push_back(p);
  }
  EXPECT_EQ(device.memory().current(MemCategory::Parameters), 0u);
  EXPECT_EQ(device.memory().peak(MemCategory::Gradients), total);
  EXPECT_EQ(device.memory().total_peak(), total);

  for (size_t i = 0; i < ptrs.size(); ++i) {
    device.free(ptrs[i]);
    total -= sizes[i];
    EXPECT_EQ(device.memory().current(MemCategory::Gradients), total);
  }
  EXPECT_EQ(device.memory().current(MemCategory::Gradients), 0u);
  EXPECT_EQ(device.memory().peak(MemCategory::Gradients), 4096u + 12345u + 1 + 3 + 63 + 64 + 65 + 100);
}

TEST(CpuDevice, AllocAccountsUnderItsOwnCategory) {
  CpuDevice device;
  void* a = device.alloc(128, MemCategory::OptimizerState);
  void* b = device.alloc(256, MemCategory::CommBuffers);
  EXPECT_EQ(device.memory().current(MemCategory::OptimizerState), 128u);
  EXPECT_EQ(device.memory().current(MemCategory::CommBuffers), 256u);
  device.free(a);
  EXPECT_EQ(device.memory().current(MemCategory::OptimizerState), 0u);
  EXPECT_EQ(device.memory().current(MemCategory::CommBuffers), 256u);
  device.free(b);
  EXPECT_EQ(device.memory().current(MemCategory::CommBuffers), 0u);
}

TEST(CpuDevice, AllocIsZeroedEvenWhenReused) {
  CpuDevice device;
  // Dirty blocks and give them back, so that later allocations of the same
  // sizes likely reuse that memory: it must still come back zeroed.
  for (size_t bytes : {64u, 1000u, 4096u, 100000u}) {
    for (int round = 0; round < 3; ++round) {
      auto* p = static_cast<unsigned char*>(device.alloc(bytes, MemCategory::Activations));
      for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(p[i], 0u) << bytes << " bytes, byte " << i;
      std::memset(p, 0xAB, bytes);
      device.free(p);
    }
  }
  EXPECT_EQ(device.memory().current(MemCategory::Activations), 0u);
}

TEST(CpuDevice, FreeAcceptsNullAndRefusesForeignPointers) {
  CpuDevice device;
  EXPECT_NO_THROW(device.free(nullptr));
  int local = 0;
  EXPECT_EQ(error_of([&] { device.free(&local); }), "free of memory not allocated by this device");
  void* p = device.alloc(32, MemCategory::Parameters);
  device.free(p);
  // A second free of the same block is refused and does not unaccount twice.
  EXPECT_EQ(error_of([&] { device.free(p); }), "free of memory not allocated by this device");
  EXPECT_EQ(device.memory().current(MemCategory::Parameters), 0u);
}

TEST(CpuDevice, CopyFillScaleRunInStreamOrder) {
  CpuDevice device;
  auto* a = static_cast<float*>(device.alloc(100 * sizeof(float), MemCategory::Activations));
  auto* b = static_cast<float*>(device.alloc(100 * sizeof(float), MemCategory::Activations));
  Stream& s = device.comm_stream();
  device.fill(a, 100, 3.0f, s);
  device.scale(a, 100, -2.0f, s);
  device.copy(b, a, 50 * sizeof(float), s);
  device.fill(a, 10, 1.0f, s);
  s.synchronize();
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(a[i], i < 10 ? 1.0f : -6.0f) << i;
    EXPECT_EQ(b[i], i < 50 ? -6.0f : 0.0f) << i;
  }
  // On the inline compute stream the work is done when the call returns.
  device.fill(b, 100, 7.0f, device.compute_stream());
  EXPECT_EQ(b[0], 7.0f);
  EXPECT_EQ(b[99], 7.0f);
  device.free(a);
  device.free(b);
}

// sums_of_squares: each vector's own sum, in closed form where every
// partial sum is exact (1² + ... + n²), empty ones 0, and sum_of_squares's
// bits where rounding shows (the gradients' norm reads nothing else).
TEST(CpuDevice, SumsOfSquaresAreEachVectorsOwn) {
  CpuDevice device;
  std::vector<std::vector<float>> v;
  for (size_t n : {0, 1, 17, 1000}) {
    v.emplace_back(n);
    for (size_t i = 0; i < n; ++i) v.back()[i] = float(i + 1);
  }
  v.emplace_back(333);
  for (size_t i = 0; i < 333; ++i) v.back()[i] = std::sin(float(i) * 0.37f) * 1e3f;
  std::vector<const float*> x;
  std::vector<size_t> n;
  for (const auto& a : v) {
    x.push_back(a.data());
    n.push_back(a.size());
  }
  std::vector<double> out(v.size(), -1.0);
  device.sums_of_squares(x.data(), n.data(), v.size(), out.data());
  for (size_t i = 0; i + 1 < v.size(); ++i)
    EXPECT_EQ(out[i], double(n[i]) * double(n[i] + 1) * double(2 * n[i] + 1) / 6) << n[i];
  EXPECT_EQ(out.back(), sum_of_squares(v.back().data(), v.back().size()));
}

// ----------------------------------------------------------------- Streams

TEST(Stream, ThreadedRunsInOrderOnAnotherThread) {
  CpuDevice device;
  Stream& s = device.comm_stream();
  constexpr int kTasks = 2000;
  std::vector<int> order;  // touched only by the executor until synchronize
  std::atomic<int> off_thread{0};
  const auto caller = std::this_thread::get_id();
  for (int i = 0; i < kTasks; ++i)
    s.enqueue([&, i](bool cancelled) {
      EXPECT_FALSE(cancelled);
      if (std::this_thread::get_id() != caller) ++off_thread;
      if (i % 200 == 0) std::this_thread::sleep_for(100us);  // let the queue build up
      order.push_back(i);
    });
  s.synchronize();
  ASSERT_EQ(order.size(), static_cast<size_t>(kTasks));
  for (int i = 0; i < kTasks; ++i) ASSERT_EQ(order[i], i);
  EXPECT_EQ(off_thread.load(), kTasks);
  EXPECT_FALSE(s.failed());
  EXPECT_EQ(s.error(), "");
}

TEST(Stream, SynchronizeWaitsForTheRunningTask) {
  Stream s("slow", /*threaded=*/true);
  std::atomic<bool> done{false};
  s.enqueue([&](bool) {
    std::this_thread::sleep_for(50ms);
    done = true;
  });
  s.synchronize();
  EXPECT_TRUE(done.load());
}

TEST(Stream, ThrowingTaskFailsTheStream) {
  Stream s("worker", /*threaded=*/true);
  std::vector<std::string> log;  // executor only, read after synchronize
  Event before;
  s.enqueue([&](bool cancelled) { log.push_back(cancelled ? "first:cancelled" : "first:ran"); });
  before.record(s);
  s.enqueue([&](bool cancelled) {
    log.push_back(cancelled ? "bad:cancelled" : "bad:ran");
    throw Error("gloo all_reduce (4 bytes): peer 3 went away");
  });
  for (int i = 0; i < 3; ++i)
    s.enqueue([&, i](bool cancelled) {
      log.push_back("later" + std::to_string(i) + (cancelled ? ":cancelled" : ":ran"));
    });
  Event after;
  after.record(s);

  EXPECT_EQ(error_of([&] { s.synchronize(); }), "gloo all_reduce (4 bytes): peer 3 went away");
  EXPECT_EQ(log, (std::vector<std::string>{"first:ran", "bad:ran", "later0:cancelled",
                                           "later1:cancelled", "later2:cancelled"}));
  EXPECT_TRUE(s.failed());
  EXPECT_EQ(s.error(), "gloo all_reduce (4 bytes): peer 3 went away");

  // Recorded before the failure: completes fine.
  EXPECT_TRUE(before.query());
  EXPECT_EQ(error_of([&] { before.synchronize(); }), "");
  // Recorded after it: fails with the stream's message.
  EXPECT_TRUE(after.query());
  EXPECT_EQ(error_of([&] { after.synchronize(); }), "gloo all_reduce (4 bytes): peer 3 went away");

  // The failure is sticky: an event recorded much later fails the same way,
  // a second failure does not replace the first message, and synchronize
  // keeps throwing it.
  s.enqueue([](bool) { throw Error("second failure"); });  // even though cancelled
  Event later;
  later.record(s);
  EXPECT_EQ(error_of([&] { later.synchronize(); }), "gloo all_reduce (4 bytes): peer 3 went away");
  EXPECT_EQ(error_of([&] { s.synchronize(); }), "gloo all_reduce (4 bytes): peer 3 went away");
}

TEST(Stream, FailureFromAPlainStdException) {
  Stream s("worker", /*threaded=*/true);
  s.enqueue([](bool) { throw std::runtime_error("Timed out in connect"); });
  EXPECT_EQ(error_of([&] { s.synchronize(); }), "Timed out in connect");
}

TEST(Stream, FailureWithEmptyMessageIsStillAFailure) {
  Stream s("worker", /*threaded=*/true);
  s.enqueue([](bool) { throw std::runtime_error(""); });
  EXPECT_EQ(error_of([&] { s.synchronize(); }), "unknown error");
  EXPECT_TRUE(s.failed());
}

TEST(Stream, InlineRunsImmediatelyInTheCallerThread) {
  Stream s("inline", /*threaded=*/false);
  const auto caller = std::this_thread::get_id();
  std::thread::id ran_on;
  int value = 0;
  s.enqueue([&](bool cancelled) {
    EXPECT_FALSE(cancelled);
    ran_on = std::this_thread::get_id();
    value = 42;
  });
  // No synchronize: the task has run by the time enqueue returns.
  EXPECT_EQ(value, 42);
  EXPECT_EQ(ran_on, caller);
  EXPECT_NO_THROW(s.synchronize());
}

TEST(Stream, InlineFailureIsStickyToo) {
  Stream s("inline", /*threaded=*/false);
  // The caller sees an inline failure at once, and the stream stays failed.
  EXPECT_EQ(error_of([&] { s.enqueue([](bool) { throw Error("inline boom"); }); }), "inline boom");
  EXPECT_TRUE(s.failed());
  bool saw_cancelled = false;
  s.enqueue([&](bool cancelled) { saw_cancelled = cancelled; });
  EXPECT_TRUE(saw_cancelled);
  Event e;
  e.record(s);
  EXPECT_TRUE(e.query());
  EXPECT_EQ(error_of([&] { e.synchronize(); }), "inline boom");
  EXPECT_EQ(error_of([&] { s.synchronize(); }), "inline boom");
}

TEST(Stream, DestructorDrainsTheQueue) {
  std::atomic<int> ran{0};
  {
    Stream s("drain", /*threaded=*/true);
    s.enqueue([&](bool) { std::this_thread::sleep_for(20ms); ++ran; });
    for (int i = 0; i < 10; ++i) s.enqueue([&](bool) { ++ran; });
  }
  EXPECT_EQ(ran.load(), 11);
}

// ------------------------------------------------------------------ Events

TEST(Event, FreshEventIsComplete) {
  Event e;
  EXPECT_TRUE(e.query());
  EXPECT_NO_THROW(e.synchronize());
}

TEST(Event, CompletesWhenTheStreamReachesIt) {
  Stream s("worker", /*threaded=*/true);
  std::atomic<bool> release{false};
  s.enqueue([&](bool) {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  Event e;
  e.record(s);
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(e.query());  // the stream is still blocked before it
  release = true;
  e.synchronize();
  EXPECT_TRUE(e.query());
  const auto at = e.completed_at();
  EXPECT_LE(at, Clock::now());
}

TEST(Event, MakeWaitOrdersOneStreamAfterAnother) {
  Stream a("a", /*threaded=*/true);
  Stream b("b", /*threaded=*/true);
  std::atomic<bool> flag{false};
  std::atomic<int> seen{-1};
  a.enqueue([&](bool) {
    std::this_thread::sleep_for(50ms);
    flag = true;
  });
  Event e;
  e.record(a);
  e.make_wait(b);
  b.enqueue([&](bool) { seen = flag.load() ? 1 : 0; });
  b.synchronize();
  EXPECT_EQ(seen.load(), 1) << "stream b ran past its wait on stream a's event";
  a.synchronize();
}

TEST(Event, MakeWaitOnAFailedEventFailsTheWaitingStream) {
  Stream a("a", /*threaded=*/true);
  Stream b("b", /*threaded=*/true);
  a.enqueue([](bool) {
    std::this_thread::sleep_for(20ms);
    throw Error("a failed");
  });
  Event e;
  e.record(a);
  e.make_wait(b);
  bool cancelled_on_b = false;
  b.enqueue([&](bool cancelled) { cancelled_on_b = cancelled; });
  EXPECT_EQ(error_of([&] { b.synchronize(); }), "a failed");
  EXPECT_TRUE(cancelled_on_b);
  EXPECT_EQ(error_of([&] { a.synchronize(); }), "a failed");
}

TEST(Event, ReRecordingKeepsEarlierWaitersOnTheOldPoint) {
  Stream a("a", /*threaded=*/true);
  Stream b("b", /*threaded=*/true);
  std::atomic<bool> release{false};
  std::atomic<int> b_ran{0};
  Event e;
  e.record(a);  // completes at once: a is idle
  e.synchronize();
  e.make_wait(b);  // waits on the completed point
  b.enqueue([&](bool) { ++b_ran; });
  b.synchronize();
  EXPECT_EQ(b_ran.load(), 1);

  a.enqueue([&](bool) {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  e.record(a);  // a new point, behind the blocked task
  EXPECT_FALSE(e.query());
  release = true;
  e.synchronize();
  EXPECT_TRUE(e.query());
}


// ------------------------------------------------- events on device streams
// (through tests/device_like_stream.h: a GPU stream's interface on the CPU)

TEST(EventOnDeviceStreams, RecordQuerySynchronizeAndNativeWait) {
  DeviceLikeStream a("a"), b("b");
  b.last_recorder_ = &a;
  std::atomic<bool> release{false};
  std::vector<int> order;
  std::mutex order_mutex;
  auto note = [&](int v) {
    std::lock_guard<std::mutex> lock(order_mutex);
    order.push_back(v);
  };
  a.enqueue([&](bool) {
    while (!release) std::this_thread::sleep_for(1ms);
    note(1);
  });
  Event e;
  e.record(a);
  EXPECT_FALSE(e.query());  // a is blocked before the point
  e.make_wait(b);           // b waits on the device, the caller does not
  b.enqueue([&](bool) { note(2); });
  EXPECT_THROW(e.synchronize(20ms), Error);  // not passed within the limit: stuck
  release = true;
  e.synchronize();
  EXPECT_TRUE(e.query());
  b.synchronize();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

// A wait past its first 100 us blocks on the event where the stream can
// (a CUDA stream: cudaEventSynchronize) instead of polling with sleeps;
// one that ends sooner never blocks; a stream that cannot block is polled.
TEST(EventOnDeviceStreams, AWaitPastItsFirst100usBlocksWhereTheStreamCan) {
  for (const bool can_block : {true, false}) {
    test::DeviceLikeStream a("a");
    a.blocking = can_block;
    // Before the task is queued: its 5 ms may start before this thread
    // runs again (3.2 ms measured from here to a start taken after it).
    const auto start = std::chrono::steady_clock::now();
    // The slow task outlasts the waiter's 100 us of queries however late
    // the waiter is scheduled: where the stream can block, it ends only
    // once the waiter blocks (or after 10 s, failing the count below).
    a.enqueue([&a, can_block](bool) {
      std::this_thread::sleep_for(5ms);
      const auto give_up = std::chrono::steady_clock::now() + 10s;
      while (can_block && a.blocked == 0 && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(1ms);
    });
    Event slow;
    slow.record(a);
    slow.synchronize();
    EXPECT_GE(std::chrono::steady_clock::now() - start, 5ms);
    EXPECT_TRUE(slow.query());
    EXPECT_EQ(a.blocked.load(), can_block ? 1 : 0);
    Event done;
    done.record(a);  // nothing queued after the sleep: passed at once
    a.synchronize();
    done.synchronize();
    EXPECT_EQ(a.blocked.load(), can_block ? 1 : 0) << "a wait that ended within 100 us blocked";
  }
}

TEST(EventOnDeviceStreams, AFailedHostTaskFailsLaterEvents) {
  DeviceLikeStream a("a");
  a.enqueue([](bool) { throw std::runtime_error("transport exploded"); });
  Event e;
  e.record(a);
  try {
    e.synchronize(5000ms);
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_STREQ(err.what(), "transport exploded");
  }
  EXPECT_TRUE(e.query());  // failed counts as complete
}

// A failure fails the events recorded after it, not those before: the
// stream's host tasks are numbered, an event keeps the count at its record.
TEST(EventOnDeviceStreams, AFailureFailsOnlyTheEventsAfterIt) {
  DeviceLikeStream a("a");
  a.enqueue([](bool) {});
  Event before;
  before.record(a);
  a.enqueue([](bool) { throw std::runtime_error("peer 2 went away"); });
  Event after;
  after.record(a);
  EXPECT_EQ(error_of([&] { a.synchronize(); }), "peer 2 went away");
  EXPECT_EQ(error_of([&] { before.synchronize(5000ms); }), "");
  EXPECT_EQ(before.error(), "");
  EXPECT_EQ(error_of([&] { after.synchronize(5000ms); }), "peer 2 went away");
  EXPECT_EQ(after.error(), "peer 2 went away");
  Event later;  // re-recorded after the failure: fails too
  later.record(a);
  EXPECT_EQ(error_of([&] { later.synchronize(5000ms); }), "peer 2 went away");
}

// After a failure the device still runs the work before the point (its
// kernels and copies): the event is done only once the device passed it,
// so memory that work uses is not freed early; the failure is error()'s.
TEST(EventOnDeviceStreams, AFailedStreamsEventIsDoneOnlyWhenTheDevicePassedIt) {
  DeviceLikeStream a("a");
  std::atomic<bool> release{false};
  a.enqueue([](bool) { throw std::runtime_error("transport exploded"); });
  a.enqueue([&](bool) {  // device work: runs although the stream has failed
    while (!release) std::this_thread::sleep_for(1ms);
  });
  Event e;
  e.record(a);
  while (!a.failed()) std::this_thread::sleep_for(1ms);
  EXPECT_FALSE(e.query());
  release = true;
  EXPECT_EQ(error_of([&] { e.synchronize(5000ms); }), "transport exploded");
  EXPECT_TRUE(e.query());
  EXPECT_EQ(e.error(), "transport exploded");
}

// Tasks of a device stream (CUDA host functions) are flagged; CPU streams'
// tasks and the caller are not.
TEST(EventOnDeviceStreams, DeviceTasksAreFlagged) {
  DeviceLikeStream a("a");
  Stream cpu("cpu", /*threaded=*/true);
  std::atomic<int> on_device{-1}, on_cpu{-1};
  a.enqueue([&](bool) { on_device = Stream::in_device_task(); });
  cpu.enqueue([&](bool) { on_cpu = Stream::in_device_task(); });
  a.synchronize();
  cpu.synchronize();
  EXPECT_EQ(on_device.load(), 1);
  EXPECT_EQ(on_cpu.load(), 0);
  EXPECT_FALSE(Stream::in_device_task());
}

// Inside such a task the plugin host refuses every entry that reaches the
// device, by name, and still serves the rest.
TEST(EventOnDeviceStreams, HostRefusesDeviceCallsInsideADeviceTask) {
  test::CpuPluginHost plugin_host("strategy");
  CpuDevice& device = plugin_host.device;
  const ddp_host* h = plugin_host.get();
  DeviceLikeStream a("a");
  const ddp_stream stream = reinterpret_cast<ddp_stream>(&a);
  float x[4] = {1, 2, 3, 4}, y[4] = {};
  const ddp_buffer buf{x, 4, DDP_FLOAT32, DDP_DEVICE_CPU};
  std::vector<std::pair<std::string, ddp_status>> got;
  std::string error_text;
  a.enqueue([&](bool) {
    void* mem = nullptr;
    ddp_event event = nullptr;
    int done = 0;
    got.emplace_back("alloc", h->alloc(h->ctx, 64, DDP_MEM_COMM_BUFFERS, &mem));
    error_text = take_plugin_error();
    got.emplace_back("alloc_host", h->alloc_host(h->ctx, 64, DDP_MEM_COMM_BUFFERS, &mem));
    got.emplace_back("copy", h->copy(h->ctx, y, x, sizeof x, stream));
    got.emplace_back("fill", h->fill(h->ctx, &buf, 0.0, stream));
    got.emplace_back("scale", h->scale(h->ctx, &buf, 2.0, stream));
    got.emplace_back("launch_host_func",
                     h->launch_host_func(h->ctx, stream, [](void*, int) { return DDP_OK; }, nullptr));
    got.emplace_back("event_create", h->event_create(h->ctx, &event));
    got.emplace_back("event_record", h->event_record(h->ctx, event, stream));
    got.emplace_back("event_query", h->event_query(h->ctx, event, &done));
    got.emplace_back("event_synchronize", h->event_synchronize(h->ctx, event));
    got.emplace_back("stream_wait_event", h->stream_wait_event(h->ctx, stream, event));
    got.emplace_back("run_optimizer", h->run_optimizer(h->ctx, nullptr, 0));
    const char* key = "k";
    got.emplace_back("store_set", h->store_set(h->ctx, key, "v", 1));
    got.emplace_back("store_wait", h->store_wait(h->ctx, &key, 1));
    h->event_destroy(h->ctx, event);  // never recorded: allowed
  });
  a.synchronize();
  ASSERT_EQ(got.size(), 14u);
  for (const auto& [entry, status] : got)
    EXPECT_EQ(status, entry == "event_create" ? DDP_OK : DDP_ERR_UNSUPPORTED) << entry;
  EXPECT_EQ(error_text,
            "alloc: not allowed inside a host function on a device stream (CUDA allows no CUDA calls there, and "
            "none may block): call it at enqueue time, on the calling thread");
  EXPECT_EQ(x[0], 1.0f);  // nothing ran
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(device.memory().current(MemCategory::CommBuffers), 0u);
  // Outside the task the same host serves them.
  void* mem = nullptr;
  EXPECT_EQ(h->alloc(h->ctx, 64, DDP_MEM_COMM_BUFFERS, &mem), DDP_OK);
  h->free(h->ctx, mem);
}

// event_query of an event its stream failed before: done, and the failure
// (as plugin.h says), not a plain "done".
TEST(HostEvents, QueryOfAFailedEventReturnsItsError) {
  test::CpuPluginHost plugin_host;
  const ddp_host* h = plugin_host.get();
  const ddp_stream comm = h->comm_stream(h->ctx);
  ASSERT_EQ(h->launch_host_func(
                h->ctx, comm,
                [](void* host, int) {
                  auto* hh = static_cast<const ddp_host*>(host);
                  hh->set_error(hh->ctx, "peer 1 went away");
                  return DDP_ERR_COMM;
                },
                const_cast<ddp_host*>(h)),
            DDP_OK);
  ddp_event event = nullptr;
  ASSERT_EQ(h->event_create(h->ctx, &event), DDP_OK);
  ASSERT_EQ(h->event_record(h->ctx, event, comm), DDP_OK);
  EXPECT_EQ(h->event_synchronize(h->ctx, event), DDP_ERR_COMM);
  EXPECT_EQ(take_plugin_error(), "peer 1 went away");
  int done = 0;
  EXPECT_EQ(h->event_query(h->ctx, event, &done), DDP_ERR_COMM);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(take_plugin_error(), "peer 1 went away");
  h->event_destroy(h->ctx, event);
}

TEST(EventOnDeviceStreams, NativeEventWaitedFromACpuStream) {
  DeviceLikeStream a("a");
  Stream cpu("cpu", /*threaded=*/true);
  std::atomic<bool> release{false}, after{false};
  a.enqueue([&](bool) {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  Event e;
  e.record(a);
  e.make_wait(cpu);  // a host task waits for the device's point
  cpu.enqueue([&](bool) { after = true; });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(after.load());
  release = true;
  cpu.synchronize();
  EXPECT_TRUE(after.load());
  a.synchronize();
}

// ------------------------------------------------------------ make_device

TEST(MakeDevice, CpuAlways) {
  auto device = make_device(DDP_DEVICE_CPU, 3, false);
  EXPECT_EQ(device->kind(), DDP_DEVICE_CPU);
  EXPECT_EQ(device->compute_stream().native(), nullptr);
}

#if DDP_WITH_CUDA
// Where no GPU is, asking for one is an error in CUDA's words, never a crash.
TEST(MakeDevice, CudaWithoutAGpuIsAClearError) {
  if (test::gpus().count > 0) GTEST_SKIP() << "this machine has a GPU";
  try {
    make_device(DDP_DEVICE_CUDA, 0, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "device \"cuda\": no usable GPU on this machine (" + test::gpus().why + ")");
  }
}

// The GPU's sums of squares (the gradients' norm under clipping and loss
// scaling): exact where every square and partial sum is (small integers),
// within float64 rounding of the CPU's lanes elsewhere, the same bits when
// repeated, at chunk edges (16384) and across a growth of its buffer.
TEST(CudaDevice, SumsOfSquaresMatchTheCpuAndRepeatBitForBit) {
  DDP_REQUIRE_GPUS(1);
  auto device = make_device(DDP_DEVICE_CUDA, 0, false);
  const std::vector<size_t> sizes = {0, 1, 16383, 16384, 16385, (size_t(3) << 20) + 7};
  for (const bool integers : {true, false}) {
    SCOPED_TRACE(integers ? "small integers" : "sines");
    std::vector<std::vector<float>> host;
    std::vector<const float*> x;
    for (size_t n : sizes) {
      host.emplace_back(n);
      for (size_t i = 0; i < n; ++i)
        host.back()[i] = integers ? float(int(i % 7) - 3) : std::sin(float(i) * 0.37f) * 1e3f;
      auto* d = static_cast<float*>(device->alloc(std::max<size_t>(n, 1) * sizeof(float), MemCategory::Gradients));
      device->upload(d, host.back().data(), n * sizeof(float));
      x.push_back(d);
    }
    for (size_t first : {sizes.size() - 1, size_t(0)}) {  // one vector, then all (the buffer grows)
      const size_t count = sizes.size() - first;
      std::vector<double> a(count, -1.0);
      std::vector<double> b(count, -1.0);
      device->sums_of_squares(x.data() + first, sizes.data() + first, count, a.data());
      device->sums_of_squares(x.data() + first, sizes.data() + first, count, b.data());
      for (size_t i = 0; i < count; ++i) {
        const size_t k = first + i;
        const double cpu = sum_of_squares(host[k].data(), sizes[k]);
        if (integers)
          EXPECT_EQ(a[i], cpu) << sizes[k];
        else
          EXPECT_NEAR(a[i], cpu, 1e-12 * cpu) << sizes[k];
        EXPECT_EQ(std::memcmp(&a[i], &b[i], sizeof(double)), 0) << sizes[k] << ": not repeated bit for bit";
      }
    }
    for (const float* d : x) device->free(const_cast<float*>(d));
  }
}

// Which GPU a rank takes (pure): GPU local_rank; the one GPU a launcher
// left visible whatever the local rank; shared ones modulo their count.
TEST(ChooseGpu, OnePerLocalRankOrTheOneVisible) {
  EXPECT_EQ(choose_gpu(0, 4, nullptr, false), 0);
  EXPECT_EQ(choose_gpu(3, 4, nullptr, false), 3);
  EXPECT_EQ(choose_gpu(3, 1, "2", false), 0);    // SLURM --gpus-per-task=1: GPU 2 is this rank's only one
  EXPECT_EQ(choose_gpu(5, 2, nullptr, true), 1);  // shared
  EXPECT_EQ(choose_gpu(3, 1, nullptr, true), 0);
  const std::string tail =
      " visible (one GPU per local rank, or one visible to each rank through CUDA_VISIBLE_DEVICES; set "
      "run.share_gpus = true to let ranks share them, which the gloo transport allows and nccl does not)";
  const auto error_of = [](int local_rank, int visible, const char* cvd) {
    try {
      choose_gpu(local_rank, visible, cvd, false);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), DDP_ERR_UNSUPPORTED);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // One GPU, no launcher's restriction: local rank 3 is refused (4 ranks on one GPU).
  EXPECT_EQ(error_of(3, 1, nullptr), "device \"cuda\": local rank 3 needs GPU 3, but this machine has 1 GPU" + tail);
  EXPECT_EQ(error_of(3, 1, ""), "device \"cuda\": local rank 3 needs GPU 3, but this machine has 1 GPU" + tail);
  // Two visible: the launcher did not give this rank one of its own.
  EXPECT_EQ(error_of(2, 2, "0,1"), "device \"cuda\": local rank 2 needs GPU 2, but this machine has 2 GPUs" + tail);
}

TEST(MakeDevice, CudaNeedsAGpuPerLocalRankUnlessShared) {
  DDP_REQUIRE_GPUS(1);
  const int n = test::gpus().count;
  if (n == 1 && std::getenv("CUDA_VISIBLE_DEVICES"))
    GTEST_SKIP() << "one GPU visible through CUDA_VISIBLE_DEVICES: every local rank takes it (ChooseGpu)";
  try {
    make_device(DDP_DEVICE_CUDA, n, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string want = "device \"cuda\": local rank " + std::to_string(n) + " needs GPU " +
                             std::to_string(n) + ", but this machine has " + std::to_string(n) + " GPU";
    EXPECT_EQ(std::string(e.what()).rfind(want, 0), 0u) << e.what();
  }
  auto shared = make_device(DDP_DEVICE_CUDA, n, true);  // GPU n % n = 0
  EXPECT_EQ(shared->kind(), DDP_DEVICE_CUDA);
  EXPECT_NE(shared->compute_stream().native(), nullptr);
}

// A rank that sees exactly one GPU (CUDA_VISIBLE_DEVICES, as SLURM gives
// each task its own) uses it with local rank 3: `ddp run` as rank 0 of 1
// started by an outside launcher, one step of lm-tiny with nccl.
TEST(MakeDevice, ARankThatSeesOneGpuUsesItWhateverItsLocalRank) {
  DDP_REQUIRE_GPUS(1);
  const std::string dir = temp_dir();
  Process p = start({"run", kRepo + "/configs/lm-gpu.toml", "--set", "model.preset=\"lm-tiny\"", "--set",
                     "run.steps=1", "--set", "run.output_dir=\"" + dir + "/out\""},
                    {"CUDA_VISIBLE_DEVICES=" + std::to_string(test::gpus().count - 1), "RANK=0", "WORLD_SIZE=1",
                     "LOCAL_RANK=3", "DDP_RENDEZVOUS=file:" + dir + "/rdzv"},
                    dir + "/ddp");
  EXPECT_EQ(wait_for(p, std::chrono::seconds(120)), 0) << read_file(p.err);
  EXPECT_TRUE(std::filesystem::exists(dir + "/out/summary.json")) << read_file(p.err);
  std::filesystem::remove_all(dir);
}

// The CUDA device's streams and events keep the CPU's semantics: host tasks
// run in order with the device's work, a failing task fails the stream and
// events recorded after it, native waits order the two streams.
TEST(CudaDevice, StreamsEventsAndMemory) {
  DDP_REQUIRE_GPUS(1);
  auto device = make_device(DDP_DEVICE_CUDA, 0, false);
  Stream& compute = device->compute_stream();
  Stream& comm = device->comm_stream();
  EXPECT_TRUE(compute.threaded());
  const size_t n = 1 << 20;
  float* a = static_cast<float*>(device->alloc(n * sizeof(float), MemCategory::Activations));
  float* b = static_cast<float*>(device->alloc(n * sizeof(float), MemCategory::CommBuffers));
  EXPECT_EQ(device->memory().current(MemCategory::Activations), n * sizeof(float));
  std::vector<float> host(n, -1.0f);
  device->download(host.data(), a, n * sizeof(float));
  EXPECT_EQ(host[0], 0.0f);  // zeroed
  EXPECT_EQ(host[n - 1], 0.0f);

  // compute: fill a; comm waits on it natively, copies a to b, scales b.
  device->fill(a, n, 3.0f, compute);
  Event filled;
  filled.record(compute);
  filled.make_wait(comm);
  device->copy(b, a, n * sizeof(float), comm);
  device->scale(b, n, 0.5f, comm);
  std::atomic<int> order{0};
  int seen = -1;
  comm.enqueue([&](bool cancelled) { seen = cancelled ? -2 : order++; });
  Event done;
  done.record(comm);
  done.synchronize();
  EXPECT_EQ(seen, 0);
  device->download(host.data(), b, n * sizeof(float));
  EXPECT_EQ(host[0], 1.5f);
  EXPECT_EQ(host[n - 1], 1.5f);

  // A failing host task fails the stream; later events fail with its words.
  comm.enqueue([](bool) { throw std::runtime_error("transport exploded"); });
  Event after;
  after.record(comm);
  try {
    after.synchronize();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "transport exploded");
  }
  EXPECT_TRUE(comm.failed());
  device->free(a);
  device->free(b);
  EXPECT_EQ(device->memory().current(MemCategory::Activations), 0u);
}
#endif

// What a plugin points the engine at is readable or not, by the mappings.
TEST(Mapped, ARangeIsReadableOnlyWithinContiguousReadableMappings) {
  const std::string maps =
      "1000-3000 r--p 00000000 00:00 0   /lib/x.so\n"
      "3000-5000 rw-p 00000000 00:00 0\n"
      "5000-6000 ---p 00000000 00:00 0\n"
      "8000-9000 rw-p 00000000 00:00 0   [heap]\n";
  EXPECT_EQ(unreadable_in(maps, 0x1000, 0x4000), "") << "two adjacent mappings read as one";
  EXPECT_EQ(unreadable_in(maps, 0x8800, 0), "") << "an empty range";
  EXPECT_EQ(unreadable_in(maps, 0x4000, 0x1001),
            "its 4097 bytes from 0x4000 run past the memory mapped there (unmapped from 0x5000)")
      << "a mapping without r";
  EXPECT_EQ(unreadable_in(maps, 0x8000, 0x2000),
            "its 8192 bytes from 0x8000 run past the memory mapped there (unmapped from 0x9000)");
  EXPECT_EQ(unreadable_in(maps, 0x6000, 4),
            "its 4 bytes from 0x6000 run past the memory mapped there (nothing readable at 0x6000)");
  EXPECT_EQ(unreadable_in(maps, 0x8000, SIZE_MAX),
            "its 18446744073709551615 bytes from 0x8000 run past the end of the address space");
  // This process: a vector's own bytes are there; 2^40 floats past them are not.
  std::vector<float> small(1 << 20);
  EXPECT_EQ(unreadable(small.data(), small.size() * sizeof(float)), "");
  EXPECT_NE(unreadable(small.data(), size_t{4} << 40).find("run past the memory mapped there"), std::string::npos);
}

// A std::bad_alloc names the plugin entry the thread last left, whether it
// returned or an exception left it.
TEST(OutOfMemory, ABadAllocNamesThePluginEntryLastLeft) {
  EXPECT_EQ(out_of_memory_words(nullptr, nullptr), "out of memory: an allocation failed (std::bad_alloc)");
  std::thread([] {
    EXPECT_EQ(whereabouts::left_plugin(), nullptr);
    { whereabouts::Inside in("strategy plugin 'x'", "state"); }
    { whereabouts::Inside engine_wait(nullptr, "draining the streams"); }
    EXPECT_EQ(out_of_memory_words(whereabouts::left_plugin(), whereabouts::left_entry()),
              "out of memory: an allocation failed (std::bad_alloc); the last plugin entry this rank left: "
              "strategy plugin 'x' state")
        << "an engine wait is not a plugin entry";
    try {
      whereabouts::Inside in("strategy plugin 'y'", "create");
      throw std::bad_alloc();
    } catch (const std::bad_alloc&) {
    }
    EXPECT_STREQ(whereabouts::left_entry(), "create");
    EXPECT_EQ(words_of(std::bad_alloc()), "out of memory: an allocation failed (std::bad_alloc); the last plugin "
                                          "entry this rank left: strategy plugin 'y' create");
    EXPECT_EQ(words_of(std::runtime_error("other")), "other");
  }).join();
}

}  // namespace
}  // namespace ddp
