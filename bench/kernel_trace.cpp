// GPU time per kernel for any CUDA program, without Nsight: LD_PRELOAD=libkernel_trace.so records every
// kernel, copy and memset through CUPTI's activity API and, at exit, prints the kernels that took the most
// device time (count, total, mean, share) to stderr or to $TRAINER_KERNEL_TRACE (a file path).
// $TRAINER_KERNEL_TRACE_TOP (default 40) sets how many rows. Used by scripts/device_check.sh.
// It also records the host's CUDA runtime calls, to say why the device sat idle: the gaps between device
// work (merged over streams), by size, and what the host was inside meanwhile (a synchronizing call, an
// allocation, a copy - or no CUDA call at all: host code), with the largest gaps and their neighbours.
#include <cupti.h>
#include <cxxabi.h>

#include <cctype>

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

struct Span {  // [start, end) in ns on CUPTI's clock (device work and host calls share it)
  uint64_t start = 0, end = 0;
  uint32_t what = 0;  // device work: an index into Trace::names; a host call: its runtime callback id
};

// One trace per process: the preload has no other owner to hang it on.
struct Trace {
  std::mutex mu;
  std::map<std::string, Row> rows;
  uint64_t first_ns = UINT64_MAX, last_ns = 0, total_ns = 0;
  bool exit_hooked = false;
  std::map<std::string, uint32_t> name_ids;
  std::vector<std::string> names;
  std::vector<Span> device, host;
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
  const auto id = t.name_ids.emplace(name, static_cast<uint32_t>(t.names.size()));
  if (id.second) t.names.push_back(name);
  t.device.push_back({start, end, id.first->second});
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
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      auto* a = reinterpret_cast<CUpti_ActivityAPI*>(rec);
      if (a->start == 0 && a->end == 0) continue;
      Trace& t = trace();
      std::lock_guard<std::mutex> g(t.mu);
      t.host.push_back({a->start, a->end, a->cbid});
    }
  }
  std::free(buffer);
}

std::string api_name(uint32_t cbid) {
  const char* n = nullptr;
  if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &n) != CUPTI_SUCCESS || !n)
    return "runtime call " + std::to_string(cbid);
  std::string s = n;
  if (auto p = s.find("_v"); p != std::string::npos && p + 2 < s.size() && std::isdigit(s[p + 2]))
    s.resize(p);
  return s;
}

struct Gap {
  uint64_t start, end;
  uint32_t before, after;  // the device work ending it / starting after it
};

