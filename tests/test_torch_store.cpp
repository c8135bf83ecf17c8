// Our client of PyTorch's TCPStore (dist/torch_store.h) against a stand-in server with torch's rules for
// both query numberings: the bytes of each request equal those captured from torch 1.13 and 2.6's own
// clients (Python TCPStore through a hex-dumping proxy), the protocol probe tells the two apart (and never
// sends 2.2's handshake to an old server), waits poll without leaving a WAIT pending, and a Gloo group of
// three ranks meets through it as under real torchrun (TORCHELASTIC_USE_AGENT_STORE=True). The real
// torchrun run is tests/launcher_compat.sh.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "dist/socket_io.h"
#include "dist/torch_store.h"
#include "dist_test_util.h"

namespace tr {
namespace {

using dist::TorchStoreProtocol;

std::string hex(const std::string& b) {
  static const char* d = "0123456789abcdef";
  std::string h;
  for (unsigned char c : b) h += {d[c >> 4], d[c & 15]};
  return h;
}

// A TCPStore server as torch's classic backend behaves (1.13 or 2.2+ numbering): SET, GET (a missing key
// closes the connection), ADD (decimal text), CHECK, GETNUMKEYS; 2.2+ requires VALIDATE with the magic as a
// connection's first query and closes it otherwise - or, as its libuv backend, holds such a query
// unanswered. Every byte each connection sent is kept, for the tests to compare with torch's own.
class FakeTorchStore {
 public:
  FakeTorchStore(int port, bool v2, bool libuv = false) : v2_(v2), libuv_(libuv) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 64) != 0)
      throw std::runtime_error("fake store: cannot listen");
    acceptor_ = std::thread([this] {
      for (;;) {
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) return;
        std::lock_guard<std::mutex> g(mu_);
        conns_.push_back(c);
        sent_.emplace_back();
        handlers_.emplace_back([this, c, i = sent_.size() - 1] { serve(c, i); });
      }
    });
  }
  ~FakeTorchStore() {
    ::shutdown(fd_, SHUT_RDWR);
    acceptor_.join();
    {
      std::lock_guard<std::mutex> g(mu_);
      for (int c : conns_) ::shutdown(c, SHUT_RDWR);
    }
    for (auto& t : handlers_) t.join();
    for (int c : conns_) ::close(c);
    ::close(fd_);
  }
  // What connection i sent, in hex.
  std::string sent(size_t i) {
    std::lock_guard<std::mutex> g(mu_);
    return i < sent_.size() ? hex(sent_[i]) : "";
  }
  size_t connections() {
    std::lock_guard<std::mutex> g(mu_);
    return sent_.size();
  }
  std::map<std::string, std::string> keys() {
    std::lock_guard<std::mutex> g(mu_);
    return kv_;
  }

 private:
  bool read(int c, size_t i, void* p, size_t n) {
    if (!dist::io::read_all(c, p, n)) return false;
    std::lock_guard<std::mutex> g(mu_);
    sent_[i].append(static_cast<const char*>(p), n);
    return true;
  }
  bool read_string(int c, size_t i, std::string& s) {
    uint64_t n = 0;
    if (!read(c, i, &n, 8) || n > (1u << 20)) return false;
    s.resize(n);
    return n == 0 || read(c, i, s.data(), n);
  }
  void serve(int c, size_t i) {
    bool validated = !v2_;
    for (;;) {
      uint8_t op = 0;
      if (!read(c, i, &op, 1)) return;
      if (!validated) {  // 2.2+: VALIDATE first, or the connection ends
        uint32_t magic = 0;
        if (op != 0 && libuv_) {  // unanswered until the client gives up
          while (read(c, i, &op, 1)) {
          }
          return;
        }
        if (op != 0 || !read(c, i, &magic, 4) || magic != 0x3C85F7CE) return ::shutdown(c, SHUT_RDWR), void();
        validated = true;
        continue;
      }
      const int q = v2_ ? op - 1 : op;  // the 1.13 numbering: SET 0, GET 2, ADD 3, CHECK 4, GETNUMKEYS 6
      std::string key, value, reply;
      if (q == 0) {
        if (!read_string(c, i, key) || !read_string(c, i, value)) return;
        std::lock_guard<std::mutex> g(mu_);
        kv_[key] = value;
        continue;
      } else if (q == 2) {
        if (!read_string(c, i, key)) return;
        std::lock_guard<std::mutex> g(mu_);
        if (kv_.count(key) == 0) return ::shutdown(c, SHUT_RDWR), void();
        const uint64_t n = kv_[key].size();
        reply.assign(reinterpret_cast<const char*>(&n), 8);
        reply += kv_[key];
      } else if (q == 3) {
        int64_t d = 0;
        if (!read_string(c, i, key) || !read(c, i, &d, 8)) return;
        std::lock_guard<std::mutex> g(mu_);
        const int64_t sum = (kv_.count(key) ? std::stoll(kv_[key]) : 0) + d;
        kv_[key] = std::to_string(sum);
        reply.assign(reinterpret_cast<const char*>(&sum), 8);
      } else if (q == 4) {
        uint64_t n = 0;
        if (!read(c, i, &n, 8)) return;
        bool all = true;
        for (uint64_t k = 0; k < n; ++k) {
          if (!read_string(c, i, key)) return;
          std::lock_guard<std::mutex> g(mu_);
          all = all && kv_.count(key) > 0;
        }
        reply.assign(1, all ? '\0' : '\1');
      } else if (q == 6) {
        std::lock_guard<std::mutex> g(mu_);
        const int64_t n = static_cast<int64_t>(kv_.size());
        reply.assign(reinterpret_cast<const char*>(&n), 8);
      } else {
        return ::shutdown(c, SHUT_RDWR), void();  // unknown query: torch closes the connection
      }
      if (!dist::io::write_all(c, reply.data(), reply.size())) return;
    }
  }
  bool v2_, libuv_;
  int fd_ = -1;
  std::mutex mu_;
  std::map<std::string, std::string> kv_;
  std::vector<int> conns_;
  std::vector<std::string> sent_;
  std::vector<std::thread> handlers_;
  std::thread acceptor_;
};

