// ddp/transport.hpp — optional, header-only C++17 helpers for transport
// authors, over ddp/plugin.hpp: the mechanics every transport writes the same
// way, written once (gloo, mpi and nccl use them).
//
// - fail(): an entry's failure in one line: the host's error text, then the
//   status the entry returns.
// - Argument checks at enqueue time, in the caller's thread, before anything
//   is enqueued: a buffer argument (check_buffer, around the transport's own
//   device and dtype rules), broadcast's root (check_root), the shapes of
//   all_gather and reduce_scatter (check_all_gather, check_reduce_scatter),
//   each on the world's communicator or, given its size, on a group's;
//   split's request (check_split, ABI 1.9). Each returns DDP_OK, or sets
//   the text and returns the refusal's status.
// - launch_job(): a job on a stream (host->launch_host_func), as a transport
//   on CPU runs its blocking collective: the stream's executor runs it in
//   order, and an exception it throws becomes the stream's failure, a status
//   plus text naming the transport and the collective.
//
//   ddp_status my_all_reduce(ddp_comm* c, const ddp_buffer* b, ddp_reduce_op op, ddp_stream s) {
//     if (ddp_status st = ddp::plugin::check_buffer(c->host, b, "all_reduce", my_rules)) return st;
//     return ddp::plugin::launch_job(c->host, s, "mine", ddp::plugin::describe("all_reduce", *b),
//                                    [=] { ... blocking collective, may throw ... });
//   }
//
// Only the public headers and the C++ standard library: nothing here knows a
// communication library or a device API. Not here: the collectives
// themselves, staging, a transport's own device and dtype rules.
#ifndef DDP_TRANSPORT_HPP
#define DDP_TRANSPORT_HPP

#include <ddp/plugin.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

