// Blocking TCP helpers the rendezvous stores share (store.cpp, torch_store.cpp): whole writes and reads
// across partial transfers and signals, and a connect that retries until a deadline (a server may come up
// after its clients).
#pragma once
#include <chrono>
#include <cstddef>
#include <string>

namespace tr::dist::io {

// false when the peer closed or the socket failed (no SIGPIPE).
bool write_all(int fd, const void* p, size_t n);
bool read_all(int fd, void* p, size_t n);
// A connected TCP socket (TCP_NODELAY: small requests, one round trip each) to host:port, retried every
// 50 ms until `deadline`; -1 when it passed, with the last error in `last`. Throws naming MASTER_ADDR when
// the host name does not resolve.
int connect_until(const std::string& host, int port, std::chrono::steady_clock::time_point deadline,
                  std::string& last);

}  // namespace tr::dist::io