// The requests of set("k1", "hello"), add("cnt", 5), and a get of "k1" (CHECK, then GET) are torch's own
// bytes (captured from Python's TCPStore client; it sends WAIT where we send CHECK before GET).
TEST(TorchStore, RequestsAreTorchsBytesInBothNumberings) {
  for (const bool v2 : {false, true}) {
    SCOPED_TRACE(v2 ? "torch 2.2+" : "torch 1.x");
    const int port = test::test_port(v2 ? 61 : 62);
    FakeTorchStore server(port, v2);
    {
      dist::TorchStoreClient c("127.0.0.1", port, dist::Millis(5000), "",
                               v2 ? TorchStoreProtocol::v2 : TorchStoreProtocol::v1);
      c.set("k1", "hello");
      EXPECT_EQ(c.add("cnt", 5), 5);
      EXPECT_EQ(c.get("k1", dist::Millis(1000)), "hello");
    }
    const std::string set =
        (v2 ? "01" : "00") + std::string("03000000000000002f6b31050000000000000068656c6c6f");
    const std::string add = (v2 ? "04" : "03") + std::string("04000000000000002f636e740500000000000000");
    const std::string check = (v2 ? "05" : "04") + std::string("010000000000000003000000000000002f6b31");
    const std::string get = (v2 ? "03" : "02") + std::string("03000000000000002f6b31");
    EXPECT_EQ(server.sent(0), (v2 ? "00cef7853c" : "") + set + add + check + get);
    EXPECT_EQ(server.keys().at("/cnt"), "5");  // ADD keeps decimal text, as torch's server
  }
}

