// The rendezvous and the Gloo process group; see process_group.h.
#include "dist/process_group.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "backend/cuda_api.h"
#include "core/error.h"
#include "dist/store.h"

namespace tr::dist {

CommBackend parse_comm_backend(const std::string& name) {
  if (name == "gloo") return CommBackend::gloo;
  if (name == "nccl") return CommBackend::nccl;
  fail("--ddp_backend {}: expected gloo (CPUs; any device through host copies) or nccl (GPUs)", name);
}

const char* comm_backend_name(CommBackend b) { return b == CommBackend::gloo ? "gloo" : "nccl"; }

namespace {

using Clock = std::chrono::steady_clock;

// gather_v's slot tags (xor the caller's): gloo's own gather (which we do not call) uses tag 0 under the same
// prefix.
constexpr uint32_t kGatherVTag = 0x67760000;

// Gloo's rendezvous reads and writes keys through this adapter onto our TCP store, under a prefix.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(dist::Store& c, Millis timeout, std::string prefix = "gloo/")
      : c_(c), timeout_(timeout), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    c_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const auto v = c_.get(prefix_ + key, timeout_);
    TR_CHECK(v.has_value(), "rendezvous: Gloo's key {} did not appear in the store at {} within {} s", key,
             c_.endpoint(), timeout_.count() / 1000.0);
    return {v->begin(), v->end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> prefixed;
    for (const auto& k : keys) prefixed.push_back(prefix_ + k);
    const auto missing = c_.wait(prefixed, timeout);
    TR_CHECK(missing.empty(), "rendezvous: Gloo's key {} did not appear in the store at {} within {} s",
             missing.empty() ? "" : missing.front(), c_.endpoint(), timeout.count() / 1000.0);
  }

