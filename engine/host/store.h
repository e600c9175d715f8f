// store.h — the rendezvous store all ranks of a run share: Gloo's own store
// (a FileStore in a directory, or a RedisStore for many machines), behind a
// prefix unique to the run. Transports meet through it (the gloo plugin
// adapts it back into a gloo::rendezvous::Store; NCCL passes its unique id).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace gloo {
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace ddp {

class Store {
 public:
  // `location`: "file:<dir>" or "redis:<host>:<port>"; `prefix` namespaces
  // the keys (the run id). Throws Error for a malformed location.
  Store(const std::string& location, const std::string& prefix, std::chrono::milliseconds timeout);
  ~Store();

  void set(const std::string& key, const std::vector<char>& value);
  std::vector<char> get(const std::string& key);  // waits up to the timeout
  void wait(const std::vector<std::string>& keys);
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Marks rank `rank` of `world_size` as started in this run, and waits
  // until every rank has (up to the timeout, naming the rank missing).
  // Throws Error naming the store and the run id if a rank of that number
  // already started under this id: the store holds an earlier run's keys (a
  // reused directory, or Redis with the default run id), which would fail
  // later, in words that do not say so. The refusal is posted in the store,
  // and every rank waiting here refuses with it: an earlier run's keys of
  // one rank would send the others to connect to its dead addresses.
  void claim(int rank, int world_size);

  // Removes every key this rank set (a file store's files, a Redis store's
  // keys), once no rank will read them again: after the run's last
  // collective. Keys of a failed run stay, and claim() explains them.
  // Returns "" or what could not be removed; never throws.
  std::string remove_written();

 private:
  bool holds(const std::string& key) const;  // without waiting
  [[noreturn]] void refuse(int rank, const std::string& why);
  void await(const std::string& key, const std::string& missing, std::chrono::steady_clock::time_point deadline);
  static constexpr const char* kRefusedKey = "ddp_refused";
  std::string location_;
  std::string prefix_;
  std::unique_ptr<gloo::rendezvous::Store> base_;
  std::unique_ptr<gloo::rendezvous::Store> prefixed_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;                  // set() may be called from a stream's thread
  std::vector<std::string> written_;  // the keys set, as the base store names them
};

}  // namespace ddp
