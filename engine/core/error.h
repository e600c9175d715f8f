// error.h — the engine's one error type. Inside the engine errors are
// exceptions carrying a user-facing message (file, line, key or rank named by
// whoever throws); across the plugin ABI they are ddp_status codes; only
// main() turns them into an exit code.
//
// An Error carries the ddp_status it stands for, its kind, so that a status
// coming back out of a plugin keeps its kind and the host's own entries
// return it at the ABI (host_guard, engine/host/plugin_host.h, converts it
// there explicitly: the engine's errors are its own, not the plugin SDK's).
// On its way up it also learns which plugin entry and which step it came
// from. A rank reports all of these to its launcher as fields
// (engine/launch/failure.h), so that the launcher tells a timeout from a lost
// peer without reading the text.
#pragma once

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>

#include <ddp/plugin.h>

#include "whereabouts.h"

namespace ddp {

class Error : public std::runtime_error {
 public:
  // `kind`, the status() it stands for: DDP_ERR_TIMEOUT (a wait outlasted
  // run.timeout_s), DDP_ERR_COMM (a peer or the network failed),
  // DDP_ERR_INVALID_ARGUMENT (the configuration or a file it names),
  // DDP_ERR_OUT_OF_MEMORY, DDP_ERR_UNSUPPORTED; DDP_ERR_INTERNAL for
  // anything else.
  explicit Error(const std::string& message, ddp_status kind = DDP_ERR_INTERNAL)
      : std::runtime_error(message), status_(kind) {}
  ddp_status status() const { return status_; }

  // Where it happened, as far as known: the plugin ("strategy plugin
  // 'naive'") and entry ("finish") that returned it, and the training step
  // (-1: set-up, or the end of the run).
  const std::string& plugin() const { return plugin_; }
  const std::string& entry() const { return entry_; }
  int64_t step() const { return step_; }
  Error& in_plugin(std::string plugin, std::string entry) {
    plugin_ = std::move(plugin);
    entry_ = std::move(entry);
    return *this;
  }
  Error& at_step(int64_t step) {
    step_ = step;
    return *this;
  }

 private:
  ddp_status status_;
  std::string plugin_;
  std::string entry_;
  int64_t step_ = -1;
};

// The configuration, or a file it names (weights, data), is wrong: the
// message names the file (and line and key), or the --set argument.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& message) : Error(message, DDP_ERR_INVALID_ARGUMENT) {}
};

// The kind of any exception: an Error's own; DDP_ERR_OUT_OF_MEMORY for
// std::bad_alloc; else DDP_ERR_INTERNAL.
inline ddp_status kind_of(const std::exception& e) {
  if (const auto* f = dynamic_cast<const Error*>(&e)) return f->status();
  if (dynamic_cast<const std::bad_alloc*>(&e)) return DDP_ERR_OUT_OF_MEMORY;
  return DDP_ERR_INTERNAL;
}

// What a rank says of a std::bad_alloc (whose size the C++ library does not
// tell): "out of memory: an allocation failed (std::bad_alloc); the last
// plugin entry this rank left: strategy plugin 'x' state" (`plugin`, the
// label, and `entry` from whereabouts::left_plugin, nullptr where it was in
// none). Pure.
inline std::string out_of_memory_words(const char* plugin, const char* entry) {
  std::string words = "out of memory: an allocation failed (std::bad_alloc)";
  if (plugin && entry) words += std::string("; the last plugin entry this rank left: ") + plugin + " " + entry;
  return words;
}

// An exception's words as a rank reports them: a std::bad_alloc's as
// out_of_memory_words, with the plugin entry the calling thread last left;
// any other's what().
inline std::string words_of(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return out_of_memory_words(whereabouts::left_plugin(), whereabouts::left_entry());
  return e.what();
}

// A status as a word: "ok", "invalid_argument", "unsupported", "comm",
// "timeout", "out_of_memory", "internal".
inline const char* kind_name(ddp_status status) {
  switch (status) {
    case DDP_OK: return "ok";
    case DDP_ERR_INVALID_ARGUMENT: return "invalid_argument";
    case DDP_ERR_UNSUPPORTED: return "unsupported";
    case DDP_ERR_COMM: return "comm";
    case DDP_ERR_TIMEOUT: return "timeout";
    case DDP_ERR_OUT_OF_MEMORY: return "out_of_memory";
    case DDP_ERR_INTERNAL: break;
  }
  return "internal";
}

}  // namespace ddp
