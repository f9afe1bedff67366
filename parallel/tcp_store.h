// A rendezvous Store over TCP: one TcpStoreServer (a background thread of the controller,
// or of a test) and any number of TcpStore clients in any process that can reach it.
// Blocking get/wait are answered by the server as soon as the key appears, or with the
// missing keys when their timeout passes, so a client never polls.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "parallel/sealed_channel.h"
#include "parallel/socket_util.h"
#include "parallel/store.h"

namespace keel {

// Splits "host:port" (or "[v6addr]:port"). Throws keel::InputError on a missing or empty
// host, or a port that is not a number in [0, 65535].
std::pair<std::string, int> parse_host_port(const std::string& addr);

// Serves the store from a background thread until stop() or destruction. Keys and values
// are arbitrary bytes; values written by add() are decimal integers.
class TcpStoreServer {
 public:
  // Listens on host:port (0: an ephemeral port, read it back with port()). Throws
  // keel::Error if the address cannot be bound.
  explicit TcpStoreServer(const std::string& host = "127.0.0.1", int port = 0);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const;
  // Closes every client connection (their pending and later calls throw CommError) and
  // joins the thread. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A client. Thread-safe: calls from several threads are serialised on one connection, so a
// blocking get() holds up other threads' calls until it returns.
class TcpStore : public Store {
 public:
  // Connects, retrying until connect_timeout (the server may start after the client);
  // throws CommTimeout if it cannot. connect_timeout also bounds how long a non-blocking
  // request (set, add) may wait for its reply.
  TcpStore(const std::string& host, int port,
           std::chrono::milliseconds connect_timeout = std::chrono::seconds(30));

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void erase(const std::vector<std::string>& keys,
             const std::vector<std::string>& prefixes) override;

  // Losing the server (it died, closed the connection, or stopped answering) throws
  // CommError, and every later call throws CommError too: build a new client.

 private:
  std::string request(const std::string& req, std::chrono::milliseconds reply_within);
  std::string wait_reply(const std::string& req, const std::vector<std::string>& keys,
                         std::chrono::milliseconds timeout);

  std::mutex mu_;
  std::string addr_;
  std::chrono::milliseconds op_timeout_;
  detail::Fd fd_;
  SealedChannel ch_;    // over fd_: sealed when the store is on another machine
  std::string broken_;  // why the connection is unusable; empty while it is fine
};

}  // namespace keel