 private:
  dist::Store& c_;
  Millis timeout_;
  std::string prefix_;
};

// The address of this host that reaches `master` (the source address of a route to it): what peers on other
// nodes can connect to. GLOO_SOCKET_IFNAME (torch's name) picks an interface instead.
gloo::transport::tcp::attr transport_attr(const std::string& master, int port) {
  gloo::transport::tcp::attr attr;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
    attr.iface = ifname;
    return attr;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  TR_CHECK(::getaddrinfo(master.c_str(), std::to_string(port).c_str(), &hints, &res) == 0 && res != nullptr,
           "MASTER_ADDR {}: cannot resolve the host name", master);
  const int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  const bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  TR_CHECK(ok, "MASTER_ADDR {}: no route from this host ({})", master, std::strerror(errno));
  char host[NI_MAXHOST];
  TR_CHECK(::getnameinfo(reinterpret_cast<sockaddr*>(&local), len, host, sizeof host, nullptr, 0,
                         NI_NUMERICHOST) == 0,
           "cannot name this host's address towards MASTER_ADDR {}", master);
  attr.hostname = host;
  return attr;
}

// Every rank announces itself with its world size; all must arrive within the timeout, agree on the size,
// and no rank may be claimed twice.
void check_in(Store& c, const DistEnv& env, Millis timeout) {
  const std::string me = std::to_string(env.rank);
  const int64_t claims = c.add("claim/" + me, 1);
  TR_CHECK(claims == 1, "rendezvous at {}: RANK {} was started twice (check the launcher's ranks)",
           c.endpoint(), env.rank);
  c.set("arrived/" + me, std::to_string(env.world_size));
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back("arrived/" + std::to_string(r));
  const auto missing = c.wait(keys, timeout);
  if (!missing.empty()) {
    std::string who;
    for (const auto& k : missing) who += (who.empty() ? "" : ", ") + k.substr(k.find('/') + 1);
    fail("rendezvous at {}: rank{} {} of {} did not arrive within --ddp_timeout {} s", c.endpoint(),
         missing.size() > 1 ? "s" : "", who, env.world_size, timeout.count() / 1000.0);
  }
  for (int r = 0; r < env.world_size; ++r) {
    const auto w = c.get("arrived/" + std::to_string(r), timeout);
    TR_CHECK(w && *w == std::to_string(env.world_size),
             "rendezvous at {}: rank {} was started with WORLD_SIZE {}, rank {} with {}", c.endpoint(), r,
             w ? *w : "?", env.rank, env.world_size);
  }
}

// This rank's connection to the run's rendezvous store (DistEnv::store_host), rank 0 serving it into
// `server` when no launcher does. Under a launcher an attempt's keys are its own (a restarted group meets in
// the same store as fresh ranks); on torchrun's store ours stay apart from the agent's and PyTorch's.
std::unique_ptr<Store> connect_store(const DistEnv& env, Millis timeout,
                                     std::unique_ptr<StoreServer>& server) {
  switch (env.store_host) {
    case StoreHost::trainer_launch:
      return std::make_unique<StoreClient>(env.master_addr, env.master_port, timeout,
                                           fmt::format("attempt/{}/", env.restart_count));
    case StoreHost::torch_agent:
      return std::make_unique<TorchStoreClient>(
          env.master_addr, env.master_port, timeout,
          fmt::format("trainer/{}/attempt_{}/", env.run_id, env.restart_count), env.torch_store_protocol);
    case StoreHost::rank0: break;
  }
  if (env.rank == 0) server = std::make_unique<StoreServer>(env.master_port);
  return std::make_unique<StoreClient>(env.master_addr, env.master_port, timeout);
}

std::string rendezvous_note(const DistEnv& env, const Store& store) {
  if (env.store_host == StoreHost::torch_agent) {
    const auto* t = dynamic_cast<const TorchStoreClient*>(&store);
    return fmt::format("rendezvous through torchrun's store at {} (PyTorch's TCPStore protocol of torch {})",
                       store.endpoint(),
                       t != nullptr && t->protocol() == TorchStoreProtocol::v1 ? "1.x to 2.1" : "2.2+");
  }
  return fmt::format("rendezvous through the store at {}, served by {}", store.endpoint(),
                     env.store_host == StoreHost::trainer_launch ? "node 0's trainer launch" : "rank 0");
}

class GlooGroup final : public ProcessGroup {
 public:
  GlooGroup(const DistEnv& env, Millis timeout) : env_(env), timeout_(timeout) {
    client_ = connect_store(env, timeout, server_);
    check_in(*client_, env, timeout);
    rendezvous_ = rendezvous_note(env, *client_);
    try {
      dev_ = gloo::transport::tcp::CreateDevice(transport_attr(env.master_addr, env.master_port));
      auto ctx = std::make_shared<gloo::rendezvous::Context>(env.rank, env.world_size);
      ctx->setTimeout(timeout);
      GlooStore store(*client_, timeout);
      ctx->connectFullMesh(store, dev_);
      ctx_ = ctx;
      // Past this barrier no rank reads the store again, so rank 0 may close it whenever it ends.
      gloo::BarrierOptions o(ctx_);
      o.setTimeout(timeout);
      gloo::barrier(o);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail("rendezvous (gloo, rank {} of {}): connecting the ranks failed: {}", env.rank, env.world_size,
           e.what());
    }
  }
  int rank() const override { return env_.rank; }
  int size() const override { return env_.world_size; }
  const char* backend_name() const override { return "gloo"; }
  std::string rendezvous() const override { return rendezvous_; }

  // A sub-group over the parent's store and transport: the colors gathered, then the members of this
  // rank's color connected under a prefix of their own.
  std::unique_ptr<ProcessGroup> split(int color) override {
    TR_CHECK(client_ != nullptr, "split of a sub-group: split the whole group instead");
    std::vector<int> colors(static_cast<size_t>(env_.world_size));
    all_gather(&color, colors.data(), sizeof color);
    int sub_rank = 0, sub_size = 0;
    for (int r = 0; r < env_.world_size; ++r)
      if (colors[static_cast<size_t>(r)] == color) {
        if (r == env_.rank) sub_rank = sub_size;
        ++sub_size;
      }
    const std::string prefix = fmt::format("gloo-split/{}/{}/", splits_++, color);
    std::shared_ptr<gloo::Context> ctx;
    try {
      auto c = std::make_shared<gloo::rendezvous::Context>(sub_rank, sub_size);
      c->setTimeout(timeout_);
      GlooStore store(*client_, timeout_, prefix);
      c->connectFullMesh(store, dev_);
      ctx = c;
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail("process group split (gloo, rank {} of {}, color {}): connecting the ranks failed: {}", env_.rank,
           env_.world_size, color, e.what());
    }
    barrier();  // every sub-group connected: the store is not read again
    DistEnv sub = env_;
    sub.rank = sub_rank;
    sub.world_size = sub_size;
    return std::unique_ptr<ProcessGroup>(new GlooGroup(sub, timeout_, std::move(ctx), this));
  }

