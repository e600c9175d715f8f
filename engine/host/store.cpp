// store.cpp — see store.h.
#include "store.h"

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/redis_store.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "atomic_file.h"
#include "error.h"

namespace ddp {
namespace {

// Gloo's stores, with their protected check (does a key exist, without
// waiting) in reach.
class FileStore final : public gloo::rendezvous::FileStore {
 public:
  using gloo::rendezvous::FileStore::FileStore;
  // Gloo's own set renames its temporary into place whether or not the
  // write went through (a full disk leaves an empty value, which its
  // reader then rejects in words that do not say why): ours says why and
  // leaves nothing. The same file, so Gloo's get and check read it.
  void set(const std::string& key, const std::vector<char>& data) override {
    const std::string path = objectPath(key);
    write_file_atomically(path, std::string(data.begin(), data.end()));
    keyFilePaths_.push_back(path);  // as Gloo's set keeps them
  }
  bool holds(const std::vector<std::string>& keys) { return check(keys); }
  std::string remove(const std::string& key) {
    const std::string path = objectPath(key);
    if (std::remove(path.c_str()) == 0 || errno == ENOENT) return "";
    return path + ": " + std::strerror(errno);
  }
};

class RedisStore final : public gloo::rendezvous::RedisStore {
 public:
  // Every command gets `timeout` (hiredis's socket timeout), and a PING
  // first proves a Redis server answers: a server that accepts and never
  // answers would hang the ranks forever, and another program on the port
  // would show only as a protocol error later.
  RedisStore(const std::string& host, int port, std::chrono::milliseconds timeout)
      : gloo::rendezvous::RedisStore(host, port) {
    const std::string where = "rendezvous store redis:" + host + ":" + std::to_string(port);
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>(timeout.count() % 1000 * 1000);
    if (redisSetTimeout(redis_, tv) != REDIS_OK)
      throw Error(where + ": cannot set a timeout: " + redis_->errstr, DDP_ERR_COMM);
    auto* reply = static_cast<redisReply*>(redisCommand(redis_, "PING"));
    const int error = errno;  // hiredis's read timed out: EAGAIN
    const bool pong = reply && reply->type == REDIS_REPLY_STATUS && std::string(reply->str, reply->len) == "PONG";
    const std::string refusal = reply && reply->type == REDIS_REPLY_ERROR ? std::string(reply->str, reply->len) : "";
    if (reply) freeReplyObject(reply);
    if (pong) return;
    if (!refusal.empty())  // Redis itself says no: NOAUTH, DENIED (protected mode), LOADING
      throw Error(where + " refused the rendezvous: " + refusal, DDP_ERR_COMM);
    if (redis_->err == REDIS_ERR_IO && (error == EAGAIN || error == EWOULDBLOCK))
      throw Error(where + " accepted the connection but did not answer within " + std::to_string(timeout.count()) +
                      " ms: is a Redis server listening there?",
                  DDP_ERR_TIMEOUT);
    throw Error(where + " is not a Redis server (" + (redis_->errstr[0] ? redis_->errstr : "no PONG to a PING") +
                    "): is the port taken by another program?",
                DDP_ERR_COMM);
  }
  bool holds(const std::vector<std::string>& keys) { return check(keys); }
  std::string remove(const std::string& key) {
    auto* reply = static_cast<redisReply*>(redisCommand(redis_, "DEL %b", key.data(), key.size()));
    if (!reply) return "DEL " + key + ": " + (redis_->errstr[0] ? redis_->errstr : "no reply");
    const bool failed = reply->type == REDIS_REPLY_ERROR;
    const std::string why = failed ? std::string(reply->str, reply->len) : "";
    freeReplyObject(reply);
    return failed ? "DEL " + key + ": " + why : "";
  }
};

}  // namespace

Store::Store(const std::string& location, const std::string& prefix, std::chrono::milliseconds timeout)
    : location_(location), prefix_(prefix), timeout_(timeout) {
  try {
    if (location.rfind("file:", 0) == 0) {
      // Gloo's FileStore needs the directory to exist; any rank may make it.
      const std::string dir = location.substr(5);
      std::error_code ec;
      const bool in_the_way = std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec);
      if (!in_the_way) std::filesystem::create_directories(dir, ec);
      if (in_the_way || ec)
        throw Error("rendezvous store '" + location + "': cannot make the directory " + dir + ": " +
                        (in_the_way ? std::string("a file of that name is in the way") : ec.message()),
                    DDP_ERR_INVALID_ARGUMENT);
      base_ = std::make_unique<FileStore>(dir);
    } else if (location.rfind("redis:", 0) == 0) {
      std::string rest = location.substr(6);
      auto colon = rest.rfind(':');
      std::string host = colon == std::string::npos ? rest : rest.substr(0, colon);
      int port = colon == std::string::npos ? 6379 : std::stoi(rest.substr(colon + 1));
      base_ = std::make_unique<RedisStore>(host, port, timeout);
    } else {
      throw Error("rendezvous location '" + location + "' is neither file:<shared dir> nor redis:<host>:<port>",
                  DDP_ERR_INVALID_ARGUMENT);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("rendezvous store '" + location + "': " + e.what(), DDP_ERR_COMM);
  }
  prefixed_ = std::make_unique<gloo::rendezvous::PrefixStore>(prefix, *base_);
}

Store::~Store() = default;

// Every call into the base store holds mutex_ (a hiredis context and
// FileStore's bookkeeping are not thread-safe, and a plugin may use the
// store from a stream's thread); none holds it while waiting.
void Store::set(const std::string& key, const std::vector<char>& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    prefixed_->set(key, value);
  } catch (const std::exception& e) {
    throw Error("rendezvous store: cannot set '" + key + "': " + e.what(), DDP_ERR_COMM);
  }
  written_.push_back(prefix_ + "/" + key);  // as gloo's PrefixStore joins them
}