// Device work merged over streams into busy stretches; the idle gaps between them.
std::vector<Gap> idle_gaps(std::vector<Span> dev) {
  std::sort(dev.begin(), dev.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  std::vector<Gap> gaps;
  uint64_t busy_end = 0;
  uint32_t last = 0;
  for (const Span& d : dev) {
    if (busy_end != 0 && d.start > busy_end) gaps.push_back({busy_end, d.start, last, d.what});
    if (d.end >= busy_end) {
      busy_end = d.end;
      last = d.what;
    }
  }
  return gaps;
}

// What the host was inside while the device waited: each runtime call's overlap with the gaps, and the part
// of the gaps no call covers (host code between calls). Gaps of a second or more (set-up: reading files,
// building the model on the host) are left out of the shares and listed with the largest.
void report_idle(Trace& t, FILE* f) {
  if (t.device.empty()) return;
  const std::vector<Gap> gaps = idle_gaps(t.device);
  constexpr uint64_t kPause = 1'000'000'000;
  const uint64_t edges[] = {10'000, 100'000, 1'000'000, 10'000'000, 100'000'000, kPause, UINT64_MAX};
  const char* labels[] = {"< 10 us", "10-100 us", "0.1-1 ms", "1-10 ms", "10-100 ms", "0.1-1 s", ">= 1 s"};
  uint64_t count[7] = {}, ns[7] = {}, idle = 0;
  for (const Gap& g : gaps) {
    const uint64_t d = g.end - g.start;
    size_t k = 0;
    while (d >= edges[k]) ++k;
    ++count[k];
    ns[k] += d;
    if (d < kPause) idle += d;
  }
  std::fprintf(f, "\ndevice idle: %zu gaps between device work (streams merged); under 1 s: %.1f ms\n",
               gaps.size(), idle * 1e-6);
  for (size_t k = 0; k < 7; ++k)
    if (count[k])
      std::fprintf(f, "  %-10s %8llu gaps %10.2f ms\n", labels[k], static_cast<unsigned long long>(count[k]),
                   ns[k] * 1e-6);
  // Each host call clipped to each gap it overlaps (gaps sorted and disjoint: a binary search finds them).
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> covered(gaps.size());
  std::map<uint32_t, uint64_t> by_call;
  for (const Span& h : t.host) {
    auto it = std::upper_bound(gaps.begin(), gaps.end(), h.start,
                               [](uint64_t v, const Gap& g) { return v < g.end; });
    for (; it != gaps.end() && it->start < h.end; ++it) {
      const uint64_t a = std::max(h.start, it->start), b = std::min(h.end, it->end);
      if (a >= b || it->end - it->start >= kPause) continue;
      by_call[h.what] += b - a;
      covered[static_cast<size_t>(it - gaps.begin())].emplace_back(a, b);
    }
  }
  uint64_t in_calls = 0;
  for (auto& c : covered) {  // the union: calls on several threads may overlap one another
    std::sort(c.begin(), c.end());
    uint64_t reach = 0;
    for (const auto& [a, b] : c) {
      const uint64_t from = std::max(a, reach);
      if (b > from) in_calls += b - from;
      reach = std::max(reach, b);
    }
  }
  std::vector<std::pair<uint64_t, uint32_t>> calls;
  for (const auto& [cbid, v] : by_call) calls.emplace_back(v, cbid);
  std::sort(calls.rbegin(), calls.rend());
  std::fprintf(
      f, "  the host meanwhile (gaps under 1 s): in no CUDA call (host code) %.1f ms (%.0f%%)\n",
      (idle - std::min(idle, in_calls)) * 1e-6,
      idle ? 100.0 * static_cast<double>(idle - std::min(idle, in_calls)) / static_cast<double>(idle) : 0.0);
  for (size_t i = 0; i < calls.size() && i < 12; ++i)
    std::fprintf(f, "    inside %-34s %10.1f ms\n", api_name(calls[i].second).c_str(), calls[i].first * 1e-6);
  // Host calls overall: what the host spends in the runtime, whether or not the device was idle.
  std::map<uint32_t, Row> host_rows;
  for (const Span& h : t.host) {
    Row& r = host_rows[h.what];
    ++r.count;
    r.ns += h.end - h.start;
  }
  std::vector<std::pair<uint64_t, uint32_t>> hv;
  for (const auto& [cbid, r] : host_rows) hv.emplace_back(r.ns, cbid);
  std::sort(hv.rbegin(), hv.rend());
  std::fprintf(f, "host time in CUDA runtime calls (all):\n");
  for (size_t i = 0; i < hv.size() && i < 12; ++i)
    std::fprintf(f, "  %-34s %8llu calls %10.1f ms\n", api_name(hv[i].second).c_str(),
                 static_cast<unsigned long long>(host_rows[hv[i].second].count), hv[i].first * 1e-6);
  std::vector<size_t> order(gaps.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const size_t n = std::min<size_t>(12, order.size());
  std::partial_sort(
      order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
      [&](size_t a, size_t b) { return gaps[a].end - gaps[a].start > gaps[b].end - gaps[b].start; });
  std::fprintf(f, "largest gaps (ms after the first device work: length, between):\n");
  for (size_t i = 0; i < n; ++i) {
    const Gap& g = gaps[order[i]];
    std::fprintf(f, "  at %9.1f ms %9.3f ms  %s -> %s\n", (g.start - t.first_ns) * 1e-6,
                 (g.end - g.start) * 1e-6, t.names[g.before].c_str(), t.names[g.after].c_str());
  }
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
  report_idle(t, f);
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
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
}

}  // namespace
