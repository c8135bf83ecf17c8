// Model registry, from_pretrained and save_pretrained (Hugging Face folder layout).
#include <filesystem>
#include <fstream>
#include <set>

#include "core/file_writer.h"
#include "backend/cuda_api.h"
#include "io/safetensors.h"
#include "models/gpt2.h"

namespace tr::models {

namespace fs = std::filesystem;

namespace {

std::unique_ptr<CausalLM> make(const ModelConfig& c, Device d, DType t, const nn::Init& init) {
  switch (c.family) {
    case Family::gpt2: return make_gpt2(c, d, t, init);
    case Family::llama: return make_llama(c, d, t, init);
  }
  fail("unknown model family");
}

// Buffers some checkpoints carry that are not parameters.
bool ignorable(const std::string& n) {
  auto ends = [&](const std::string& s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends("rotary_emb.inv_freq");
}

}  // namespace

std::unique_ptr<CausalLM> create_causal_lm(const ModelConfig& config, Device device, DType dtype,
                                           Generator& gen, const std::string& attn_implementation) {
  TR_CHECK(is_floating(dtype), "create model: dtype {} is not floating", dtype_name(dtype));
  auto m = make(config, device, dtype, nn::Init{&gen, device, dtype});
  m->set_attn_implementation(attn_implementation);
  return m;
}

namespace {

struct Opened {
  ModelConfig config;
  std::shared_ptr<io::CheckpointReader> ckpt;
  Device device;
  DType dtype = DType::f32;
};

Opened open_pretrained(const std::string& dir, const PretrainedOptions& opts) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  TR_CHECK(fs::exists(cfg_path), "{}: no config.json (is this a Hugging Face model folder?)", dir);
  Opened o{ModelConfig::from_file(cfg_path), std::make_shared<io::CheckpointReader>(dir), Device::cpu()};
  o.device = opts.device_map.empty() ? opts.device
             : opts.device_map == "auto"
                 ? opts.device
                 : [&] {
                     try {
                       return Device::parse(opts.device_map);
                     } catch (const Error& e) {
                       fail("--device_map {}: expected auto or a device; {}", opts.device_map, e.what());
                     }
                   }();
  if (opts.dtype) {
    o.dtype = *opts.dtype;
  } else {
    for (const auto& n : o.ckpt->names())
      if (is_floating(o.ckpt->info(n).dtype)) {
        o.dtype = o.ckpt->info(n).dtype;
        break;
      }
  }
  return o;
}

// The model with meta parameters; checks that the checkpoint holds each of them and nothing else.
std::unique_ptr<CausalLM> meta_model(const std::string& dir, const Opened& o, const PretrainedOptions& opts) {
  Generator unused(0);
  nn::InitLog placeholders;  // shapes only: the checkpoint's tensors replace them
  auto model = make(o.config, o.device, o.dtype, nn::Init{&unused, Device::meta(), o.dtype, &placeholders});
  model->set_attn_implementation(opts.attn_implementation);
  std::set<std::string> used;
  for (auto& [name, p] : model->named_parameters()) {
    TR_CHECK(o.ckpt->contains(name), "{}: the checkpoint has no tensor '{}' (model_type {})", dir, name,
             o.config.model_type);
    used.insert(name);
  }
  std::vector<std::string> extra;
  for (const auto& n : o.ckpt->names())
    if (!used.count(n) && !ignorable(n) && !(n == "lm_head.weight" && o.config.tie_word_embeddings))
      extra.push_back(n);
  TR_CHECK(extra.empty(), "{}: tensors the model does not use: {}", dir, fmt::join(extra, ", "));
  return model;
}

// One parameter from the checkpoint, in the model's layout (GPT-2's Conv1D weights transposed).
Tensor load_parameter(const std::string& dir, const io::CheckpointReader& ckpt, const std::string& name,
                      bool transposed, const Shape& shape, DType dtype, Device device) {
  Tensor t = ckpt.load(name, dtype, device);
  if (transposed) t = ops::contiguous(ops::transpose(t, 0, 1));
  TR_CHECK(t.shape() == shape, "{}: tensor '{}' has shape {}, the config implies {}", dir, name,
           shape_str(t.shape()), shape_str(shape));
  t = detach(t);  // a borrowed mapping is copy-on-write: training it never touches the file
  autograd::set_requires_grad(t, true);
  return t;
}

// device_map "auto": the placement over the budgets; without budgets, the whole model on opts.device (the
// caller's device: the GPU when one is usable, unless it asked for the CPU).
DevicePlacement place(CausalLM& meta, const Opened& o, const PretrainedOptions& opts) {
  if (opts.device_map != "auto" || opts.max_memory.empty())
    return DevicePlacement::whole(o.device, meta.config().num_layers);
  return infer_auto_device_map(meta, o.dtype, opts.max_memory);
}

}  // namespace

DevicePlacement pretrained_placement(const std::string& dir, const PretrainedOptions& opts) {
  const Opened o = open_pretrained(dir, opts);
  Opened planning = o;  // shapes only: the devices need not exist here
  planning.device = Device::meta();
  auto model = meta_model(dir, planning, opts);
  return place(*model, o, opts);
}

std::unique_ptr<CausalLM> from_pretrained(const std::string& dir, const PretrainedOptions& opts) {
  Opened o = open_pretrained(dir, opts);
  // The placement first (shapes only), so the model's own tables (Llama's rotary ones) are made where its
  // embeddings go - a GPU named in max_memory may hold nothing, and need not exist.
  const DevicePlacement placement = pretrained_placement(dir, opts);
  o.device = placement.embeddings;
  // Parameters start on the meta device (no memory, no init) and are replaced by the checkpoint's tensors,
  // each on its part's device.
  auto model = meta_model(dir, o, opts);
  for (auto& [name, p] : model->named_parameters())
    *p = load_parameter(dir, *o.ckpt, name, model->transposed_on_disk(name), p->shape(), o.dtype,
                        placement.of(name));
  model->set_placement(placement);
  return model;
}

DeferredModel deferred_pretrained(const std::string& dir, const PretrainedOptions& opts) {
  PretrainedOptions f32 = opts;
  f32.dtype = DType::f32;
  const Opened o = open_pretrained(dir, f32);
  DeferredModel d{meta_model(dir, o, f32), {}};
  struct Param {
    std::string name;
    bool transposed;
    Shape shape;
  };
  std::vector<Param> params;
  for (auto& [name, p] : d.model->named_parameters())
    params.push_back({name, d.model->transposed_on_disk(name), p->shape()});
  d.load = [dir, o, params](size_t i) {
    TR_CHECK(i < params.size(), "deferred model: parameter {} of {}", i, params.size());
    const Param& p = params[i];
    return load_parameter(dir, *o.ckpt, p.name, p.transposed, p.shape, DType::f32, o.device);
  };
  return d;
}

DeferredModel deferred_causal_lm(const ModelConfig& config, Device device, Generator& gen,
                                 const std::string& attn_implementation) {
  nn::InitLog log;
  DeferredModel d{make(config, device, DType::f32, nn::Init{&gen, Device::meta(), DType::f32, &log}), {}};
  d.model->set_attn_implementation(attn_implementation);
  std::vector<std::pair<nn::InitRecipe, Shape>> recipes;
  for (auto& [name, p] : d.model->named_parameters()) {
    const auto it = log.find(p->impl_ptr().get());
    TR_CHECK(it != log.end(), "deferred model: parameter '{}' was not made by the model's Init", name);
    recipes.emplace_back(it->second, p->shape());
  }
  d.load = [recipes, device](size_t i) {
    TR_CHECK(i < recipes.size(), "deferred model: parameter {} of {}", i, recipes.size());
    return nn::materialize(recipes[i].first, recipes[i].second, DType::f32, device);
  };
  return d;
}

Tensor hf_tensor(const CausalLM& model, const std::string& name, const Tensor& value) {
  return model.transposed_on_disk(name) ? ops::contiguous(ops::transpose(value, 0, 1)) : value;
}

void save_pretrained(CausalLM& model, const std::string& dir, const std::string& max_shard_size,
                     const SavedWeights* weights) {
  // Write into a temporary folder and rename, so an interrupted save leaves the previous model intact.
  const fs::path final_dir(dir), tmp_dir = fs::path(dir + ".tmp-save");
  fs::remove_all(tmp_dir);
  make_directories(tmp_dir.string(), "save_pretrained");
  const nn::ParamList params = model.named_parameters();
  const DType dtype = weights ? weights->dtype : model.dtype();
  std::vector<io::TensorEntry> entries;
  for (const auto& [name, p] : params) {
    Shape shape = p->shape();
    if (model.transposed_on_disk(name)) std::swap(shape[0], shape[1]);
    entries.push_back({name, weights ? dtype : p->dtype(), shape});
  }
  // One parameter in HF's layout at a time: a save's memory is its largest tensor, not the model.
  const io::TensorMaker make = [&](size_t i) {
    const Tensor value = weights ? weights->parameter(i) : detach(*params[i].second);
    return hf_tensor(model, params[i].first, value);
  };
  try {
    io::save_sharded(tmp_dir.string(), entries, make, io::parse_size(max_shard_size));
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);  // a partial save holds space a full disk needs back
    throw;
  }
  nlohmann::json cfg = model.config().to_json();
  cfg["torch_dtype"] = std::string(dtype_name(dtype));
  if (!cfg.contains("architectures"))
    cfg["architectures"] = {model.config().family == Family::gpt2    ? "GPT2LMHeadModel"
                            : model.config().model_type == "qwen2"   ? "Qwen2ForCausalLM"
                            : model.config().model_type == "qwen3"   ? "Qwen3ForCausalLM"
                            : model.config().model_type == "mistral" ? "MistralForCausalLM"
                                                                     : "LlamaForCausalLM"};
  write_file((tmp_dir / "config.json").string(), cfg.dump(2) + "\n");
  // Swap in. Files we do not own (tokenizer, training state) stay; the previous model files are moved aside
  // first and deleted only once the new ones are in place.
  make_directories(final_dir.string(), "save_pretrained");
  const fs::path old_dir = fs::path(dir + ".old-save");
  fs::remove_all(old_dir);
  make_directories(old_dir.string(), "save_pretrained");
  for (const auto& e : fs::directory_iterator(final_dir)) {
    const std::string n = e.path().filename().string();
    if (n == "config.json" || n == "model.safetensors" || n == "model.safetensors.index.json" ||
        (n.rfind("model-", 0) == 0 && n.find(".safetensors") != std::string::npos))
      fs::rename(e.path(), old_dir / n);
  }
  for (const auto& e : fs::directory_iterator(tmp_dir)) fs::rename(e.path(), final_dir / e.path().filename());
  fs::remove_all(tmp_dir);
  fs::remove_all(old_dir);
}

}  // namespace tr::models