std::string Store::remove_written() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string failed;
  for (const std::string& key : written_) {
    std::string why;
    try {
      if (auto* file = dynamic_cast<FileStore*>(base_.get())) why = file->remove(key);
      if (auto* redis = dynamic_cast<RedisStore*>(base_.get())) why = redis->remove(key);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (failed.empty() && !why.empty()) failed = "cannot remove the rendezvous key " + why;
  }
  written_.clear();
  return failed;
}

std::vector<char> Store::get(const std::string& key) {
  wait({key});
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    return prefixed_->get(key);
  } catch (const std::exception& e) {
    throw Error("rendezvous store: cannot get '" + key + "': " + e.what(), DDP_ERR_COMM);
  }
}

void Store::wait(const std::vector<std::string>& keys) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (const std::string& key : keys) {
    for (;;) {
      bool there = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        try {
          there = holds(key);
        } catch (const std::exception& e) {
          throw Error("rendezvous store: cannot look up '" + key + "': " + e.what(), DDP_ERR_COMM);
        }
      }
      if (there) break;
      if (std::chrono::steady_clock::now() >= deadline)
        throw Error("rendezvous store: timed out after " + std::to_string(timeout_.count()) +
                        " ms waiting for other ranks: no key '" + key + "' yet",
                    DDP_ERR_TIMEOUT);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

bool Store::holds(const std::string& key) const {
  const std::vector<std::string> keys = {prefix_ + "/" + key};
  if (auto* file = dynamic_cast<FileStore*>(base_.get())) return file->holds(keys);
  if (auto* redis = dynamic_cast<RedisStore*>(base_.get())) return redis->holds(keys);
  return false;
}

namespace {
std::string fresh_nonce() {
  std::random_device device;
  char text[17];
  std::snprintf(text, sizeof text, "%08x%08x", device(), device());
  return text;
}
}  // namespace

// A refusal, posted where every rank waiting in claim() hears it (the first
// one stays: a Redis store refuses to set a key twice), then thrown.
void Store::refuse(int rank, const std::string& why) {
  const std::string posted = "rank " + std::to_string(rank) + " refused the run: " + why;
  try {
    set(kRefusedKey, std::vector<char>(posted.begin(), posted.end()));
  } catch (const std::exception&) {  // another rank's refusal came first, or the store is gone
  }
  throw Error(why, DDP_ERR_INVALID_ARGUMENT);
}

// Waits for `key` until `deadline`, as wait() does, but hears a rank's
// refusal, and says on timeout who did not come (`missing`).
void Store::await(const std::string& key, const std::string& missing, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    bool there = false;
    bool refused = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      try {
        there = holds(key);
        refused = !there && holds(kRefusedKey);
      } catch (const std::exception& e) {
        throw Error("rendezvous store: cannot look up '" + key + "': " + e.what(), DDP_ERR_COMM);
      }
    }
    if (there) return;
    if (refused) {
      const std::vector<char> why = get(kRefusedKey);
      throw Error(std::string(why.begin(), why.end()), DDP_ERR_INVALID_ARGUMENT);
    }
    if (std::chrono::steady_clock::now() >= deadline)
      throw Error("rendezvous store " + location_ + ": " + missing + " within " + std::to_string(timeout_.count()) +
                      " ms (is every rank started, with the same rendezvous and run id '" + prefix_ + "'?)",
                  DDP_ERR_TIMEOUT);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void Store::claim(int rank, int world_size) {
  const std::string key = "ddp_started_" + std::to_string(rank);
  bool taken = false;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    taken = holds(key) || holds(kRefusedKey);
  } catch (const std::exception&) {  // a store that cannot answer fails at its first use instead
  }
  if (taken)
    refuse(rank, "the rendezvous store " + location_ + " already holds a run named '" + prefix_ +
                     "' (keys an earlier run left): give each run a fresh directory, or a DDP_RUN_ID of its own");
  // Keys named by a nonce of this run cannot be an earlier run's: rank 0
  // admits each rank's nonce, each rank answers rank 0's, and once every
  // rank has, rank 0 says go; until then any rank's refusal reaches all.
  // One deadline for all of it: the run's timeout.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  const std::string nonce = fresh_nonce();
  set(key, std::vector<char>(nonce.begin(), nonce.end()));
  if (world_size <= 1) return;
  if (rank == 0) {
    for (int r = 1; r < world_size; ++r) {
      await("ddp_started_" + std::to_string(r), "rank " + std::to_string(r) + " did not join", deadline);
      const std::vector<char> theirs = get("ddp_started_" + std::to_string(r));
      set("ddp_admit_" + std::string(theirs.begin(), theirs.end()), std::vector<char>(nonce.begin(), nonce.end()));
    }
    for (int r = 1; r < world_size; ++r)
      await("ddp_joined_" + nonce + "_" + std::to_string(r), "rank " + std::to_string(r) + " did not answer", deadline);
    set("ddp_go_" + nonce, {'1'});
    return;
  }
  await("ddp_admit_" + nonce, "rank 0 did not admit this rank", deadline);
  const std::vector<char> admitted = get("ddp_admit_" + nonce);
  const std::string zeros(admitted.begin(), admitted.end());
  set("ddp_joined_" + zeros + "_" + std::to_string(rank), {'1'});
  await("ddp_go_" + zeros, "not every rank joined", deadline);
}

}  // namespace ddp
