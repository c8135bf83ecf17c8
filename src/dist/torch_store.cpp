// PyTorch's TCPStore, client side (see torch_store.h).
#include "dist/torch_store.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "dist/socket_io.h"

namespace tr::dist {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint8_t kValidate = 0;
constexpr uint32_t kValidateMagic = 0x3C85F7CE;
constexpr uint8_t kV1GetNumKeys = 6;
// Values larger than this are not ours (Gloo's addresses are a few hundred bytes).
constexpr uint64_t kMaxValue = uint64_t{16} << 20;

void put_u64(std::string& b, uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }
void put_string(std::string& b, const std::string& s) {
  put_u64(b, s.size());
  b += s;
}

// The protocol of the server at host:port: a GETNUMKEYS of the old numbering on a connection of its own is
// answered (8 bytes) by torch <= 2.1; 2.2+ closes the connection (its classic server: the first query was
// not VALIDATE) or holds the byte (its libuv server) - no reply within 2 s.
TorchStoreProtocol probe(const std::string& host, int port, Clock::time_point deadline,
                         const std::string& endpoint) {
  std::string last = "no attempt";
  const int fd = io::connect_until(host, port, deadline, last);
  TR_CHECK(fd >= 0, "could not reach torchrun's store at {} ({}): is the agent running?", endpoint, last);
  uint64_t keys = 0;
  bool answered = false;
  if (io::write_all(fd, &kV1GetNumKeys, 1)) {
    pollfd p{fd, POLLIN, 0};
    answered = ::poll(&p, 1, 2000) == 1 && io::read_all(fd, &keys, 8);
  }
  ::close(fd);
  return answered ? TorchStoreProtocol::v1 : TorchStoreProtocol::v2;
}

}  // namespace

TorchStoreProtocol parse_torch_store_protocol(const std::string& value) {
  if (value.empty()) return TorchStoreProtocol::detect;
  if (value == "1") return TorchStoreProtocol::v1;
  if (value == "2") return TorchStoreProtocol::v2;
  fail(
      "TRAINER_TORCH_STORE_PROTOCOL={}: expected 1 (torch 1.x to 2.1) or 2 (torch 2.2 and later), or unset "
      "to detect it",
      value);
}

TorchStoreClient::TorchStoreClient(const std::string& host, int port, Millis timeout, std::string prefix,
                                   TorchStoreProtocol protocol)
    : endpoint_(host + ":" + std::to_string(port)), prefix_(1, '/'), protocol_(protocol) {
  prefix_ += prefix;
  const auto deadline = Clock::now() + timeout;
  if (protocol_ == TorchStoreProtocol::detect) protocol_ = probe(host, port, deadline, endpoint_);
  std::string last = "no attempt";
  fd_ = io::connect_until(host, port, deadline, last);
  TR_CHECK(fd_ >= 0,
           "could not reach torchrun's store at {} within {} s ({}): is the agent running, and are "
           "MASTER_ADDR / MASTER_PORT its own?",
           endpoint_, timeout.count() / 1000.0, last);
  // A reply that never comes (a server that does not speak this protocol) is an error, not a hang.
  timeval tv{static_cast<time_t>(std::max<int64_t>(timeout.count() / 1000, 1)), 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (protocol_ == TorchStoreProtocol::v2) {
    char hello[5] = {static_cast<char>(kValidate)};
    std::memcpy(hello + 1, &kValidateMagic, 4);
    if (!io::write_all(fd_, hello, 5)) fail_io("the handshake");
  }
}

TorchStoreClient::~TorchStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void TorchStoreClient::fail_io(const char* what) const {
  fail(
      "torchrun's store at {} closed the connection or did not answer ({}): the agent ended, or it speaks "
      "another protocol than torch {}'s - set TRAINER_TORCH_STORE_PROTOCOL=1 for torch 1.x to 2.1, 2 for 2.2 "
      "and later",
      endpoint_, what, protocol_ == TorchStoreProtocol::v1 ? "<= 2.1" : ">= 2.2");
}

bool TorchStoreClient::send(Query q, const std::string& body) {
  // v1: SET 0, GET 2, ADD 3, CHECK 4; v2 shifts each by one (VALIDATE took 0).
  uint8_t op = q == Query::set ? 0 : q == Query::get ? 2 : q == Query::add ? 3 : 4;
  if (protocol_ == TorchStoreProtocol::v2) ++op;
  std::string msg(1, static_cast<char>(op));
  msg += body;
  return io::write_all(fd_, msg.data(), msg.size());
}

void TorchStoreClient::set(const std::string& key, const std::string& value) {
  std::string body;
  put_string(body, prefix_ + key);
  put_string(body, value);
  std::lock_guard<std::mutex> g(mu_);
  if (!send(Query::set, body)) fail_io("set");
}

bool TorchStoreClient::check(const std::vector<std::string>& keys) {
  std::string body;
  put_u64(body, keys.size());
  for (const auto& k : keys) put_string(body, prefix_ + k);
  std::lock_guard<std::mutex> g(mu_);
  uint8_t ready = 1;
  if (!send(Query::check, body) || !io::read_all(fd_, &ready, 1)) fail_io("check");
  return ready == 0;  // READY 0, NOT_READY 1
}

std::vector<std::string> TorchStoreClient::wait(const std::vector<std::string>& keys, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  Millis pause(1);
  while (!check(keys)) {
    if (Clock::now() >= deadline) {
      std::vector<std::string> missing;
      for (const auto& k : keys)
        if (!check({k})) missing.push_back(k);
      return missing;
    }
    std::this_thread::sleep_for(std::min(pause, std::chrono::duration_cast<Millis>(deadline - Clock::now())));
    pause = std::min(pause * 2, Millis(50));
  }
  return {};
}

std::optional<std::string> TorchStoreClient::get(const std::string& key, Millis timeout) {
  // GET of a missing key ends the connection on torch's classic server: wait for it first, as torch does.
  if (!wait({key}, timeout).empty()) return std::nullopt;
  std::string body;
  put_string(body, prefix_ + key);
  std::lock_guard<std::mutex> g(mu_);
  uint64_t n = 0;
  std::string v;
  if (!send(Query::get, body) || !io::read_all(fd_, &n, 8) || n > kMaxValue) fail_io("get");
  v.resize(n);
  if (n > 0 && !io::read_all(fd_, v.data(), n)) fail_io("get");
  return v;
}

int64_t TorchStoreClient::add(const std::string& key, int64_t delta) {
  std::string body;
  put_string(body, prefix_ + key);
  body.append(reinterpret_cast<const char*>(&delta), 8);
  std::lock_guard<std::mutex> g(mu_);
  int64_t sum = 0;
  if (!send(Query::add, body) || !io::read_all(fd_, &sum, 8)) fail_io("add");
  return sum;
}

}  // namespace tr::dist
