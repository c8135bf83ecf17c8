// ZeRO-3's per-unit gather, release and gradient reduction; see zero3.h.
#include "train/zero3.h"

#include <algorithm>
#include <cstring>

#include "autograd/node.h"
#include "core/error.h"
#include "core/half.h"
#include "core/suggest.h"
#include "ops/ops.h"
#include "train/checkpoint.h"
#include "train/host_stage.h"

namespace tr::train {

namespace {

void widen(const void* src, DType t, float* dst, int64_t n) {
  if (t == DType::f32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i)
    dst[i] = t == DType::bf16 ? bf16_bits_to_float(h[i]) : half_bits_to_float(h[i]);
}

// Rounded to nearest even, as ops::to_dtype rounds (the bits of a ZeRO-2 gather and of DDP's copies).
void narrow_to(const float* src, DType t, void* dst, int64_t n) {
  if (t == DType::f32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i)
    h[i] = t == DType::bf16 ? float_to_bf16_bits(src[i]) : float_to_half_bits(src[i]);
}

}  // namespace

FullShard::FullShard(ShardedOptimizer& opt, const nn::ParamList& params, int64_t bucket_cap_bytes,
                     FsdpOptions options)
    : opt_(opt), params_(params), options_(options) {
  TR_CHECK(opt.stage() == 3, "FullShard: the optimizer shards at ZeRO stage {}, not 3", opt.stage());
  const FlatLayout& L = opt.layout();
  TR_CHECK(params.size() == L.numel.size(), "FullShard: {} parameters, the optimizer's layout has {}",
           params.size(), L.numel.size());
  dtype_ = params.empty() ? DType::f32 : params.front().second->dtype();
  meta_ = !params.empty() && params.front().second->device().is_meta();
  const bool gpu =
      opt.shard_device().is_cuda() || (!params.empty() && params.front().second->device().is_cuda());
  recv_.pin(gpu);
  gather_tmp_.pin(gpu);
  shard_tmp_.pin(gpu);
  grad_tmp_.pin(gpu);
  int layers = 0;
  bool untied = false;
  for (const auto& [name, p] : params) {
    layers = std::max(layers, models::CausalLM::decoder_layer_of(name) + 1);
    untied = untied || name == "lm_head.weight";
  }
  layers_ = layers;
  // An untied head: the embeddings are a unit of their own, released right after their lookup (their backward
  // needs no weights), and the root keeps the final norm and head. Tied, the table is both: one root unit.
  units_.resize(static_cast<size_t>(layers) + (untied ? 2 : 1));
  if (untied) embed_unit_ = static_cast<int>(units_.size()) - 1;
  unit_of_.resize(params.size());
  for (size_t k = 0; k < params.size(); ++k) {
    Tensor& p = *params[k].second;
    TR_CHECK(p.dtype() == dtype_, "--fsdp full_shard: parameter '{}' is {}, the others {}", params[k].first,
             p.describe(), dtype_name(dtype_));
    // Releasing frees the storage, so it must be this parameter's alone, all of it, from an allocator. One
    // mapped from a checkpoint file (or a view) is replaced by storage of its own: its values are in the
    // optimizer's shard already and come back with the first gather.
    if (!p.is_contiguous() || p.offset() != 0 || p.storage()->borrowed() ||
        p.storage()->nbytes() != static_cast<size_t>(p.numel()) * dtype_size(dtype_) ||
        p.storage().use_count() > 1) {
      Tensor own = ops::empty(p.shape(), dtype_, p.device());
      autograd::set_requires_grad(own, p.requires_grad());
      p = own;
    }
    const int layer = models::CausalLM::decoder_layer_of(params[k].first);
    const int u = layer < 0 && embed_unit_ > 0 && models::CausalLM::is_embedding(params[k].first)
                      ? embed_unit_
                      : layer + 1;
    unit_of_[k] = u;
    units_[static_cast<size_t>(u)].params.push_back(k);
    index_[p.impl_ptr().get()] = k;
  }
  // Each unit's pieces in flat order, cut at shard boundaries and into chunks of the cap.
  const int64_t cap = std::max<int64_t>(1, bucket_cap_bytes / static_cast<int64_t>(sizeof(float)));
  const int world = L.world;
  for (Unit& u : units_) {
    Chunk c;
    int64_t in_chunk = 0;
    const auto close = [&] {
      if (c.pieces.empty()) return;
      u.chunks.push_back(std::move(c));
      c = Chunk();
      in_chunk = 0;
    };
    for (size_t k : u.params) {
      for (int64_t at = 0; at < L.numel[k];) {
        const int64_t flat = L.offset[k] + at;
        const int owner = static_cast<int>(flat / L.shard);
        const int64_t to_shard_end = (owner + 1) * L.shard - flat;
        const int64_t n = std::min({L.numel[k] - at, to_shard_end, cap - in_chunk});
        if (c.per_rank.empty()) c.per_rank.assign(static_cast<size_t>(world), 0);
        c.pieces.push_back({k, at, n, flat, owner});
        c.per_rank[static_cast<size_t>(owner)] += n;
        in_chunk += n;
        at += n;
        if (in_chunk >= cap) close();
      }
    }
    close();
  }
  seen_.assign(params.size(), 0);
  for (Unit& u : units_) {
    u.state = State::resident;  // as built: released here
    release(u);
  }
  if (!meta_) comm_ = std::make_unique<CommQueue>(opt.model_dev_, opt.group_);
}

FullShard::~FullShard() = default;

FullShard::Unit& FullShard::unit(int u) {
  TR_CHECK(u >= -1 && u < layers_, "FullShard: unit {} of {} layers and the root", u, layers_);
  return units_[static_cast<size_t>(u + 1)];
}

void FullShard::before_forward(int u) {
  // The root starts with the embeddings: their own unit when the head is apart (before_head gathers it).
  gather(u == -1 && embed_unit_ > 0 ? units_[static_cast<size_t>(embed_unit_)] : unit(u));
  if (options_.forward_prefetch) prefetch(u + 1);  // the root runs first: layer 0 comes next
}

void FullShard::after_embeddings() {
  if (embed_unit_ > 0) release(units_[static_cast<size_t>(embed_unit_)]);
}

void FullShard::before_head() {
  if (embed_unit_ > 0) gather(unit(-1));
}

void FullShard::after_forward(int u) {
  // The root's head runs last in forward and first in backward: it stays for the backward, whose first
  // layer is the last one.
  if (u == -1 && autograd::grad_enabled()) {
    if (options_.backward_prefetch == FsdpOptions::BackwardPrefetch::pre) prefetch(layers_ - 1);
    return;
  }
  release(unit(u));
  if (u == -1) drain();  // a whole no-grad forward (evaluation) done: nothing left in flight
}

void FullShard::before_backward(int u) {
  gather(unit(u));
  if (options_.backward_prefetch == FsdpOptions::BackwardPrefetch::pre) prefetch(u - 1);
}

void FullShard::prefetch(int layer) {
  if (layer >= 0 && layer < layers_) start_gather(unit(layer), true);
}

void FullShard::start_gather(Unit& u, bool prefetch) {
  if (u.state != State::released) return;
  for (size_t k : u.params) params_[k].second->storage()->reacquire();
  if (!gather_recv_.defined() && opt_.device_comm()) make_gather_buffers();
  ++gathers_;
  if (prefetch) ++prefetched_;
  if (meta_) {  // a dry run: the storage is taken, no values move
    u.state = State::resident;
    return;
  }
  u.ticket = comm_->push([this, &u] {
    for (const Chunk& c : u.chunks) gather_chunk(c);
  });
  u.state = State::pending;
}

void FullShard::wait(Unit& u) {
  if (u.state != State::pending) return;
  comm_->wait(u.ticket);
  u.state = State::resident;
}

void FullShard::drain() {
  for (Unit& u : units_) wait(u);
  if (comm_) comm_->drain();
}

void FullShard::release(Unit& u) {
  wait(u);  // the communication thread may still be writing into it
  if (u.state == State::released) return;
  for (size_t k : u.params) params_[k].second->storage()->release();
  u.state = State::released;
}

// This rank's pieces of the chunk from its fp32 shard, in the parameters' dtype, to every rank; every rank's
// pieces (the chunk in flat order) into the parameters.
void FullShard::gather_chunk(const Chunk& c) {
  if (meta_) return;  // a dry run: the storage is taken, no values move
  if (opt_.device_comm()) return gather_chunk_on_device(c);
  const size_t es = dtype_size(dtype_);
  const int me = opt_.rank();
  const int64_t base = static_cast<int64_t>(me) * opt_.layout().shard;
  const int64_t mine = c.per_rank[static_cast<size_t>(me)];
  int64_t total = 0;
  std::vector<size_t> counts(c.per_rank.size());
  for (size_t j = 0; j < counts.size(); ++j) {
    counts[j] = static_cast<size_t>(c.per_rank[j]) * es;
    total += c.per_rank[j];
  }
  send_.resize(std::max<size_t>(1, static_cast<size_t>(mine) * es));
  recv_.resize(std::max<size_t>(1, static_cast<size_t>(total) * es));
  const Tensor& master = opt_.master_flat_;  // on the model's device, or the host when offloaded
  int64_t pos = 0;
  for (const Piece& p : c.pieces) {
    if (p.owner != me) continue;
    const float* from = nullptr;
    if (host_stage::direct(master)) {
      from = master.data<float>() + (p.flat - base);
    } else {  // the fp32 piece to the host, rounded there (the same bits as rounding on the device)
      gather_tmp_.resize(static_cast<size_t>(p.n));
      host_stage::read(host_stage::stretch(master, p.flat - base, p.n), gather_tmp_.data());
      from = gather_tmp_.data();
    }
    narrow_to(from, dtype_, send_.data() + static_cast<size_t>(pos) * es, p.n);
    pos += p.n;
  }
  opt_.group_.all_gather_v(send_.data(), static_cast<size_t>(mine) * es, recv_.data(), counts);
  pos = 0;
  for (const Piece& p : c.pieces) {
    host_stage::write(recv_.data() + static_cast<size_t>(pos) * es,
                      host_stage::stretch(*params_[p.param].second, p.at, p.n));
    pos += p.n;
  }
}

void FullShard::begin_step() {
  drain();  // a reduction of a step cut short may still be adding into the shard
  // Every unit released: a unit one rank thought gathered would skip that rank's part of a collective.
  for (const Unit& u : units_)
    TR_CHECK(u.state == State::released, "FullShard: {} still gathered at a step's start",
             embed_unit_ > 0 && &u - units_.data() == embed_unit_
                 ? std::string("the embeddings' unit")
                 : fmt::format("unit {}", &u - units_.data() - 1));
  opt_.allocate_state();
  if (!meta_) ops::fill_(opt_.grad_flat_, 0.0);
}

void FullShard::begin_backward(double scale) {
  TR_CHECK(!in_backward_, "FullShard: begin_backward twice");
  opt_.allocate_state();
  std::fill(seen_.begin(), seen_.end(), 0);
  for (Unit& u : units_) {
    u.waiting = static_cast<int>(u.params.size());
    u.reduced = false;
  }
  scale_ = static_cast<float>(scale);
  in_backward_ = true;
}

void FullShard::grad_ready(const TensorImpl* leaf) {
  const auto it = index_.find(leaf);
  if (!in_backward_ || it == index_.end() || seen_[it->second]) return;
  seen_[it->second] = 1;
  Unit& u = units_[static_cast<size_t>(unit_of_[it->second])];
  if (--u.waiting == 0) reduce(u);
}

void FullShard::finish_backward() {
  if (!in_backward_) return;
  // Units no gradient reached (none in a model that uses every parameter), in a fixed order on every rank
  // (the embeddings' unit first, then the last layer down to the root).
  // No backward_post prefetch here: no backward follows to use (and release) what it would gather.
  in_backward_ = false;
  for (auto u = units_.rbegin(); u != units_.rend(); ++u)
    if (!u->reduced) reduce(*u);
  drain();  // the step's other collectives follow, and read the shard: nothing of ours may be in flight
}

// Each chunk packed into a free slot here and reduced on the communication thread, after whatever was
// queued before it (a prefetched gather): the same order on every rank. A dry run reduces on the spot.
void FullShard::reduce(Unit& u) {
  const bool device = opt_.device_comm();
  if (device) make_slots();
  if (!meta_ && !device && !host_stage::direct(opt_.grad_flat_) && !shard_tmp_sized_) {
    // The staging of the shard's pieces (a shard off the host under Gloo), sized once for the largest part
    // of a chunk this rank owns, before any reduction is queued: the communication thread's resizes then
    // allocate nothing.
    shard_tmp_.resize(static_cast<size_t>(largest_chunk().first));
    shard_tmp_sized_ = true;
  }
  for (const Chunk& c : u.chunks) {
    Slot& s = slots_[static_cast<size_t>(next_slot_)];
    next_slot_ ^= 1;
    if (!meta_) comm_->wait(s.ticket);  // the chunk before last is off this slot
    if (device)
      pack_chunk_on_device(c, s);
    else
      pack_chunk(c, s);
    ++reductions_;
    if (meta_) {
      reduce_chunk(c, s, scale_);
      continue;
    }
    s.ticket = comm_->push([this, &c, &s, scale = scale_] { reduce_chunk(c, s, scale); });
  }
  for (size_t k : u.params) autograd::zero_grad(*params_[k].second);  // packed: its sum is on its way
  release(u);
  u.reduced = true;
  // backward_post: the layer before this one comes while the engine moves on to it.
  const int layer = static_cast<int>(&u - units_.data()) - 1;
  // An untied root (the final norm and head) is reduced before the last layer's backward: that layer comes
  // next. A tied root waits for the embeddings' gradient, the last of all.
  const bool head_first = layer == -1 && embed_unit_ > 0;
  if (options_.backward_prefetch == FsdpOptions::BackwardPrefetch::post && in_backward_ &&
      (head_first || (layer >= 1 && layer < layers_)))
    prefetch(head_first ? layers_ - 1 : layer - 1);
}

// The chunk's gradient pieces, in flat order (so by owner), widened to f32 into the slot.
void FullShard::pack_chunk(const Chunk& c, Slot& s) {
  int64_t total = 0;
  for (int64_t n : c.per_rank) total += n;
  s.host.resize(std::max<size_t>(1, static_cast<size_t>(total)));
  int64_t pos = 0;
  for (const Piece& p : c.pieces) {
    const Tensor g = params_[p.param].second->grad();
    if (!g.defined()) {
      std::fill_n(s.host.data() + pos, p.n, 0.0f);
    } else {
      // A strided gradient is copied contiguous (on the meta device too: a dry run allocates what this does);
      // from a GPU only the piece moves, in its own dtype.
      const Tensor h = ops::contiguous(g);
      if (!meta_) {
        const Tensor piece = host_stage::stretch(h, p.at, p.n);
        const void* from = host_stage::direct(piece) ? piece.data_ptr() : nullptr;
        if (from == nullptr) {
          grad_tmp_.resize(piece.nbytes());
          host_stage::read(piece, grad_tmp_.data());
          from = grad_tmp_.data();
        }
        widen(from, h.dtype(), s.host.data() + pos, p.n);
      }
    }
    pos += p.n;
  }
}

// Every rank's packed pieces of the chunk to their owners (all_to_all_v); this rank adds its pieces'
// rank-ordered sums, times the scale, into its gradient shard (accumulating over micro-batches).
void FullShard::reduce_chunk(const Chunk& c, Slot& s, float scale) {
  if (opt_.device_comm()) return reduce_chunk_on_device(c, s, scale);
  if (meta_) return;
  const int world = opt_.world_size(), me = opt_.rank();
  const int64_t mine = c.per_rank[static_cast<size_t>(me)];
  frecv_.resize(std::max<size_t>(1, static_cast<size_t>(world * mine)));
  std::vector<int64_t> recv_counts(static_cast<size_t>(world), mine);
  opt_.group_.all_to_all_v(s.host.data(), c.per_rank, frecv_.data(), recv_counts);
  const Tensor& shard = opt_.grad_flat_;
  const bool direct = host_stage::direct(shard);
  const int64_t base = static_cast<int64_t>(me) * opt_.layout().shard;
  int64_t pos = 0;
  for (const Piece& p : c.pieces) {
    if (p.owner != me) continue;
    // Accumulated over micro-batches in place: a shard off the host's memory comes over and goes back.
    const Tensor piece = host_stage::stretch(shard, p.flat - base, p.n);
    float* out = direct ? piece.data<float>() : nullptr;
    if (!direct) {
      shard_tmp_.resize(static_cast<size_t>(p.n));
      host_stage::read(piece, shard_tmp_.data());
      out = shard_tmp_.data();
    }
    for (int64_t k = 0; k < p.n; ++k) {
      float sum = frecv_[static_cast<size_t>(pos + k)];
      for (int i = 1; i < world; ++i) sum += frecv_[static_cast<size_t>(i * mine + pos + k)];
      out[k] += scale == 1.0f ? sum : sum * scale;
    }
    if (!direct) host_stage::write(shard_tmp_.data(), piece);
    pos += p.n;
  }
}

bool FullShard::all_released() const {
  for (const auto& [name, p] : params_)
    if (!p->storage()->released()) return false;
  return true;
}

FsdpOptions read_fsdp_config(const std::string& given) {
  FsdpOptions o;
  if (given.empty()) return o;
  nlohmann::json j;
  // HF's fsdp_config is a file or a dict (an arguments file's object arrives here as its JSON text).
  const bool inline_json = given.front() == '{';
  const std::string path = inline_json ? "(the arguments' dict)" : given;
  if (inline_json) {
    j = nlohmann::json::parse(given, nullptr, /*allow_exceptions=*/false);
    TR_CHECK(!j.is_discarded(), "--fsdp_config: '{}' starts like a JSON object but does not parse", given);
  } else {
    try {
      j = read_json_file(path);
    } catch (const Error& e) {
      fail("--fsdp_config {}", e.what());
    }
  }
  TR_CHECK(j.is_object(), "--fsdp_config {}: expected a JSON object of FSDP options, got {}", path,
           j.type_name());
  // HF's keys that describe what full_shard does here anyway, or that only apply to XLA / offloading
  // switched off: accepted without effect.
  static const std::vector<std::string> accepted = {"min_num_params",
                                                    "transformer_layer_cls_to_wrap",
                                                    "use_orig_params",
                                                    "sync_module_states",
                                                    "limit_all_gathers",
                                                    "cpu_ram_efficient_loading",
                                                    "activation_checkpointing",
                                                    "state_dict_type",
                                                    "xla",
                                                    "xla_fsdp_settings",
                                                    "xla_fsdp_v2",
                                                    "xla_fsdp_grad_ckpt",
                                                    "version"};
  std::vector<std::string> known = accepted;
  known.insert(known.end(), {"forward_prefetch", "backward_prefetch"});
  for (const auto& [raw, v] : j.items()) {
    const std::string key = raw.rfind("fsdp_", 0) == 0 ? raw.substr(5) : raw;  // HF strips the prefix too
    if (key == "forward_prefetch") {
      TR_CHECK(v.is_boolean(), "--fsdp_config {}: {} is {}, expected true or false", path, raw, v.dump());
      o.forward_prefetch = v.get<bool>();
    } else if (key == "backward_prefetch") {
      const std::string m = v.is_string() ? v.get<std::string>() : v.dump();
      TR_CHECK(m == "backward_pre" || m == "backward_post" || m == "no_prefetch",
               "--fsdp_config {}: {} is {}, expected \"backward_pre\", \"backward_post\" or \"no_prefetch\"",
               path, raw, v.dump());
      o.backward_prefetch = m == "backward_pre"    ? FsdpOptions::BackwardPrefetch::pre
                            : m == "backward_post" ? FsdpOptions::BackwardPrefetch::post
                                                   : FsdpOptions::BackwardPrefetch::none;
    } else if (key == "xla" || key == "activation_checkpointing") {
      TR_CHECK(
          !v.is_boolean() || !v.get<bool>(), "--fsdp_config {}: {} true is not built here ({})", path, raw,
          key == "xla" ? "no XLA devices" : "use --gradient_checkpointing, which checkpoints every layer");
    } else {
      TR_CHECK(std::find(known.begin(), known.end(), key) != known.end(),
               "--fsdp_config {}: unknown FSDP option '{}'{}", path, raw, did_you_mean(key, known));
    }
  }
  return o;
}

data::Batch idle_batch(int64_t T, Device device) {
  data::Batch b;
  b.input_ids = ops::zeros({1, T}, DType::i64, device);
  b.labels = ops::full({1, T}, -100.0, DType::i64, device);
  b.host_labels = ops::full({1, T}, -100.0, DType::i64, Device::cpu());
  return b;
}

}  // namespace tr::train