  void all_reduce_sum(float* data, size_t n) override { reduce(data, n); }
  void all_reduce_sum(double* data, size_t n) override { reduce(data, n); }

  void broadcast(void* data, size_t bytes, int root) override {
    run("broadcast", bytes, [&] {
      gloo::BroadcastOptions o(ctx_);
      o.setOutput(static_cast<char*>(data), bytes);
      o.setRoot(root);
      o.setTimeout(timeout_);
      gloo::broadcast(o);
    });
  }
  void all_gather(const void* in, void* out, size_t bytes) override {
    run("all_gather", bytes, [&] {
      gloo::AllgatherOptions o(ctx_);
      o.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes);
      o.setOutput(static_cast<char*>(out), bytes * static_cast<size_t>(env_.world_size));
      o.setTimeout(timeout_);
      gloo::allgather(o);
    });
  }
  void all_gather_v(const void* in, size_t bytes, void* out, const std::vector<size_t>& counts) override {
    TR_CHECK(counts.size() == static_cast<size_t>(env_.world_size) &&
                 counts[static_cast<size_t>(env_.rank)] == bytes,
             "all_gather_v: {} counts for {} ranks, this rank's {} for {} bytes", counts.size(),
             env_.world_size, counts.empty() ? 0 : counts[static_cast<size_t>(env_.rank)], bytes);
    run("all_gather_v", bytes, [&] {
      gloo::AllgathervOptions o(ctx_);
      o.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes);
      o.setOutput(static_cast<char*>(out), counts);
      o.setTimeout(timeout_);
      gloo::allgatherv(o);
    });
  }
  // gloo::gather's pattern with a count per rank: the root posts one receive per peer at its offset.
  void gather_v(const void* in, size_t bytes, void* out, const std::vector<size_t>& counts, int root,
                uint32_t tag) override {
    const auto me = static_cast<size_t>(env_.rank);
    size_t total = 0;
    for (size_t c : counts) total += c;
    TR_CHECK(counts.size() == static_cast<size_t>(env_.world_size) && counts[me] == bytes && root >= 0 &&
                 root < env_.world_size && (in != nullptr || bytes == 0) &&
                 (env_.rank != root || out != nullptr || total == 0),
             "gather_v: {} counts for {} ranks, this rank's {} for {} bytes, root {}", counts.size(),
             env_.world_size, counts.size() > me ? counts[me] : 0, bytes, root);
    run("gather_v", env_.rank == root ? total : bytes, [&] {
      const auto slot = gloo::Slot::build(gloo::kGatherSlotPrefix, kGatherVTag ^ tag);
      if (env_.rank != root) {
        if (bytes == 0) return;
        auto buf = ctx_->createUnboundBuffer(const_cast<void*>(in), bytes);
        buf->send(root, slot);
        buf->waitSend(timeout_);
        return;
      }
      if (total == 0) return;
      auto buf = ctx_->createUnboundBuffer(out, total);
      size_t at = 0;
      int posted = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        if (i == me) {
          if (bytes) std::memcpy(static_cast<char*>(out) + at, in, bytes);
        } else if (counts[i]) {
          buf->recv(static_cast<int>(i), slot, at, counts[i]);
          ++posted;
        }
        at += counts[i];
      }
      for (int i = 0; i < posted; ++i) buf->waitRecv(timeout_);
    });
  }
  void all_to_all(const void* in, void* out, size_t bytes) override {
    run("all_to_all", bytes * static_cast<size_t>(env_.world_size), [&] {
      gloo::AlltoallOptions o(ctx_);
      const size_t total = bytes * static_cast<size_t>(env_.world_size);
      o.setInput(const_cast<char*>(static_cast<const char*>(in)), total);
      o.setOutput(static_cast<char*>(out), total);
      o.setTimeout(timeout_);
      gloo::alltoall(o);
    });
  }
  void all_to_all_v(const float* in, const std::vector<int64_t>& send_counts, float* out,
                    const std::vector<int64_t>& recv_counts) override {
    int64_t sent = 0;
    for (int64_t c : send_counts) sent += c;
    run("all_to_all_v", static_cast<size_t>(sent) * sizeof(float), [&] {
      gloo::AlltoallvOptions o(ctx_);
      o.setInput(const_cast<float*>(in), send_counts);
      o.setOutput(out, recv_counts);
      o.setTimeout(timeout_);
      gloo::alltoallv(o);
    });
  }
  void barrier() override {
    run("barrier", 0, [&] {
      gloo::BarrierOptions o(ctx_);
      o.setTimeout(timeout_);
      gloo::barrier(o);
    });
  }

 private:
  template <typename T>
  void reduce(T* data, size_t n) {
    if (n == 0) return;
    run("all_reduce", n * sizeof(T), [&] {
      gloo::AllreduceOptions o(ctx_);
      o.setOutput(data, n);
      o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
      o.setTimeout(timeout_);
      gloo::allreduce(o);
    });
  }
  // Gloo reports a dead or stalled peer as an exception of its own: said here with the collective and the
  // timeout that applied.
  template <typename F>
  void run(const char* what, size_t bytes, F&& f) {
    const auto t0 = Clock::now();
    try {
      f();
    } catch (const std::exception& e) {
      fail(
          "{} (gloo, rank {} of {}) failed: a peer process ended, or stalled for more than --ddp_timeout "
          "{} s: {}",
          what, env_.rank, env_.world_size, timeout_.count() / 1000.0, e.what());
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    add_stats(bytes, seconds);
    if (parent_) parent_->add_stats(bytes, seconds);
  }

  // A sub-group (split): its own context, no store of its own.
  GlooGroup(const DistEnv& env, Millis timeout, std::shared_ptr<gloo::Context> ctx, GlooGroup* parent)
      : env_(env), timeout_(timeout), ctx_(std::move(ctx)), parent_(parent) {}

  DistEnv env_;
  Millis timeout_;
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<Store> client_;
  std::string rendezvous_;
  std::shared_ptr<gloo::transport::Device> dev_;
  std::shared_ptr<gloo::Context> ctx_;
  int splits_ = 0;               // splits made so far: each connects under a prefix of its own
  GlooGroup* parent_ = nullptr;  // a sub-group's traffic counts in its parent's stats too
};