// The probe: a lone GETNUMKEYS of the old numbering, answered by torch <= 2.1 and refused by 2.2+ - so
// the handshake never reaches an old server (where it would read as a SET with a huge key).
TEST(TorchStore, TheProbeTellsTheNumberingsApart) {
  for (const int kind : {0, 1, 2}) {  // torch <= 2.1, 2.2+ classic, 2.2+ libuv (no reply: 2 s)
    SCOPED_TRACE(kind);
    const bool v2 = kind > 0;
    const int port = test::test_port(70 + kind);
    FakeTorchStore server(port, v2, kind == 2);
    dist::TorchStoreClient c("127.0.0.1", port, dist::Millis(5000), "trainer/none/attempt_0/");
    EXPECT_EQ(c.protocol(), v2 ? TorchStoreProtocol::v2 : TorchStoreProtocol::v1);
    c.set("x", "1");
    EXPECT_EQ(c.get("x", dist::Millis(1000)), "1");  // (a SET has no reply: this one orders the check below)
    EXPECT_EQ(server.keys().count("/trainer/none/attempt_0/x"), 1u);  // "/" + prefix + key, as torch's
    ASSERT_EQ(server.connections(), 2u);
    EXPECT_EQ(server.sent(0), "06");  // the probe's connection: one byte, nothing more
    EXPECT_EQ(server.sent(1).substr(0, 10), v2 ? "00cef7853c" : "0019000000");
  }
}

// A missing key times out on our side (CHECK polled; no GET that would end the connection), names what is
// missing, and the connection serves on; a key set meanwhile is found.
TEST(TorchStore, WaitsTimeOutCleanlyAndSeeLateKeys) {
  const int port = test::test_port(65);
  FakeTorchStore server(port, true);
  dist::TorchStoreClient a("127.0.0.1", port, dist::Millis(5000), "p/", TorchStoreProtocol::v2),
      b("127.0.0.1", port, dist::Millis(5000), "p/", TorchStoreProtocol::v2);
  EXPECT_FALSE(a.get("absent", dist::Millis(100)).has_value());
  b.set("there", "1");
  EXPECT_EQ(a.wait({"there", "absent"}, dist::Millis(100)), std::vector<std::string>{"absent"});
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    b.set("late", std::string("v\0w", 3));
  });
  EXPECT_EQ(a.get("late", dist::Millis(5000)), std::string("v\0w", 3));
  late.join();
  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", -5), -3);
}

// Nobody listening, or a server that closes on our queries: one message naming the store and the
// protocol variable, no hang.
TEST(TorchStore, UnreachableOrForeignServersAreNamed) {
  try {
    dist::TorchStoreClient c("127.0.0.1", test::test_port(69), dist::Millis(300), "", TorchStoreProtocol::v1);
    ADD_FAILURE() << "connected to nothing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("could not reach torchrun's store at 127.0.0.1:"), std::string::npos)
        << e.what();
  }
  const int port = test::test_port(67);
  FakeTorchStore server(port, true);  // 2.2+, but told 1.x: the server drops the connection
  dist::TorchStoreClient c("127.0.0.1", port, dist::Millis(2000), "", TorchStoreProtocol::v1);
  try {
    c.add("n", 1);
    ADD_FAILURE() << "a foreign server answered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TRAINER_TORCH_STORE_PROTOCOL=1 for torch 1.x to 2.1"),
              std::string::npos)
        << e.what();
  }
}

// Three ranks meet through torch's store as under torchrun (rank 0 serves nothing), then reduce.
TEST(TorchStore, AGlooGroupMeetsThroughTorchrunsStore) {
  const int port = test::test_port(68);
  FakeTorchStore server(port, true);
  test::with_group(
      3, port,
      [](int r, dist::ProcessGroup& g) {
        float x = static_cast<float>(r + 1);
        g.all_reduce_sum(&x, 1);
        EXPECT_EQ(x, 6.0f);
      },
      [](dist::DistEnv& e) {
        e.store_host = dist::StoreHost::torch_agent;
        e.run_id = "job";
      });
  EXPECT_EQ(server.keys().count("/trainer/job/attempt_0/arrived/2"), 1u);
}

}  // namespace
}  // namespace tr
