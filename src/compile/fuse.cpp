// The elementwise fusion pass; see fuse.h.
#include "compile/fuse.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

namespace tr::compile {

namespace {

using Stage = backend::Backend::FusedStage;

int operands(Stage::Kind k) { return k == Stage::Kind::binary || k == Stage::Kind::unary_backward ? 2 : 1; }

int64_t numel_of(const Arg& a) { return shape_numel(a.shape); }

// How far a run starting at call i extends: the calls after it join while they are elementwise over the same
// element count and dtype, see every buffer at the offset the run sees it (so a chunk of one stage is the
// same elements in every other), and read something the run wrote.
size_t run_end(const std::vector<Call>& calls, size_t i) {
  const Arg& a0 = calls[i].args[0];
  const int64_t n = numel_of(a0);
  std::unordered_map<int32_t, int64_t> offset;  // buffer -> offset seen
  std::vector<int32_t> written;
  // A buffer seen at two offsets (by the run or within the call itself: x[0:n] + x[n:2n]) would have one
  // stage's chunk meet other elements in another's.
  auto consistent = [&](const Call& c) {
    for (size_t k = 0; k < c.args.size(); ++k) {
      const Arg& a = c.args[k];
      if (numel_of(a) != n || a.dtype != a0.dtype) return false;
      const auto it = offset.find(a.buffer);
      if (it != offset.end() && it->second != a.offset) return false;
      for (size_t m = 0; m < k; ++m)
        if (c.args[m].buffer == a.buffer && c.args[m].offset != a.offset) return false;
    }
    return true;
  };
  auto note = [&](const Call& c) {
    for (const Arg& a : c.args) {
      offset.emplace(a.buffer, a.offset);
      if (a.access != Access::read) written.push_back(a.buffer);
    }
  };
  if (!consistent(calls[i])) return i + 1;
  note(calls[i]);
  size_t j = i + 1;
  for (; j < calls.size() && calls[j].pointwise && consistent(calls[j]); ++j) {
    bool reads_run = false;
    for (const Arg& a : calls[j].args)
      if (a.access != Access::write && std::find(written.begin(), written.end(), a.buffer) != written.end())
        reads_run = true;
    if (!reads_run) break;
    note(calls[j]);
  }
  return j;
}

// The fused call of calls [i, j).
Call fuse_run(const std::vector<Call>& calls, size_t i, size_t j, const std::vector<Buffer>& buffers,
              const std::vector<bool>& read_after) {
  Call f;
  f.name = "fused_elementwise";
  std::unordered_map<int32_t, int32_t> index;     // buffer -> tensor index of the fused call
  std::unordered_map<int32_t, int32_t> producer;  // elided buffer -> the stage holding its current value
  auto elided = [&](const Arg& a) {
    const Buffer& b = buffers[static_cast<size_t>(a.buffer)];
    return !b.external && !read_after[static_cast<size_t>(a.buffer)] && b.first >= static_cast<int64_t>(i) &&
           b.last < static_cast<int64_t>(j) && a.offset == 0 &&
           numel_of(a) * static_cast<int64_t>(dtype_size(a.dtype)) == b.bytes;
  };
  auto tensor = [&](const Arg& a, bool writes) {
    const auto [it, fresh] = index.emplace(a.buffer, static_cast<int32_t>(f.args.size()));
    if (fresh) {
      f.args.push_back(a);
      f.args.back().access = writes ? Access::write : Access::read;
    } else if (Arg& seen = f.args[static_cast<size_t>(it->second)]; writes && seen.access == Access::read) {
      seen.access = Access::read_write;  // read what was there, then written
    }
    return it->second;
  };
  std::vector<Stage> stages;
  for (size_t c = i; c < j; ++c) {
    const Call& call = calls[c];
    Stage s = *call.pointwise;
    const auto k = static_cast<int32_t>(stages.size());
    for (int o = 0; o < operands(s.kind); ++o) {
      const Arg& a = call.args[static_cast<size_t>(s.in[o])];
      const auto p = producer.find(a.buffer);
      s.in[o] = p != producer.end() ? -1 - p->second : tensor(a, false);
    }
    const Arg& out = call.args[static_cast<size_t>(s.out)];
    if (elided(out)) {
      producer[out.buffer] = k;
      s.out = -1;
    } else {
      producer.erase(out.buffer);
      s.out = tensor(out, true);
    }
    stages.push_back(s);
  }
  bool dropout = false;
  for (const Stage& s : stages) dropout = dropout || s.kind == Stage::Kind::dropout;
  if (!dropout) {
    f.run = [stages](backend::Backend& b, const std::vector<Tensor>& t, uint64_t) {
      b.fused_elementwise(stages, t);
    };
  } else {  // Philox offsets move by the replay's shift; the working copy avoids an allocation per replay
    f.run = [stages, work = stages](backend::Backend& b, const std::vector<Tensor>& t,
                                    uint64_t shift) mutable {
      for (size_t k = 0; k < stages.size(); ++k) work[k].offset = stages[k].offset + shift;
      b.fused_elementwise(work, t);
    };
  }
  return f;
}

}  // namespace

FuseResult fuse_elementwise(std::vector<Call>& calls, std::vector<Buffer>& buffers) {
  const auto old_end = static_cast<int64_t>(calls.size());
  std::vector<bool> read_after(buffers.size());
  for (size_t b = 0; b < buffers.size(); ++b) read_after[b] = buffers[b].last >= old_end;
  FuseResult r;
  std::vector<Call> out;
  out.reserve(calls.size());
  for (size_t i = 0; i < calls.size();) {
    const size_t j = calls[i].pointwise ? std::min(run_end(calls, i),
                                                   i + static_cast<size_t>(backend::Backend::kMaxFusedStages))
                                        : i + 1;
    if (j - i < 2) {
      out.push_back(std::move(calls[i++]));
      continue;
    }
    out.push_back(fuse_run(calls, i, j, buffers, read_after));
    ++r.chains;
    r.calls_fused += static_cast<int64_t>(j - i);
    i = j;
  }
  calls = std::move(out);
  // Lifetimes over the new call list; a region's buffer no call touches any more was elided.
  for (Buffer& b : buffers) {
    b.first = std::numeric_limits<int64_t>::max();
    b.last = -1;
  }
  for (size_t c = 0; c < calls.size(); ++c)
    for (const Arg& a : calls[c].args) {
      if (a.buffer < 0) continue;
      Buffer& b = buffers[static_cast<size_t>(a.buffer)];
      b.first = std::min(b.first, static_cast<int64_t>(c));
      b.last = std::max(b.last, static_cast<int64_t>(c));
    }
  for (size_t k = 0; k < buffers.size(); ++k) {
    Buffer& b = buffers[k];
    if (read_after[k]) b.last = static_cast<int64_t>(calls.size());
    if (b.last < 0) {
      b.elided = true;
      b.first = b.last = 0;
      ++r.buffers_elided;
    }
  }
  return r;
}

}  // namespace tr::compile
