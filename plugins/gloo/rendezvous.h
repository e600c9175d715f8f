// rendezvous.h — how gloo ranks meet: the engine's rendezvous store as
// Gloo's (HostStore; a group's communicator meets under its tag through a
// gloo::rendezvous::PrefixStore over it), and the check that the address
// this rank listens on can be reached by the others. Header-only, part of
// the gloo plugin (included by gloo_transport.cpp alone). Not here: the
// connecting itself (gloo_init and gloo_split).
#pragma once

#include <ddp/plugin.h>
#include <ddp/plugin.hpp>
#include <ddp/transport.hpp>

#include <gloo/rendezvous/store.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp_gloo {

// Gloo's rendezvous, through the engine's store (so every transport meets the
// same way, and the engine decides where: a file store, or Redis).
class HostStore final : public gloo::rendezvous::Store {
 public:
  explicit HostStore(const ddp_host* host) : host_(host) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    if (host_->store_set(host_->ctx, key.c_str(), data.data(), data.size()) != DDP_OK)
      throw std::runtime_error("store set '" + key + "' failed");
  }
  std::vector<char> get(const std::string& key) override {
    void* data = nullptr;
    size_t bytes = 0;
    if (host_->store_get(host_->ctx, key.c_str(), &data, &bytes) != DDP_OK)
      throw ddp::plugin::Failure(DDP_ERR_TIMEOUT, "timed out waiting for rendezvous key '" + key + "'");
    std::vector<char> out(static_cast<char*>(data), static_cast<char*>(data) + bytes);
    std::free(data);
    return out;
  }
  void wait(const std::vector<std::string>& keys) override {
    std::vector<const char*> raw;
    for (const auto& k : keys) raw.push_back(k.c_str());
    if (host_->store_wait(host_->ctx, raw.data(), raw.size()) != DDP_OK)
      throw ddp::plugin::Failure(DDP_ERR_TIMEOUT, "no answer from the other ranks within " +
                                                      std::to_string(host_->timeout_ms) +
                                                      " ms (is every rank started, with the same rendezvous?)");
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    wait(keys);  // the engine's store applies the run's timeout
  }

 private:
  const ddp_host* host_;
};

// The address this rank listens on (transport.hostname) must resolve, and
// a loopback one serves only ranks on this machine: rank 0 publishes its
// host name and whether it listens on loopback, and a rank on another host
// where either side does is refused at once instead of timing out.
inline ddp_status check_listen_address(const ddp_host* host, const std::string& hostname) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(hostname.c_str(), nullptr, &hints, &found))
    return ddp::plugin::fail(host, DDP_ERR_INVALID_ARGUMENT,
                             "transport.hostname '" + hostname + "' does not resolve (" + gai_strerror(rc) + ")");
  bool loopback = false;
  for (const addrinfo* a = found; a; a = a->ai_next) {
    if (a->ai_family == AF_INET)
      loopback |= (ntohl(reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    if (a->ai_family == AF_INET6)
      loopback |= IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr);
  }
  freeaddrinfo(found);
  if (host->world_size == 1) return DDP_OK;
  char mine[256] = {};
  gethostname(mine, sizeof mine - 1);
  HostStore store(host);
  if (host->rank == 0) {
    const std::string entry = std::string(loopback ? "1" : "0") + mine;
    store.set("ddp_host_0", std::vector<char>(entry.begin(), entry.end()));
    return DDP_OK;
  }
  const std::vector<char> got = store.get("ddp_host_0");
  const bool first_loopback = !got.empty() && got[0] == '1';
  const std::string first(got.begin() + (got.empty() ? 0 : 1), got.end());
  if (first == mine || (!loopback && !first_loopback)) return DDP_OK;
  const std::string where = "this rank runs on host '" + std::string(mine) + "', rank 0 on '" + first + "', but ";
  if (loopback)
    return ddp::plugin::fail(host, DDP_ERR_INVALID_ARGUMENT,
                             where + "transport.hostname is '" + hostname +
                                 "', a loopback address the other hosts cannot reach: set it to this host's address");
  return ddp::plugin::fail(host, DDP_ERR_INVALID_ARGUMENT,
                           where +
                               "rank 0 listens on a loopback address this host cannot reach: set rank 0's "
                               "transport.hostname to its host's address");
}

}  // namespace ddp_gloo