namespace ddp {
namespace plugin {

// Sets the host's error text (of the calling thread) and returns `status`:
// `return fail(host, DDP_ERR_INVALID_ARGUMENT, "...");` at an entry or in a
// job. The text is the user's: say what, and where.
inline ddp_status fail(const ddp_host* host, ddp_status status, const std::string& message) noexcept {
  host->set_error(host->ctx, message.c_str());
  return status;
}

// The bytes a buffer covers (0 for an unknown dtype).
inline size_t bytes_of(const ddp_buffer& buffer) noexcept { return buffer.count * ddp_dtype_size(buffer.dtype); }

// A collective as messages name it: "all_reduce (4096 bytes)".
inline std::string describe(const char* entry, const ddp_buffer& buffer) {
  return std::string(entry) + " (" + std::to_string(bytes_of(buffer)) + " bytes)";
}

// "cpu", "cuda", or "device 7" for a kind this header does not know (an
// int: a value outside the enum's is no ddp_device_kind in C++).
inline std::string device_name(int kind) {
  return kind == DDP_DEVICE_CPU ? "cpu" : kind == DDP_DEVICE_CUDA ? "cuda" : "device " + std::to_string(kind);
}

// "<entry>: NULL buffer", DDP_ERR_INVALID_ARGUMENT.
inline ddp_status null_buffer(const ddp_host* host, const char* entry) {
  return fail(host, DDP_ERR_INVALID_ARGUMENT, std::string(entry) + ": NULL buffer");
}

// One buffer argument of `entry`: refused as a NULL buffer when the argument
// is NULL, then by `own(const ddp_buffer&) -> ddp_status` (the transport's
// device and dtype rules: DDP_OK, or a status after fail()), then as a NULL
// buffer when its ptr is NULL and its count is not 0.
template <typename Own>
ddp_status check_buffer(const ddp_host* host, const ddp_buffer* buffer, const char* entry, Own&& own) {
  if (buffer == nullptr) return null_buffer(host, entry);
  if (ddp_status s = own(*buffer)) return s;
  if (buffer->count > 0 && buffer->ptr == nullptr) return null_buffer(host, entry);
  return DDP_OK;
}

inline ddp_status check_buffer(const ddp_host* host, const ddp_buffer* buffer, const char* entry) {
  return check_buffer(host, buffer, entry, [](const ddp_buffer&) { return DDP_OK; });
}

namespace detail {

// How a refusal names the size of a communicator of `size` ranks:
// "world_size" for one of the world's size (the words the shipped
// transports have always used), "the group's size (N)" for a group's.
inline std::string size_words(const ddp_host* host, int size) {
  if (size == host->world_size) return "world_size";
  return "the group's size (" + std::to_string(size) + ")";
}

}  // namespace detail

// broadcast's root: a rank of a communicator of `size` ranks, the world's
// or a group's (ddp_transport_v1_t::split): root is the group's rank.
inline ddp_status check_root(const ddp_host* host, int root, int size) {
  if (root >= 0 && root < size) return DDP_OK;
  const std::string group =
      size == host->world_size ? "" : " (a group of " + std::to_string(size) + (size == 1 ? " rank)" : " ranks)");
  return fail(host, DDP_ERR_INVALID_ARGUMENT, "broadcast: root " + std::to_string(root) + " out of range" + group);
}

// broadcast's root on the world's communicator: a rank of host->world_size.
// (Kept for transports without groups; one with split passes each comm's size.)
inline ddp_status check_root(const ddp_host* host, int root) { return check_root(host, root, host->world_size); }

// all_gather's shapes (ddp/abi/transport.h) on a communicator of `size`
// ranks: recv.count == send.count * size, one dtype. The buffers themselves
// are checked before.
inline ddp_status check_all_gather(const ddp_host* host, const ddp_buffer& send, const ddp_buffer& recv, int size) {
  if (size > 0 && recv.count == send.count * static_cast<size_t>(size) && recv.dtype == send.dtype) return DDP_OK;
  return fail(
      host, DDP_ERR_INVALID_ARGUMENT,
      "all_gather: recv must hold send.count * " + detail::size_words(host, size) + " elements of send's dtype");
}

// all_gather's shapes on the world's communicator (size host->world_size).
inline ddp_status check_all_gather(const ddp_host* host, const ddp_buffer& send, const ddp_buffer& recv) {
  return check_all_gather(host, send, recv, host->world_size);
}

// reduce_scatter's shapes on a communicator of `size` ranks: send.count ==
// recv.count * size, one dtype.
inline ddp_status check_reduce_scatter(const ddp_host* host, const ddp_buffer& send, const ddp_buffer& recv, int size) {
  if (size > 0 && send.count == recv.count * static_cast<size_t>(size) && recv.dtype == send.dtype) return DDP_OK;
  return fail(
      host, DDP_ERR_INVALID_ARGUMENT,
      "reduce_scatter: send must hold recv.count * " + detail::size_words(host, size) + " elements of recv's dtype");
}

// reduce_scatter's shapes on the world's communicator (size host->world_size).
inline ddp_status check_reduce_scatter(const ddp_host* host, const ddp_buffer& send, const ddp_buffer& recv) {
  return check_reduce_scatter(host, send, recv, host->world_size);
}

// split's request (ABI 1.9, ddp_split) on a parent of `parent_size` ranks,
// before anything collective: a struct that reaches its tag, color >= 0,
// 0 <= rank < size <= parent_size, and a tag that is not empty. Refusals
// read "<transport> split: ...". The engine computes rank and size from
// every rank's color and key, so every rank of the parent is refused alike
// and none is left waiting in a rendezvous.
inline ddp_status check_split(const ddp_host* host, const ddp_split* how, int parent_size, const char* transport) {
  const std::string where = std::string(transport) + " split: ";
  const size_t needs = offsetof(ddp_split, tag) + sizeof how->tag;
  if (how == nullptr) return fail(host, DDP_ERR_INVALID_ARGUMENT, where + "NULL request");
  if (how->struct_size < needs)
    return fail(host, DDP_ERR_INVALID_ARGUMENT,
                where + "the request is " + std::to_string(how->struct_size) + " bytes; its fields through tag take " +
                    std::to_string(needs));
  if (how->color < 0)
    return fail(host, DDP_ERR_INVALID_ARGUMENT, where + "color " + std::to_string(how->color) + " is negative");
  if (how->size < 1 || how->size > parent_size || how->rank < 0 || how->rank >= how->size)
    return fail(host, DDP_ERR_INVALID_ARGUMENT,
                where + "rank " + std::to_string(how->rank) + " of a group of " + std::to_string(how->size) +
                    " ranks, from a parent of " + std::to_string(parent_size) +
                    ": a group has 1 to the parent's ranks, and its rank is below its size");
  if (how->tag == nullptr || *how->tag == '\0')
    return fail(host, DDP_ERR_INVALID_ARGUMENT, where + "no tag (the group's name in the rendezvous)");
  return DDP_OK;
}

// ------------------------------------------------------------ jobs on a stream

// The status of an exception a job threw after running for `took` (a
// transport that can tell a timeout from a lost peer by it passes its own to
// launch_job). Called on the stream's executor; must not throw.
using JobStatus = ddp_status (*)(const std::exception& e, const ddp_host* host,
                                 std::chrono::steady_clock::duration took) noexcept;

// The default: a Failure's own status, std::bad_alloc DDP_ERR_OUT_OF_MEMORY,
// anything else DDP_ERR_INTERNAL (a bug, not the network).
inline ddp_status job_status(const std::exception& e, const ddp_host*, std::chrono::steady_clock::duration) noexcept {
  if (const auto* f = dynamic_cast<const Failure*>(&e)) return f->status();
  if (dynamic_cast<const std::bad_alloc*>(&e)) return DDP_ERR_OUT_OF_MEMORY;
  return DDP_ERR_INTERNAL;
}

namespace detail {

template <typename Run>
struct Job {
  const ddp_host* host;
  const char* transport;  // "gloo": first in the text of a failure
  std::string what;       // "all_reduce (4096 bytes)"
  JobStatus status_of;
  Run run;
};

// A job's failure: "<transport> <what>: <reason>" as the host's text, or the
// text already set (a Failure whose text_is_set). Never throws.
inline ddp_status job_failed(const ddp_host* host, const char* transport, const std::string& what, const char* reason,
                             ddp_status status, bool text_is_set) noexcept {
  if (text_is_set) return status;
  try {
    return fail(host, status, std::string(transport) + (what.empty() ? "" : " ") + what + ": " + reason);
  } catch (const std::bad_alloc&) {
    return fail(host, status, "out of memory");
  }
}

template <typename Run>
ddp_status run_job(void* user, int cancelled) noexcept {
  std::unique_ptr<Job<Run>> job(static_cast<Job<Run>*>(user));
  if (cancelled) return DDP_OK;  // the stream has failed: only release the job
  const auto start = std::chrono::steady_clock::now();
  try {
    if constexpr (std::is_void_v<decltype(job->run())>) {
      job->run();
      return DDP_OK;
    } else {
      return job->run();
    }
  } catch (const std::exception& e) {
    const auto* f = dynamic_cast<const Failure*>(&e);
    const ddp_status status = job->status_of(e, job->host, std::chrono::steady_clock::now() - start);
    return job_failed(job->host, job->transport, job->what, e.what(), status, f != nullptr && f->text_is_set());
  } catch (...) {
    return job_failed(job->host, job->transport, job->what, "unknown exception", DDP_ERR_INTERNAL, false);
  }
}

}  // namespace detail

// Enqueues `run` on `stream` (host->launch_host_func); returns at once. The
// stream's executor calls run() exactly once, in stream order, unless the
// stream has failed before (then it is only destroyed). run() returns void,
// or a ddp_status (DDP_OK, or an error whose text it set with fail()). An
// exception it throws fails the stream with status_of(e, host, how long it
// ran) and the text "<transport> <what>: <e.what()>" (a Failure whose
// text_is_set keeps the text the host has). Returns launch_host_func's
// status (the host has set the text; `run` is then destroyed unrun), or
// DDP_ERR_OUT_OF_MEMORY. `run` is moved (or copied) into the job and
// destroyed after it ran, on the executor. One allocation per job.
template <typename Run>
ddp_status launch_job(const ddp_host* host, ddp_stream stream, const char* transport, std::string what, Run&& run,
                      JobStatus status_of = job_status) {
  using Body = std::decay_t<Run>;
  detail::Job<Body>* job = nullptr;
  try {
    job = new detail::Job<Body>{host, transport, std::move(what), status_of ? status_of : job_status,
                                std::forward<Run>(run)};
  } catch (const std::bad_alloc&) {
    return fail(host, DDP_ERR_OUT_OF_MEMORY, "out of memory");
  }
  const ddp_status status = host->launch_host_func(host->ctx, stream, &detail::run_job<Body>, job);
  if (status != DDP_OK) delete job;
  return status;
}

}  // namespace plugin
}  // namespace ddp

#endif  // DDP_TRANSPORT_HPP
