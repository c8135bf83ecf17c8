// GPU time per kernel for any CUDA program, without Nsight: LD_PRELOAD=libkernel_trace.so records every
// kernel, copy and memset through CUPTI's activity API and, at exit, prints the kernels that took the most
// device time (count, total, mean, share) to stderr or to $TRAINER_KERNEL_TRACE (a file path).
// $TRAINER_KERNEL_TRACE_TOP (default 40) sets how many rows. Used by scripts/device_check.sh.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Row {
  uint64_t count = 0, ns = 0;
};

// One trace per process: the preload has no other owner to hang it on.
struct Trace {
  std::mutex mu;
  std::map<std::string, Row> rows;
  uint64_t first_ns = UINT64_MAX, last_ns = 0, total_ns = 0;
  bool exit_hooked = false;
};

Trace& trace() {
  static Trace* t = new Trace;  // never destroyed: CUPTI may deliver buffers during static destruction
  return *t;
}

// A kernel's short name: demangled, without its parameter list and with template arguments folded.
std::string short_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  for (size_t p; (p = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(p, 23);
  if (auto p = s.find('('); p != std::string::npos) s.resize(p);
  std::string out;
  int depth = 0;
  for (char c : s) {
    if (c == '<' && depth++ == 0) out += "<...>";
    if (c == '>') {
      --depth;
      continue;
    }
    if (depth == 0) out += c;
  }
  if (out.rfind("void ", 0) == 0) out.erase(0, 5);
  return out.size() > 90 ? out.substr(0, 87) + "..." : out;
}

void add(const std::string& name, uint64_t start, uint64_t end) {
  Trace& t = trace();
  std::lock_guard<std::mutex> g(t.mu);
  Row& r = t.rows[name];
  ++r.count;
  r.ns += end - start;
  t.total_ns += end - start;
  t.first_ns = std::min(t.first_ns, start);
  t.last_ns = std::max(t.last_ns, end);
}

void report();

void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = kBytes;
  *max_records = 0;
  Trace& t = trace();
  std::lock_guard<std::mutex> g(t.mu);
  if (!t.exit_hooked) {  // registered after the CUDA runtime's own exit handler, so it runs before it
    t.exit_hooked = true;
    std::atexit(report);
  }
}

void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
      add(short_name(k->name), k->start, k->end);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
      add("[memcpy kind " + std::to_string(m->copyKind) + "]", m->start, m->end);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
      add("[memset]", m->start, m->end);
    }
  }
  std::free(buffer);
}

void report() {
  cuptiActivityFlushAll(1);
  Trace& t = trace();
  std::lock_guard<std::mutex> g(t.mu);
  std::vector<std::pair<std::string, Row>> v(t.rows.begin(), t.rows.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  const char* path = std::getenv("TRAINER_KERNEL_TRACE");
  FILE* f = path && *path ? std::fopen(path, "w") : stderr;
  if (!f) f = stderr;
  const char* top_env = std::getenv("TRAINER_KERNEL_TRACE_TOP");
  const size_t top = top_env ? std::strtoul(top_env, nullptr, 10) : 40;
  const double span = t.last_ns > t.first_ns ? (t.last_ns - t.first_ns) * 1e-6 : 0.0;
  std::fprintf(f, "kernel trace: %.1f ms of device work over a %.1f ms span (%.0f%% busy), %zu kinds\n",
               t.total_ns * 1e-6, span, span > 0 ? 100.0 * t.total_ns * 1e-6 / span : 0.0, v.size());
  std::fprintf(f, "%8s %10s %9s %6s  %s\n", "count", "total ms", "mean us", "share", "kernel");
  for (size_t i = 0; i < v.size() && i < top; ++i) {
    const Row& r = v[i].second;
    std::fprintf(f, "%8llu %10.2f %9.1f %5.1f%%  %s\n", static_cast<unsigned long long>(r.count), r.ns * 1e-6,
                 r.ns * 1e-3 / static_cast<double>(r.count), 100.0 * static_cast<double>(r.ns) / t.total_ns,
                 v[i].first.c_str());
  }
  if (f != stderr) std::fclose(f);
}

// Runs at load, before main and before any CUDA context: activities enabled now cover the whole run.
__attribute__((constructor)) void start() {
  if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel trace: CUPTI refused its callbacks; no trace\n");
    return;
  }
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
}

}  // namespace
