// stream.cpp — CPU streams and events on any stream (see stream.h).
#include "stream.h"

#include <thread>

namespace ddp {

// ------------------------------------------------------------------ Stream

Stream::Stream(std::string name, bool threaded) : name_(std::move(name)), threaded_(threaded) {
  if (threaded_) thread_ = std::thread([this] { loop(); });
}

Stream::Stream(std::string name, void* native) : name_(std::move(name)), threaded_(true), native_(native) {}

Stream::~Stream() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

namespace {
thread_local bool t_in_device_task = false;
thread_local bool t_in_task = false;
thread_local const char* t_task_note = nullptr;
}  // namespace

bool Stream::in_device_task() { return t_in_device_task; }
bool Stream::in_task() { return t_in_task; }
void Stream::set_task_note(const char* note) { t_task_note = note; }

bool Stream::failed_before(int64_t point) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !error_.empty() && failed_task_ < point;
}

void Stream::run(Task& task, int64_t index) {
  bool cancelled;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled = !error_.empty();
  }
  // A device stream's task runs where the device allows no calls into it
  // (CUDA's host functions): flagged, so the plugin host can refuse them.
  struct Flag {
    bool was;
    bool was_task;
    explicit Flag(bool on) : was(t_in_device_task), was_task(t_in_task) {
      t_in_device_task = was || on;
      t_in_task = true;
    }
    ~Flag() {
      t_in_device_task = was;
      t_in_task = was_task;
    }
  } flag(native_ != nullptr);
  try {
    task(cancelled);
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error_.empty()) {
        error_ = e.what()[0] ? e.what() : "unknown error";
        if (t_task_note) error_ += std::string(" (in ") + t_task_note + ")";
        error_kind_ = kind_of(e);
        failed_task_ = index;
      }
    }
    if (!threaded_) throw;
  }
}

void Stream::enqueue(Task task) {
  if (!threaded_) {
    run(task);  // rethrows
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void Stream::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    run(task);
    task = nullptr;  // release captures outside the lock
    lock.lock();
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void Stream::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  if (!error_.empty()) throw Error(error_, error_kind_);
}

bool Stream::drained_within(std::chrono::milliseconds limit) {
  if (native_) {
    try {
      synchronize();
    } catch (const std::exception&) {}
    return true;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  return idle_cv_.wait_for(lock, limit, [this] { return queue_.empty() && !busy_; });
}

bool Stream::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !error_.empty();
}

std::string Stream::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

ddp_status Stream::error_kind() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_kind_;
}

// ------------------------------------------------------------------- Event

// On a device stream an event is its native event alone: no host task per
// record (the device's host tasks may run on one thread for all streams, so
// one per event would tie the streams together). It fails if one of the
// stream's host tasks before its point failed (the tasks are numbered):
// by the time the device passes the point, that task has run.
void Event::record(Stream& stream) {
  if (stream.native()) {
    if (!native_ || native_.use_count() > 1) {  // a copy may still wait on the old one
      native_ = std::make_shared<Native>();
      native_->event = stream.create_native_event();
      native_->destroy = stream.native_event_destroyer();
    }
    stream.record_native_event(native_->event);
    native_->recorded = true;
    native_->stream = &stream;
    native_->point = stream.task_count();
    state_ = std::make_shared<State>();  // done: the native event decides
    return;
  }
  auto state = std::make_shared<State>();
  state->done = false;
  stream.enqueue([state, &stream](bool cancelled) {
    std::lock_guard<std::mutex> lock(state->mutex);
    if (cancelled) {
      state->error = stream.error();
      state->kind = stream.error_kind();
    }
    state->done = true;
    state->at = Clock::now();
    state->cv.notify_all();
  });
  state_ = state;  // once enqueued (a throwing enqueue keeps the old point); earlier waiters keep the old state
  native_.reset();
}

namespace {

[[noreturn]] void stuck(std::chrono::milliseconds limit) {
  throw Error("communication made no progress for " + std::to_string(limit.count() / 1000) +
                  " s (run.timeout_s plus a grace): a collective is stuck",
              DDP_ERR_TIMEOUT);
}

template <typename State>
void wait_for_state(State& state, std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(state.mutex);
  if (limit == std::chrono::milliseconds::max()) {
    state.cv.wait(lock, [&] { return state.done; });
  } else if (!state.cv.wait_for(lock, limit, [&] { return state.done; })) {
    stuck(limit);
  }
  if (!state.error.empty()) throw Error(state.error, state.kind);
}

}  // namespace

// Waits until the device has passed the event: for the first 100 us it
// queries with a yield between (a collective of a few microseconds is
// waited for in about that; a sleep would add the kernel's timer slack,
// ~50 us, to every wait), then blocks on the event where the stream can
// (a CUDA stream: woken when the device passes it, the watchdog bounding
// the wait), else polls with a 20 us sleep until `limit` is over.
void Event::wait_native(std::chrono::milliseconds limit) const {
  const auto native = native_;
  const Clock::time_point start = Clock::now();
  const auto deadline = limit == std::chrono::milliseconds::max() ? Clock::time_point::max() : start + limit;
  const Clock::time_point spin_until = start + std::chrono::microseconds(100);
  while (!native->stream->query_native_event(native->event)) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) stuck(limit);
    if (now < spin_until) {
      std::this_thread::yield();
    } else if (native->stream->block_on_native_event(native->event)) {
      break;
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  if (native->stream->failed_before(native->point)) throw Error(native->stream->error(), native->stream->error_kind());
}

void Event::synchronize(std::chrono::milliseconds limit) {
  if (native_ && native_->recorded) {
    wait_native(limit);
    return;
  }
  auto state = state_;
  wait_for_state(*state, limit);
}

// A native event is done when the device has passed it, failed stream or
// not: memory the work before it uses may be reused only then.
bool Event::query() {
  if (native_ && native_->recorded) return native_->stream->query_native_event(native_->event);
  auto state = state_;
  std::lock_guard<std::mutex> lock(state->mutex);
  return state->done;
}

std::string Event::error() {
  if (native_ && native_->recorded)
    return native_->stream->failed_before(native_->point) ? native_->stream->error() : std::string();
  auto state = state_;
  std::lock_guard<std::mutex> lock(state->mutex);
  return state->error;
}

ddp_status Event::error_kind() {
  if (native_ && native_->recorded)
    return native_->stream->failed_before(native_->point) ? native_->stream->error_kind() : DDP_OK;
  auto state = state_;
  std::lock_guard<std::mutex> lock(state->mutex);
  return state->kind;
}

// Device to device: the device waits, the host does not (and a failure of
// the recording stream does not carry over: the trainer checks the comm
// stream at the end of each step). Otherwise a task on
// `stream` waits, holding the State (or a copy of the Event for a native
// one; device streams never run such a task).
void Event::make_wait(Stream& stream, std::chrono::milliseconds limit) {
  if (native_ && native_->recorded) {
    if (stream.native()) {
      stream.wait_native_event(native_->event);
      return;
    }
    Event copy = *this;
    stream.enqueue([copy, limit](bool cancelled) {
      if (!cancelled) copy.wait_native(limit);
    });
    return;
  }
  auto state = state_;  // as recorded now
  stream.enqueue([state, limit](bool cancelled) {
    if (!cancelled) wait_for_state(*state, limit);
  });
}

Clock::time_point Event::completed_at() {
  synchronize();
  return native_ && native_->recorded ? Clock::now() : state_->at;
}

}  // namespace ddp