// NCCL between one GPU per rank (cuda:LOCAL_RANK; backend::NcclComm): the ranks meet in the rendezvous store
// as Gloo's do, rank 0's NCCL unique id travels through it, then every collective is NCCL's over host buffers
// staged through the GPU. The variable gathers, gather_v and all_to_all are grouped sends and receives.
class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(const DistEnv& env, Millis timeout) : env_(env) {
    const int gpus = backend::cuda_device_count();
    TR_CHECK(gpus > 0, "--ddp_backend nccl: {}; use --ddp_backend gloo",
             backend::cuda_compiled() ? "no CUDA GPU is present" : "this build has no CUDA support");
    // The rank's GPU, as training_device picks it (cuda:LOCAL_RANK of those visible; with one visible GPU per
    // task, as srun --gpus-per-task gives, that one). NCCL refuses two ranks on one GPU itself.
    device_ = env.local_rank % gpus;
    store_ = connect_store(env, timeout, server_);
    check_in(*store_, env, timeout);
    rendezvous_ = rendezvous_note(env, *store_);
    if (env.rank == 0) store_->set("nccl/id", backend::NcclComm::unique_id());
    const auto id = store_->get("nccl/id", timeout);
    TR_CHECK(id.has_value(), "rendezvous at {}: rank 0's NCCL id did not arrive within --ddp_timeout {} s",
             store_->endpoint(), timeout.count() / 1000.0);
    comm_ = std::make_unique<backend::NcclComm>(device_, env.rank, env.world_size, *id, timeout);
    barrier();  // every rank connected: the store is not read again
  }
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  const char* backend_name() const override { return "nccl"; }
  std::string rendezvous() const override { return rendezvous_; }
  void all_reduce_sum(float* data, size_t n) override {
    timed(n * 4, [&] { comm_->all_reduce_sum(data, n, DType::f32); });
  }
  void all_reduce_sum(double* data, size_t n) override {
    timed(n * 8, [&] { comm_->all_reduce_sum(data, n, DType::f64); });
  }
  bool reads(Device d) const override { return d.is_cpu() || d == Device::cuda(device_); }
  void all_reduce_sum_on(Device d, float* data, size_t n,
                         const backend::ComputeFence* after = nullptr) override {
    if (!d.is_cuda()) return ProcessGroup::all_reduce_sum_on(d, data, n, after);
    check_device(d, "all_reduce_sum");
    timed(n * 4,
          [&] { comm_->all_reduce_sum_device(data, n, DType::f32, after ? after->event() : nullptr); });
  }
  void reduce_scatter_sum_on(Device d, const float* in, float* out, size_t n) override {
    if (!d.is_cuda()) return ProcessGroup::reduce_scatter_sum_on(d, in, out, n);
    check_device(d, "reduce_scatter_sum");
    timed(n * 4 * static_cast<size_t>(size()), [&] { comm_->reduce_scatter_sum_device(in, out, n); });
  }
  void reduce_blocks_on(Device d, const float* in, const std::vector<int64_t>& counts, float* out,
                        const backend::ComputeFence* after = nullptr) override {
    if (!d.is_cuda()) return ProcessGroup::reduce_blocks_on(d, in, counts, out, after);
    check_device(d, "reduce_blocks");
    TR_CHECK(counts.size() == static_cast<size_t>(size()), "reduce_blocks: {} counts for {} ranks",
             counts.size(), size());
    size_t bytes = 0;
    for (int64_t c : counts) bytes += static_cast<size_t>(c) * 4;
    timed(bytes, [&] { comm_->reduce_blocks_device(in, counts, out, after ? after->event() : nullptr); });
  }
  void all_gather_on(Device d, const void* in, void* out, size_t bytes) override {
    if (!d.is_cuda()) return ProcessGroup::all_gather_on(d, in, out, bytes);
    check_device(d, "all_gather");
    timed(bytes, [&] { comm_->all_gather_device(in, out, bytes); });
  }
  void all_gather_v_on(Device d, const void* in, size_t bytes, void* out,
                       const std::vector<size_t>& counts) override {
    if (!d.is_cuda()) return ProcessGroup::all_gather_v_on(d, in, bytes, out, counts);
    check_device(d, "all_gather_v");
    check_counts(counts, bytes, "all_gather_v");
    timed(bytes, [&] { comm_->all_gather_v_device(in, out, counts); });
  }
  void broadcast(void* data, size_t bytes, int root) override {
    timed(bytes, [&] { comm_->broadcast(data, bytes, root); });
  }
  void all_gather(const void* in, void* out, size_t bytes) override {
    timed(bytes, [&] { comm_->all_gather(in, out, bytes); });
  }
  void all_gather_v(const void* in, size_t bytes, void* out, const std::vector<size_t>& counts) override {
    check_counts(counts, bytes, "all_gather_v");
    // exchange() sends consecutive blocks, one per peer: this rank's block once for each.
    std::vector<char> each(bytes * counts.size());
    for (size_t j = 0; j < counts.size() && bytes > 0; ++j) std::memcpy(each.data() + j * bytes, in, bytes);
    timed(bytes,
          [&] { comm_->exchange(each.data(), std::vector<size_t>(counts.size(), bytes), out, counts); });
  }
  void gather_v(const void* in, size_t bytes, void* out, const std::vector<size_t>& counts, int root,
                uint32_t) override {  // (NCCL orders calls itself: no tag needed)
    check_counts(counts, bytes, "gather_v");
    TR_CHECK(root >= 0 && root < size(), "gather_v: root {} is not a rank of {}", root, size());
    std::vector<size_t> send(counts.size(), 0), recv(counts.size(), 0);
    send[static_cast<size_t>(root)] = bytes;
    if (rank() == root) recv = counts;
    timed(bytes, [&] { comm_->exchange(in, send, out, recv); });
  }
  void all_to_all(const void* in, void* out, size_t bytes) override {
    const std::vector<size_t> each(static_cast<size_t>(size()), bytes);
    timed(bytes * each.size(), [&] { comm_->exchange(in, each, out, each); });
  }
  void all_to_all_v(const float* in, const std::vector<int64_t>& send_counts, float* out,
                    const std::vector<int64_t>& recv_counts) override {
    std::vector<size_t> send, recv;
    size_t bytes = 0;
    for (int64_t c : send_counts) send.push_back(static_cast<size_t>(c) * 4), bytes += send.back();
    for (int64_t c : recv_counts) recv.push_back(static_cast<size_t>(c) * 4);
    timed(bytes, [&] { comm_->exchange(in, send, out, recv); });
  }
  void barrier() override {
    float one = 1.0f;
    timed(4, [&] { comm_->all_reduce_sum(&one, 1, DType::f32); });
  }
  std::unique_ptr<ProcessGroup> split(int color) override {
    TR_CHECK(color >= 0, "process group split over nccl: color {} (NCCL takes colors >= 0)", color);
    return std::unique_ptr<ProcessGroup>(new NcclGroup(comm_->split(color, rank()), this));
  }

 private:
  NcclGroup(std::unique_ptr<backend::NcclComm> comm, NcclGroup* parent)
      : env_(parent->env_), device_(parent->device_), comm_(std::move(comm)), parent_(parent) {}
  void check_device(Device d, const char* what) const {
    TR_CHECK(d == Device::cuda(device_), "NCCL {} over {}'s memory: this rank's communicator is on cuda:{}",
             what, d.str(), device_);
  }
  void check_counts(const std::vector<size_t>& counts, size_t bytes, const char* what) const {
    TR_CHECK(counts.size() == static_cast<size_t>(size()) && counts[static_cast<size_t>(rank())] == bytes,
             "{}: {} counts for {} ranks, this rank's {} (its block has {} bytes)", what, counts.size(),
             size(), counts.size() > static_cast<size_t>(rank()) ? counts[static_cast<size_t>(rank())] : 0,
             bytes);
  }
  template <typename F>
  void timed(size_t bytes, F&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    add_stats(bytes, seconds);
    if (parent_) parent_->add_stats(bytes, seconds);
  }
  DistEnv env_;
  int device_ = 0;
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<Store> store_;
  std::string rendezvous_;
  std::unique_ptr<backend::NcclComm> comm_;
  NcclGroup* parent_ = nullptr;  // a sub-group's traffic counts in its parent's stats too
};

