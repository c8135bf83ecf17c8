// NCCL communicators (cuda_api.h's NcclComm). libnccl.so.2 is opened at the first communicator (dlopen), so
// the binary starts where NCCL is absent and says so only when a run asks for it. Collectives run on the
// communicator's own stream - host data staged through a device buffer there, device data after an event of
// the compute stream - so the compute stream keeps running what other threads queue meanwhile (DDP's buckets
// beside the rest of backward, ZeRO-3's prefetched gathers beside the layer that runs). A wait polls the
// collective's event and ncclCommGetAsyncError, aborting the communicator past the deadline. Bound by the
// staging copies (host <-> device) beside NCCL's own transfer.
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/streams.h"
#include "backend/cuda_api.h"

namespace tr::backend {

namespace {

using Clock = std::chrono::steady_clock;

// The NCCL entry points we call, resolved once from libnccl.so.2.
struct Nccl {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank = nullptr;
  decltype(&ncclCommSplit) split = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclReduce) reduce = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclCommUserRank) user_rank = nullptr;
  decltype(&ncclCommCount) count = nullptr;
};

const Nccl& nccl() {
  static const Nccl n = [] {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
    TR_CHECK(
        lib != nullptr,
        "--ddp_backend nccl: cannot load NCCL (libnccl.so.2: {}); install it (the CUDA toolkit's, or pip's "
        "nvidia-nccl) and put its folder on LD_LIBRARY_PATH, or use --ddp_backend gloo",
        dlerror());
    Nccl f;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      TR_CHECK(fn != nullptr, "NCCL: libnccl.so.2 lacks {} (NCCL 2.18 or later is needed)", name);
    };
    get(f.get_unique_id, "ncclGetUniqueId");
    get(f.init_rank, "ncclCommInitRankConfig");
    get(f.split, "ncclCommSplit");
    get(f.abort, "ncclCommAbort");
    get(f.async_error, "ncclCommGetAsyncError");
    get(f.error_string, "ncclGetErrorString");
    get(f.all_reduce, "ncclAllReduce");
    get(f.broadcast, "ncclBroadcast");
    get(f.all_gather, "ncclAllGather");
    get(f.reduce_scatter, "ncclReduceScatter");
    get(f.reduce, "ncclReduce");
    get(f.send, "ncclSend");
    get(f.recv, "ncclRecv");
    get(f.group_start, "ncclGroupStart");
    get(f.group_end, "ncclGroupEnd");
    get(f.user_rank, "ncclCommUserRank");
    get(f.count, "ncclCommCount");
    return f;
  }();
  return n;
}

// Non-blocking communicators return ncclInProgress for work they finish later (wait() and ready() poll it).
void check(ncclResult_t r, const char* what) {
  TR_CHECK(r == ncclSuccess || r == ncclInProgress, "NCCL {}: {}", what, nccl().error_string(r));
}

// Non-blocking (config.blocking = 0): no NCCL call can wait forever for a peer that is gone; every wait is
// ours, with its deadline.
ncclConfig_t nonblocking() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  return c;
}

