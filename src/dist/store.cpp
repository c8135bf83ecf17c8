// The TCP rendezvous store; see store.h. Wire format, one request and one reply at a time per connection:
// request = op (1 byte: s set, g get, a add) | key length (u32) | key | value length (u64) | value | arg
// (i64: get's timeout in ms, add's delta); reply = found (1 byte) | length (u64) | value.
#include "dist/store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>

#include "core/error.h"
#include "dist/socket_io.h"

namespace tr::dist {

namespace {

using io::read_all;
using io::write_all;

// Our keys are short and values at most a few KiB (Gloo's addresses): anything larger is not one of ours.
constexpr uint64_t kMaxKey = 4096, kMaxValue = uint64_t{16} << 20;

bool read_string(int fd, std::string& s, uint64_t n) {
  if (n > kMaxValue) return false;
  s.resize(n);
  return n == 0 || read_all(fd, s.data(), n);
}

bool write_reply(int fd, bool found, const std::string& v) {
  const char f = found ? 1 : 0;
  const uint64_t n = v.size();
  return write_all(fd, &f, 1) && write_all(fd, &n, 8) && write_all(fd, v.data(), v.size());
}

}  // namespace

struct StoreServer::State {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;
  bool closing = false;
  std::vector<int> fds;
  std::vector<std::thread> handlers;

  void serve(int fd) {
    for (;;) {
      char op = 0;
      uint32_t klen = 0;
      uint64_t vlen = 0;
      int64_t arg = 0;
      std::string key, value;
      // A stray client (a port scanner, an HTTP probe) is dropped at its first byte that is not ours.
      if (!read_all(fd, &op, 1) || (op != 's' && op != 'g' && op != 'a') || !read_all(fd, &klen, 4) ||
          klen > kMaxKey || !read_string(fd, key, klen) || !read_all(fd, &vlen, 8) ||
          !read_string(fd, value, vlen) || !read_all(fd, &arg, 8))
        return;
      std::unique_lock<std::mutex> lk(mu);
      bool ok = true;
      std::string reply;
      if (op == 's') {
        kv[key] = value;
        cv.notify_all();
      } else if (op == 'a') {
        int64_t sum = arg;
        if (auto it = kv.find(key); it != kv.end()) sum += std::strtoll(it->second.c_str(), nullptr, 10);
        reply = kv[key] = std::to_string(sum);
        cv.notify_all();
      } else if (op == 'g') {
        const auto deadline = std::chrono::steady_clock::now() +
                              Millis(std::clamp<int64_t>(arg, 0, int64_t{1} << 40));  // no overflow
        ok = cv.wait_until(lk, deadline, [&] { return closing || kv.count(key) > 0; }) && !closing;
        if (ok) reply = kv[key];
      }
      lk.unlock();
      if (!write_reply(fd, ok, reply)) return;
    }
  }
};

StoreServer::StoreServer(int port) : port_(port), state_(std::make_shared<State>()) {
  listen_fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool v6 = listen_fd_ >= 0;
  if (!v6) listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TR_CHECK(listen_fd_ >= 0, "rendezvous store: socket: {}", std::strerror(errno));
  const int one = 1, zero = 0;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = 0;
  if (v6) {  // dual-stack: IPv4 and IPv6 clients alike
    ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc != 0 || ::listen(listen_fd_, 1024) != 0) {
    const int e = errno;
    ::close(listen_fd_);
    fail("cannot serve the rendezvous store on port {} (MASTER_PORT / --master_port): {}{}", port,
         std::strerror(e), e == EADDRINUSE ? " - another run or process holds it; choose another port" : "");
  }
  acceptor_ = std::thread([this] { accept_loop(); });
}

void StoreServer::accept_loop() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {  // wait for room
        std::this_thread::sleep_for(Millis(50));
        std::lock_guard<std::mutex> g(state_->mu);
        if (state_->closing) return;
        continue;
      }
      return;  // shut down
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> g(state_->mu);
    if (state_->closing) {
      ::close(fd);
      return;
    }
    state_->fds.push_back(fd);
    state_->handlers.emplace_back([s = state_, fd] {
      try {
        s->serve(fd);
      } catch (const std::exception&) {  // out of memory for a request: that connection ends, not rank 0
      }
      ::shutdown(fd, SHUT_RDWR);  // the client sees the end; the descriptor is closed with the server
    });
  }
}

StoreServer::~StoreServer() {
  {
    std::lock_guard<std::mutex> g(state_->mu);
    state_->closing = true;
    state_->cv.notify_all();
  }
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listen_fd_);
  std::vector<std::thread> handlers;
  {
    std::lock_guard<std::mutex> g(state_->mu);
    for (int fd : state_->fds) ::shutdown(fd, SHUT_RDWR);
    handlers.swap(state_->handlers);
  }
  for (auto& t : handlers) t.join();
  for (int fd : state_->fds) ::close(fd);
}

StoreClient::StoreClient(const std::string& host, int port, Millis timeout, std::string prefix)
    : endpoint_(host + ":" + std::to_string(port)), prefix_(std::move(prefix)) {
  std::string last = "no attempt";
  fd_ = io::connect_until(host, port, std::chrono::steady_clock::now() + timeout, last);
  TR_CHECK(fd_ >= 0,
           "could not reach the rendezvous store at {} within {} s ({}): is node 0 (its trainer launch, or "
           "rank 0) running, and are --master_addr / --master_port (MASTER_ADDR / MASTER_PORT) right?",
           endpoint_, timeout.count() / 1000.0, last);
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<std::string> StoreClient::request(char op, const std::string& name, const std::string& value,
                                                int64_t arg) {
  std::lock_guard<std::mutex> g(mu_);
  const std::string key = prefix_ + name;
  const uint32_t klen = static_cast<uint32_t>(key.size());
  const uint64_t vlen = value.size();
  char found = 0;
  uint64_t n = 0;
  std::string reply;
  const bool ok = write_all(fd_, &op, 1) && write_all(fd_, &klen, 4) && write_all(fd_, key.data(), klen) &&
                  write_all(fd_, &vlen, 8) && write_all(fd_, value.data(), vlen) && write_all(fd_, &arg, 8) &&
                  read_all(fd_, &found, 1) && read_all(fd_, &n, 8) && read_string(fd_, reply, n);
  TR_CHECK(ok, "the rendezvous store at {} closed the connection (its host ended?)", endpoint_);
  if (!found) return std::nullopt;
  return reply;
}

void StoreClient::set(const std::string& key, const std::string& value) { request('s', key, value, 0); }

std::optional<std::string> StoreClient::get(const std::string& key, Millis timeout) {
  return request('g', key, "", timeout.count());
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  return std::stoll(*request('a', key, "", delta));
}

std::vector<std::string> StoreClient::wait(const std::vector<std::string>& keys, Millis timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    if (!get(k, std::max(left, Millis(0)))) missing.push_back(k);
  }
  return missing;
}

}  // namespace tr::dist
