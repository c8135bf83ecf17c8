// The rendezvous key-value store, served over TCP at MASTER_ADDR:MASTER_PORT by node 0's `trainer launch`
// (or by rank 0 when another launcher started the ranks) - torch's TCPStore role; Gloo's packaged stores are
// file/hash/redis only. Ranks publish and wait for keys through it: their
// arrival, their world size, and Gloo's transport addresses. Every wait has a deadline and names what is
// missing when it passes.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tr::dist {

using Millis = std::chrono::milliseconds;

// The server: a listening socket on all interfaces, a thread per connection.
class StoreServer {
 public:
  // Throws naming the port when it cannot be bound (in use by another run, or privileged).
  explicit StoreServer(int port);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const { return port_; }

 private:
  struct State;
  void accept_loop();
  int port_ = 0;
  int listen_fd_ = -1;
  std::shared_ptr<State> state_;
  std::thread acceptor_;
};

// What the rendezvous needs of a key-value store: ours (StoreClient) or torchrun's agent store
// (TorchStoreClient, torch_store.h). Keys are the caller's; each client adds its own prefix.
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The key's value once it is set, or nullopt when `timeout` passes first.
  virtual std::optional<std::string> get(const std::string& key, Millis timeout) = 0;
  // Adds `delta` to the integer stored at key (absent: 0) and returns the sum.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key is set; returns the keys still missing when `timeout` passed (empty: all there).
  virtual std::vector<std::string> wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  // host:port, for messages.
  virtual const std::string& endpoint() const = 0;
};

// One rank's (or launcher's) connection to the server.
class StoreClient final : public Store {
 public:
  // Connects to host:port, retrying until `timeout` (the server may start later than this client). Every key
  // is read and written under `prefix` (an attempt's own: "attempt/2/").
  StoreClient(const std::string& host, int port, Millis timeout, std::string prefix = "");
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::vector<std::string> wait(const std::vector<std::string>& keys, Millis timeout) override;
  const std::string& endpoint() const override { return endpoint_; }

 private:
  std::optional<std::string> request(char op, const std::string& key, const std::string& value, int64_t arg);
  std::mutex mu_;  // one request at a time on the socket
  int fd_ = -1;
  std::string endpoint_, prefix_;
};

}  // namespace tr::dist
