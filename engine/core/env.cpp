// env.cpp — the environment read once (env.h): the one place of engine/
// that calls getenv's kin (environ).
#include "env.h"

#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "error.h"

extern char** environ;

namespace ddp {

namespace {

std::string shown(const std::string& name, const std::string& value) {
  return name + "=" + value + " in the environment";
}

std::optional<std::string> value_of(const std::map<std::string, std::string>& vars, const std::string& name) {
  const auto it = vars.find(name);
  if (it == vars.end()) return std::nullopt;
  return it->second;
}

// A JSON text the launcher hands its ranks: only its bracket is checked
// here (the summary parses it); `open`, `close` and `what` say which.
std::optional<std::string> launcher_json(const std::map<std::string, std::string>& vars, const std::string& name,
                                         char open, char close, const std::string& what) {
  const std::optional<std::string> v = value_of(vars, name);
  if (!v) return std::nullopt;
  if (v->size() < 2 || v->front() != open || v->back() != close)
    throw ConfigError(shown(name, *v) + " is not " + what + ": ddp run sets it for its ranks; unset it");
  return v;
}

int status_fd_of(const std::optional<std::string>& text) {
  if (!text || text->empty()) return -1;
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text->c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || value < 0 || value > INT_MAX || !std::isdigit((unsigned char)(*text)[0]))
    throw ConfigError(shown("DDP_STATUS_FD", *text) + " is not a file descriptor (a number from 0 to " +
                      std::to_string(INT_MAX) + "): ddp run sets it for its ranks; unset it");
  return int(value);
}

// The Env env() returns. Read without a lock (a crash report reads it in
// a signal handler); every Env ever set is kept, and never destroyed, so
// that a reference env() gave stays valid after set_env and while the
// process exits (a thread may still read it after main returns).
std::atomic<const Env*> g_env{nullptr};
std::mutex g_set_mutex;

const Env* keep(Env e) {  // under g_set_mutex
  static auto* kept = new std::vector<std::unique_ptr<Env>>();
  kept->push_back(std::make_unique<Env>(std::move(e)));
  return kept->back().get();
}

}  // namespace

const char* Env::get(const char* name) const {
  const auto it = vars.find(name);
  return it == vars.end() ? nullptr : it->second.c_str();
}

Env parse_env(const std::map<std::string, std::string>& vars) {
  Env e;
  e.vars = vars;
  e.trace = value_of(vars, "DDP_TRACE").value_or("");
  e.blas_choice = launcher_json(vars, "DDP_BLAS_CHOICE", '{', '}', "a JSON object");
  e.restarts = launcher_json(vars, "DDP_RESTARTS", '[', ']', "a JSON array");
  if (const auto h = value_of(vars, "DDP_HUGE_PAGES")) {
    if (*h != "0" && *h != "1")
      throw ConfigError(shown("DDP_HUGE_PAGES", *h) +
                        " is neither 0 nor 1 (0: malloc without huge pages, "
                        "1: with them)");
    e.huge_pages = *h == "1";
  }
  e.huge_pages_restarted = vars.count("DDP_HUGE_PAGES_RESTARTED") > 0;
  e.plugin_dir = value_of(vars, "DDP_PLUGIN_DIR").value_or("");
  e.debug = vars.count("DDP_DEBUG") > 0;
  e.status_fd = status_fd_of(value_of(vars, "DDP_STATUS_FD"));
  e.status_path = value_of(vars, "DDP_STATUS_PATH").value_or("");
  e.cache_dir = value_of(vars, "DDP_CACHE_DIR").value_or("");
  return e;
}

std::map<std::string, std::string> process_environment() {
  std::map<std::string, std::string> vars;
  for (char** p = environ; p && *p; ++p) {
    const std::string entry = *p;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) vars.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return vars;
}

void load_env() { set_env(parse_env(process_environment())); }

const Env& env() {
  if (const Env* e = g_env.load(std::memory_order_acquire)) return *e;
  std::lock_guard<std::mutex> lock(g_set_mutex);
  if (!g_env.load(std::memory_order_acquire))
    g_env.store(keep(parse_env(process_environment())), std::memory_order_release);
  return *g_env.load(std::memory_order_acquire);
}

const char* env_var(const char* name) { return env().get(name); }

void set_env(Env e) {
  std::lock_guard<std::mutex> lock(g_set_mutex);
  g_env.store(keep(std::move(e)), std::memory_order_release);
}

}  // namespace ddp