class DryRunGroup final : public ProcessGroup {
 public:
  DryRunGroup(int world, bool device_memory) : world_(world), device_memory_(device_memory) {}
  bool reads(Device d) const override { return d.is_cpu() || (device_memory_ && d.is_meta()); }
  int rank() const override { return 0; }
  int size() const override { return world_; }
  const char* backend_name() const override { return "dry run"; }
  void all_reduce_sum(float*, size_t) override {}
  void all_reduce_sum(double*, size_t) override {}
  void broadcast(void*, size_t, int) override {}
  void all_gather(const void*, void*, size_t) override {}
  void all_gather_v(const void*, size_t, void*, const std::vector<size_t>&) override {}
  void gather_v(const void*, size_t, void*, const std::vector<size_t>&, int, uint32_t) override {}
  void all_to_all(const void*, void*, size_t) override {}
  void all_to_all_v(const float*, const std::vector<int64_t>&, float*, const std::vector<int64_t>&) override {
  }
  void barrier() override {}
  std::unique_ptr<ProcessGroup> split(int) override {
    fail("a dry-run group is not split: make the sub-group's dry run directly");
  }

 private:
  int world_;
  bool device_memory_;
};

}  // namespace

std::unique_ptr<ProcessGroup> dry_run_group(int world_size, bool device_memory) {
  TR_CHECK(world_size >= 1 && world_size <= (1 << 20), "a world of {} processes", world_size);
  return std::make_unique<DryRunGroup>(world_size, device_memory);
}

