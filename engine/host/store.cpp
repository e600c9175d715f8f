// store.cpp — see store.h.
#include "store.h"

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/redis_store.h>

#include "error.h"

namespace ddp {

Store::Store(const std::string& location, const std::string& prefix,
             std::chrono::milliseconds timeout)
    : timeout_(timeout) {
  try {
    if (location.rfind("file:", 0) == 0) {
      base_ = std::make_unique<gloo::rendezvous::FileStore>(location.substr(5));
    } else if (location.rfind("redis:", 0) == 0) {
      std::string rest = location.substr(6);
      auto colon = rest.rfind(':');
      std::string host = colon == std::string::npos ? rest : rest.substr(0, colon);
      int port = colon == std::string::npos ? 6379 : std::stoi(rest.substr(colon + 1));
      base_ = std::make_unique<gloo::rendezvous::RedisStore>(host, port);
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

void Store::set(const std::string& key, const std::vector<char>& value) {
  try {
    prefixed_->set(key, value);
  } catch (const std::exception& e) {
    throw Error("rendezvous store: cannot set '" + key + "': " + e.what(), DDP_ERR_COMM);
  }
}

std::vector<char> Store::get(const std::string& key) {
  wait({key});
  try {
    return prefixed_->get(key);
  } catch (const std::exception& e) {
    throw Error("rendezvous store: cannot get '" + key + "': " + e.what(), DDP_ERR_COMM);
  }
}

void Store::wait(const std::vector<std::string>& keys) {
  try {
    prefixed_->wait(keys, timeout_);
  } catch (const std::exception& e) {
    throw Error("rendezvous store: timed out after " + std::to_string(timeout_.count()) +
                    " ms waiting for other ranks: " + e.what(),
                DDP_ERR_TIMEOUT);
  }
}

}  // namespace ddp