// Polls a communicator NCCL is still setting up (init, split) until it is ready; aborts it past the deadline.
void ready(ncclComm_t c, const char* what, Clock::time_point deadline, double timeout_s) {
  for (;;) {
    ncclResult_t r = ncclInProgress;
    check(nccl().async_error(c, &r), "ncclCommGetAsyncError");
    if (r == ncclSuccess) return;
    if (r != ncclInProgress || Clock::now() > deadline) {
      nccl().abort(c);
      TR_CHECK(r == ncclInProgress, "NCCL {}: {}", what, nccl().error_string(r));
      fail("NCCL {}: not every rank joined within --ddp_timeout {} s", what, timeout_s);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// ncclGroupStart .. ncclGroupEnd, ended also when an enqueue throws (else every later call of the thread
// would join the open group).
class GroupScope {
 public:
  GroupScope() { check(nccl().group_start(), "group start"); }
  ~GroupScope() noexcept(false) {
    const ncclResult_t r = nccl().group_end();
    if (!std::uncaught_exceptions()) check(r, "group end");
  }
  GroupScope(const GroupScope&) = delete;
  GroupScope& operator=(const GroupScope&) = delete;
};

ncclComm_t as_comm(void* c) { return static_cast<ncclComm_t>(c); }

// A result from the staging buffer to host memory, once the collective that made it is done (wait): on the
// communication stream, which has nothing else queued, so it cannot block on a peer.
void copy_back(void* host, const void* device, size_t bytes, cudaStream_t s) {
  TR_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s));
  TR_CUDA_CHECK(cudaStreamSynchronize(s));
}

// Runs fn with `device` current, restoring the caller's.
template <typename F>
void on_device(int device, F&& fn) {
  int prev = 0;
  TR_CUDA_CHECK(cudaGetDevice(&prev));
  TR_CUDA_CHECK(cudaSetDevice(device));
  try {
    fn();
  } catch (...) {
    cudaSetDevice(prev);
    throw;
  }
  TR_CUDA_CHECK(cudaSetDevice(prev));
}

}  // namespace

std::string NcclComm::unique_id() {
  cuda_backend();  // a GPU is present (else its message)
  ncclUniqueId id;
  check(nccl().get_unique_id(&id), "ncclGetUniqueId");
  return std::string(id.internal, sizeof id.internal);
}

NcclComm::NcclComm(int device_index, int rank, int world, const std::string& id,
                   std::chrono::milliseconds timeout)
    : device_(device_index), rank_(rank), world_(world), timeout_(timeout) {
  cuda_backend();
  ncclUniqueId uid;
  TR_CHECK(id.size() == sizeof uid.internal, "NCCL: a unique id of {} bytes (expected {})", id.size(),
           sizeof uid.internal);
  std::memcpy(uid.internal, id.data(), sizeof uid.internal);
  ncclComm_t c = nullptr;
  on_device(device_, [&] {
    ncclConfig_t config = nonblocking();
    check(nccl().init_rank(&c, world, uid, rank, &config), "ncclCommInitRankConfig");
    ready(c, "ncclCommInitRankConfig", Clock::now() + timeout_, timeout_.count() / 1000.0);
  });
  comm_ = c;
}

NcclComm::NcclComm(int device_index, int rank, int world, void* comm, std::chrono::milliseconds timeout)
    : device_(device_index), rank_(rank), world_(world), comm_(comm), timeout_(timeout) {}

NcclComm::~NcclComm() {
  // Abort, not destroy: every collective was waited for, so nothing is pending, and abort never waits on a
  // peer (destroy could, while an error unwinds). At exit the driver may be gone: nothing to report. The
  // communicator goes before the buffer and the stream it used.
  if (comm_) nccl().abort(as_comm(comm_));
  if (buf_ || stream_) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    if (buf_) cudaFree(buf_);
    if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    if (queued_) cudaEventDestroy(static_cast<cudaEvent_t>(queued_));
    if (done_) cudaEventDestroy(static_cast<cudaEvent_t>(done_));
    cudaSetDevice(prev);
  }
}

void* NcclComm::staging(size_t bytes) {
  if (bytes <= buf_bytes_) return buf_;
  if (buf_) TR_CUDA_CHECK(cudaFree(buf_));
  buf_ = nullptr;
  buf_bytes_ = 0;
  const size_t n = std::max<size_t>(bytes, size_t{1} << 20);
  TR_CUDA_CHECK(cudaMalloc(&buf_, n));
  buf_bytes_ = n;
  return buf_;
}