void ProcessGroup::reduce_scatter_sum(const float* in, float* out, size_t n, std::vector<float>& scratch) {
  const size_t world = static_cast<size_t>(size());
  scratch.resize(world * n);
  if (n == 0) return;
  all_to_all(in, scratch.data(), n * sizeof(float));
  std::copy(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(n), out);
  for (size_t r = 1; r < world; ++r) {
    const float* b = scratch.data() + r * n;
    for (size_t i = 0; i < n; ++i) out[i] += b[i];
  }
}

void ProcessGroup::reduce_blocks(const float* in, const std::vector<int64_t>& counts, float* out,
                                 std::vector<float>& scratch) {
  const size_t world = static_cast<size_t>(size());
  TR_CHECK(counts.size() == world, "reduce_blocks: {} counts for {} ranks", counts.size(), world);
  const int64_t mine = counts[static_cast<size_t>(rank())];
  scratch.resize(std::max<size_t>(world * static_cast<size_t>(mine), 1));
  all_to_all_v(in, counts, scratch.data(), std::vector<int64_t>(world, mine));
  for (int64_t k = 0; k < mine; ++k) {
    float sum = scratch[static_cast<size_t>(k)];
    for (size_t i = 1; i < world; ++i) sum += scratch[i * static_cast<size_t>(mine) + static_cast<size_t>(k)];
    out[k] = sum;
  }
}

