// A client of PyTorch's c10d TCPStore: the store torchrun's elastic agent serves at MASTER_ADDR:MASTER_PORT
// when it tells its workers TORCHELASTIC_USE_AGENT_STORE=True (static rendezvous in every torch version,
// c10d from about 2.5), so that `torchrun --no-python trainer train ...` meets there as PyTorch's own
// workers do instead of binding the agent's port. Wire format (little-endian, no envelope): a query byte,
// strings as u64 length + bytes, int64 values; torch 2.2 renumbered the queries (VALIDATE at 0 with a magic
// word as a connection's first query), so the version is probed once (a lone GETNUMKEYS of the old
// numbering: answered by <= 2.1, refused or left pending by 2.2+) or given (TRAINER_TORCH_STORE_PROTOCOL).
// Waits poll CHECK rather than leaving a server-side WAIT pending: torch <= 2.1 cannot cancel one, and its
// late reply would desynchronize the connection.
#pragma once
#include <mutex>
#include <string>

#include "dist/store.h"

namespace tr::dist {

enum class TorchStoreProtocol { detect, v1, v2 };  // v1: torch 1.x - 2.1; v2: 2.2+ (VALIDATE)

// The protocol a TRAINER_TORCH_STORE_PROTOCOL value names ("" -> detect, "1", "2"); throws naming it.
TorchStoreProtocol parse_torch_store_protocol(const std::string& value);

class TorchStoreClient final : public Store {
 public:
  // Connects (retrying until `timeout`: the agent may listen after its workers start) and probes the
  // protocol when asked to. Keys go on the wire as "/" + prefix + key (PyTorch's client adds the "/"; the
  // prefix keeps ours apart from the agent's and PyTorch workers' keys, and an attempt's from older ones).
  TorchStoreClient(const std::string& host, int port, Millis timeout, std::string prefix,
                   TorchStoreProtocol protocol = TorchStoreProtocol::detect);
  ~TorchStoreClient() override;
  TorchStoreClient(const TorchStoreClient&) = delete;
  TorchStoreClient& operator=(const TorchStoreClient&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::vector<std::string> wait(const std::vector<std::string>& keys, Millis timeout) override;
  const std::string& endpoint() const override { return endpoint_; }
  TorchStoreProtocol protocol() const { return protocol_; }

 private:
  enum class Query { set, get, add, check };
  // Writes the query byte of q in this protocol's numbering and the encoded fields; false on a closed
  // connection.
  bool send(Query q, const std::string& body);
  // Whether every key is set (one CHECK).
  bool check(const std::vector<std::string>& keys);
  void fail_io(const char* what) const;
  std::mutex mu_;  // one request and its reply at a time on the socket
  int fd_ = -1;
  std::string endpoint_, prefix_;
  TorchStoreProtocol protocol_;
};

}  // namespace tr::dist