// Called with device_ current.
void* NcclComm::begin(bool after_compute, const void* after) {
  if (stream_ == nullptr) {
    cudaStream_t s = nullptr;
    cudaEvent_t a = nullptr, b = nullptr;
    TR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TR_CUDA_CHECK(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
    TR_CUDA_CHECK(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
    stream_ = s, queued_ = a, done_ = b;
  }
  const auto s = static_cast<cudaStream_t>(stream_);
  if (after_compute && after != nullptr) {  // the point the caller marked when it queued the inputs
    TR_CUDA_CHECK(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(const_cast<void*>(after)), 0));
  } else if (after_compute) {  // on the GPU: the host goes on at once
    const auto q = static_cast<cudaEvent_t>(queued_);
    TR_CUDA_CHECK(cudaEventRecord(q, cuda::compute_stream(device_)));
    TR_CUDA_CHECK(cudaStreamWaitEvent(s, q, 0));
  }
  return s;
}

// Called with device_ current, after a collective was queued on the communication stream: first until a
// non-blocking communicator has finished queuing it (ncclInProgress), then until the stream has run it.
void NcclComm::wait(const char* what) {
  const auto deadline = Clock::now() + timeout_;
  const auto give_up = [&](const std::string& why) {
    nccl().abort(as_comm(comm_));
    comm_ = nullptr;
    fail("NCCL {} (rank {} of {}) {}", what, rank_, world_, why);
  };
  // NCCL's state: true while the collective is still being queued; throws for a failure or past the deadline.
  const auto queuing = [&] {
    ncclResult_t r = ncclSuccess;
    check(nccl().async_error(as_comm(comm_), &r), "ncclCommGetAsyncError");
    if (r != ncclSuccess && r != ncclInProgress)
      give_up(fmt::format("failed: {} - a peer process ended or its GPU failed", nccl().error_string(r)));
    if (Clock::now() > deadline)
      give_up(fmt::format("made no progress within --ddp_timeout {} s - a peer process ended or stalled",
                          timeout_.count() / 1000.0));
    return r == ncclInProgress;
  };
  while (queuing()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  const auto done = static_cast<cudaEvent_t>(done_);
  TR_CUDA_CHECK(cudaEventRecord(done, static_cast<cudaStream_t>(stream_)));
  for (;;) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) {
      nccl().abort(as_comm(comm_));
      comm_ = nullptr;
      TR_CUDA_CHECK(q);
    }
    queuing();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclComm::all_reduce_sum(void* data, size_t n, DType dt) {
  TR_CHECK(dt == DType::f32 || dt == DType::f64, "NCCL all_reduce: f32 or f64 values, not {}",
           dtype_name(dt));
  TR_CHECK(comm_ != nullptr, "NCCL: the communicator was aborted after an earlier failure");
  const size_t bytes = n * dtype_size(dt);
  if (bytes == 0) return;
  on_device(device_, [&] {
    void* d = staging(bytes);
    const auto s = static_cast<cudaStream_t>(begin(false));
    TR_CUDA_CHECK(cudaMemcpyAsync(d, data, bytes, cudaMemcpyHostToDevice, s));
    check(
        nccl().all_reduce(d, d, n, dt == DType::f32 ? ncclFloat32 : ncclFloat64, ncclSum, as_comm(comm_), s),
        "all_reduce");
    wait("all_reduce");
    copy_back(data, d, bytes, s);
  });
}

void NcclComm::all_reduce_sum_device(void* device_data, size_t n, DType dt, const void* after) {
  TR_CHECK(dt == DType::f32 || dt == DType::f64, "NCCL all_reduce: f32 or f64 values, not {}",
           dtype_name(dt));
  TR_CHECK(comm_ != nullptr, "NCCL: the communicator was aborted after an earlier failure");
  if (n == 0) return;
  // On the communication stream, after the kernels that wrote the values (those queued so far, or those
  // before `after`); the wait polls NCCL's errors against the timeout (a dead peer fails here instead of
  // hanging the stream).
  on_device(device_, [&] {
    const auto s = static_cast<cudaStream_t>(begin(true, after));
    check(nccl().all_reduce(device_data, device_data, n, dt == DType::f32 ? ncclFloat32 : ncclFloat64,
                            ncclSum, as_comm(comm_), s),
          "all_reduce");
    wait("all_reduce");
  });
}

// The device collectives below follow all_reduce_sum_device: queued after the compute stream's work on the
// communication stream, the host waiting (with the timeout) until they ran, so the compute stream's next
// kernels read the results. Bound by NCCL's transfer alone: no staging copies.
void NcclComm::reduce_scatter_sum_device(const float* in, float* out, size_t n) {
  TR_CHECK(comm_ != nullptr, "NCCL: the communicator was aborted after an earlier failure");
  if (n == 0) return;
  on_device(device_, [&] {
    const auto s = static_cast<cudaStream_t>(begin(true));
    check(nccl().reduce_scatter(in, out, n, ncclFloat32, ncclSum, as_comm(comm_), s), "reduce_scatter");
    wait("reduce_scatter");
  });
}

void NcclComm::reduce_blocks_device(const float* in, const std::vector<int64_t>& counts, float* out,
                                    const void* after) {
  TR_CHECK(comm_ != nullptr, "NCCL: the communicator was aborted after an earlier failure");
  TR_CHECK(counts.size() == static_cast<size_t>(world_), "NCCL reduce_blocks: {} counts for {} ranks",
           counts.size(), world_);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0) return;
  on_device(device_, [&] {
    const auto s = static_cast<cudaStream_t>(begin(true, after));
    {
      const GroupScope group;
      int64_t at = 0;
      for (int j = 0; j < world_; ++j) {
        const auto n = static_cast<size_t>(counts[static_cast<size_t>(j)]);
        // Only the root writes recvbuff; elsewhere NCCL gets a valid device pointer it leaves alone.
        float* recv = j == rank_ ? out : const_cast<float*>(in + at);
        if (n > 0)
          check(nccl().reduce(in + at, recv, n, ncclFloat32, ncclSum, j, as_comm(comm_), s), "reduce");
        at += static_cast<int64_t>(n);
      }
    }
    wait("reduce_blocks");
  });
}

void NcclComm::all_gather_device(const void* in, void* out, size_t bytes) {
  TR_CHECK(comm_ != nullptr, "NCCL: the communicator was aborted after an earlier failure");
  if (bytes == 0) return;
  on_device(device_, [&] {
    const auto s = static_cast<cudaStream_t>(begin(true));
    check(nccl().all_gather(in, out, bytes, ncclUint8, as_comm(comm_), s), "all_gather");
    wait("all_gather");
  });
}

void NcclComm::all_gather_v_device(const void* in, void* out, const std::vector<size_t>& counts) {
  TR_CHECK(comm_ != nullptr, "NCCL: the communicator was aborted after an earlier failure");
  TR_CHECK(counts.size() == static_cast<size_t>(world_), "NCCL all_gather_v: {} counts for {} ranks",
           counts.size(), world_);
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (total == 0) return;
  on_device(device_, [&] {
    const auto s = static_cast<cudaStream_t>(begin(true));
    {
      const GroupScope group;
      size_t at = 0;
      for (int j = 0; j < world_; ++j) {
        const size_t n = counts[static_cast<size_t>(j)];
        char* to = static_cast<char*>(out) + at;
        if (n > 0)
          check(nccl().broadcast(j == rank_ ? in : to, to, n, ncclUint8, j, as_comm(comm_), s), "broadcast");
        at += n;
      }
    }
    wait("all_gather_v");
  });
}

void NcclComm::broadcast(void* data, size_t bytes, int root) {
  TR_CHECK(comm_ != nullptr, "NCCL: the communicator was aborted after an earlier failure");
  if (bytes == 0) return;
  on_device(device_, [&] {
    void* d = staging(bytes);
    const auto s = static_cast<cudaStream_t>(begin(false));
    if (rank_ == root) TR_CUDA_CHECK(cudaMemcpyAsync(d, data, bytes, cudaMemcpyHostToDevice, s));
    check(nccl().broadcast(d, d, bytes, ncclUint8, root, as_comm(comm_), s), "broadcast");
    wait("broadcast");
    copy_back(data, d, bytes, s);
  });
}

void NcclComm::all_gather(const void* in, void* out, size_t bytes) {
  TR_CHECK(comm_ != nullptr, "NCCL: the communicator was aborted after an earlier failure");
  if (bytes == 0) return;
  const size_t total = bytes * static_cast<size_t>(world_);
  on_device(device_, [&] {
    auto* d = static_cast<char*>(staging(total));
    const auto s = static_cast<cudaStream_t>(begin(false));
    char* mine = d + bytes * static_cast<size_t>(rank_);  // in place: this rank's block of the output
    TR_CUDA_CHECK(cudaMemcpyAsync(mine, in, bytes, cudaMemcpyHostToDevice, s));
    check(nccl().all_gather(mine, d, bytes, ncclUint8, as_comm(comm_), s), "all_gather");
    wait("all_gather");
    copy_back(out, d, total, s);
  });
}

void NcclComm::exchange(const void* in, const std::vector<size_t>& send_bytes, void* out,
                        const std::vector<size_t>& recv_bytes) {
  TR_CHECK(comm_ != nullptr, "NCCL: the communicator was aborted after an earlier failure");
  const size_t w = static_cast<size_t>(world_);
  TR_CHECK(send_bytes.size() == w && recv_bytes.size() == w,
           "NCCL exchange: {} send and {} receive counts for {} ranks", send_bytes.size(), recv_bytes.size(),
           w);
  size_t sent = 0, received = 0;
  for (size_t j = 0; j < w; ++j) sent += send_bytes[j], received += recv_bytes[j];
  if (sent + received == 0) return;
  on_device(device_, [&] {
    auto* d = static_cast<char*>(staging(sent + received));
    const auto s = static_cast<cudaStream_t>(begin(false));
    char* din = d;
    char* dout = d + sent;
    if (sent) TR_CUDA_CHECK(cudaMemcpyAsync(din, in, sent, cudaMemcpyHostToDevice, s));
    {
      const GroupScope group;
      size_t so = 0, ro = 0;
      for (size_t j = 0; j < w; ++j) {
        if (send_bytes[j])
          check(nccl().send(din + so, send_bytes[j], ncclUint8, static_cast<int>(j), as_comm(comm_), s),
                "send");
        if (recv_bytes[j])
          check(nccl().recv(dout + ro, recv_bytes[j], ncclUint8, static_cast<int>(j), as_comm(comm_), s),
                "recv");
        so += send_bytes[j];
        ro += recv_bytes[j];
      }
    }
    wait("exchange");
    if (received) copy_back(out, dout, received, s);
  });
}

std::unique_ptr<NcclComm> NcclComm::split(int color, int key) {
  TR_CHECK(comm_ != nullptr, "NCCL: the communicator was aborted after an earlier failure");
  ncclComm_t c = nullptr;
  on_device(device_, [&] {
    ncclConfig_t config = nonblocking();
    check(nccl().split(as_comm(comm_), color, key, &c, &config), "ncclCommSplit");
    if (c != nullptr) ready(c, "ncclCommSplit", Clock::now() + timeout_, timeout_.count() / 1000.0);
  });
  TR_CHECK(c != nullptr, "NCCL split: color {} gave this rank no communicator", color);
  int rank = 0, size = 0;
  check(nccl().user_rank(c, &rank), "ncclCommUserRank");
  check(nccl().count(c, &size), "ncclCommCount");
  return std::unique_ptr<NcclComm>(new NcclComm(device_, rank, size, c, timeout_));
}

}  // namespace tr::backend