// The host's memory (partitions included) through the host collectives: the same bits as host buffers.
namespace {
void check_host(Device d, const char* what) {
  TR_CHECK(d.is_cpu(), "{} over {}'s memory: this group's transport reads the host's memory only (stage it)",
           what, d.str());
}
}  // namespace

void ProcessGroup::all_reduce_sum_on(Device d, float* data, size_t n, const backend::ComputeFence*) {
  check_host(d, "all_reduce_sum");
  all_reduce_sum(data, n);
}

void ProcessGroup::reduce_scatter_sum_on(Device d, const float* in, float* out, size_t n) {
  check_host(d, "reduce_scatter_sum");
  std::vector<float> scratch;
  reduce_scatter_sum(in, out, n, scratch);
}

void ProcessGroup::reduce_blocks_on(Device d, const float* in, const std::vector<int64_t>& counts, float* out,
                                    const backend::ComputeFence*) {
  check_host(d, "reduce_blocks");
  std::vector<float> scratch;
  reduce_blocks(in, counts, out, scratch);
}

void ProcessGroup::all_gather_on(Device d, const void* in, void* out, size_t bytes) {
  check_host(d, "all_gather");
  all_gather(in, out, bytes);
}

void ProcessGroup::all_gather_v_on(Device d, const void* in, size_t bytes, void* out,
                                   const std::vector<size_t>& counts) {
  check_host(d, "all_gather_v");
  all_gather_v(in, bytes, out, counts);
}

std::unique_ptr<ProcessGroup> init_process_group(const DistEnv& env, CommBackend backend, Millis timeout) {
  // A world of one is a group too (torch's world_size=1): the trainer makes none for one process, tests do.
  TR_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size,
           "init_process_group: rank {} of a world of {}", env.rank, env.world_size);
  // A peer that dies mid-send would raise SIGPIPE in Gloo's (or the store's) socket writes and end this
  // process without a word; ignored, the write fails and the collective reports the dead peer (as Python).
  std::signal(SIGPIPE, SIG_IGN);
  if (backend == CommBackend::nccl) return std::make_unique<NcclGroup>(env, timeout);
  return std::make_unique<GlooGroup>(env, timeout);
}

}  // namespace tr::dist
