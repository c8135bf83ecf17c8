// device_map="auto": the units of a model placed on devices by their bytes; see device_map.h.
#include "models/device_map.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/allocator.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "ops/ops.h"

namespace tr::models {

DevicePlacement DevicePlacement::whole(Device d, int64_t layers) {
  return {d, std::vector<Device>(static_cast<size_t>(layers), d), d};
}

bool DevicePlacement::single() const {
  return std::all_of(layers.begin(), layers.end(), [&](Device d) { return d == embeddings; }) &&
         head == embeddings;
}

Device DevicePlacement::of(const std::string& name) const {
  const int layer = CausalLM::decoder_layer_of(name);
  if (layer >= 0) {
    TR_CHECK(static_cast<size_t>(layer) < layers.size(), "device placement: '{}' is past its {} layers", name,
             layers.size());
    return layers[static_cast<size_t>(layer)];
  }
  return CausalLM::is_embedding(name) ? embeddings : head;
}

std::vector<Device> DevicePlacement::devices() const {
  std::vector<Device> out{embeddings};
  for (const Device d : layers)
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  if (std::find(out.begin(), out.end(), head) == out.end()) out.push_back(head);
  return out;
}

std::vector<PlacementUnit> placement_units(CausalLM& model, DType dtype) {
  const int64_t layers = model.config().num_layers;
  std::vector<PlacementUnit> units;
  units.push_back({"embeddings", -1, 0});
  for (int64_t i = 0; i < layers; ++i) units.push_back({fmt::format("layer {}", i), static_cast<int>(i), 0});
  units.push_back({"head", -1, 0});
  for (const auto& [name, p] : model.named_parameters()) {
    const int layer = CausalLM::decoder_layer_of(name);
    const size_t u = layer >= 0                     ? static_cast<size_t>(layer) + 1
                     : CausalLM::is_embedding(name) ? 0
                                                    : units.size() - 1;
    units[u].bytes += p->numel() * static_cast<int64_t>(dtype_size(dtype));
  }
  return units;
}

std::string DevicePlacement::summary() const {
  std::string out;
  for (const Device d : devices()) {
    std::vector<std::string> parts;
    if (embeddings == d) parts.push_back("embeddings");
    for (size_t i = 0; i < layers.size(); ++i) {
      if (layers[i] != d || (i > 0 && layers[i - 1] == d)) continue;
      size_t j = i;
      while (j + 1 < layers.size() && layers[j + 1] == d) ++j;
      parts.push_back(i == j ? fmt::format("layer {}", i) : fmt::format("layers {}-{}", i, j));
    }
    if (head == d) parts.push_back("the head");
    std::string what;
    for (size_t k = 0; k < parts.size(); ++k)
      what += (k == 0 ? "" : k + 1 == parts.size() ? " and " : ", ") + parts[k];
    out += (out.empty() ? "" : "; ") + what + " on " + d.str();
  }
  return out;
}

namespace {

std::string gib(int64_t b) {
  const double v = static_cast<double>(b);
  return v >= (1 << 30)   ? fmt::format("{:.2f} GiB", v / (1 << 30))
         : v >= (1 << 20) ? fmt::format("{:.2f} MiB", v / (1 << 20))
                          : fmt::format("{:.1f} KiB", v / 1024);
}

bool fits(int64_t used, int64_t add, int64_t cap) { return cap <= 0 || used + add <= cap; }

}  // namespace

DevicePlacement infer_auto_device_map(CausalLM& model, DType dtype, std::vector<DeviceBudget> budgets) {
  // The host (cpu) takes what is left; host partitions (cpu:N, tests) place like GPUs.
  const auto host = [](const DeviceBudget& b) { return b.device == Device::cpu(); };
  if (std::none_of(budgets.begin(), budgets.end(), host)) budgets.push_back({Device::cpu(), 0});
  TR_CHECK(host(budgets.back()) && std::count_if(budgets.begin(), budgets.end(), host) == 1,
           "device_map auto: the host (cpu) comes once, after the accelerators");
  const std::vector<PlacementUnit> units = placement_units(model, dtype);
  const bool tied = model.config().tie_word_embeddings;
  int64_t total = 0;
  for (const auto& u : units) total += u.bytes;
  const size_t L = units.size() - 2;
  DevicePlacement p = DevicePlacement::whole(budgets.front().device, static_cast<int64_t>(L));
  if (fits(0, total, budgets.front().bytes)) return p;
  // Chunks placed whole: the embeddings with layer 0 (and a tied head, which reads their table), each
  // further layer, and the last layer with an untied head.
  struct Chunk {
    size_t first, last;  // units [first, last]
    int64_t bytes;
  };
  std::vector<Chunk> chunks;
  for (size_t u = 0; u < units.size(); ++u) {
    const bool joins = u == 1 || (u == units.size() - 1 && !tied);  // layer 0; an untied head
    if (joins && !chunks.empty()) {
      chunks.back().last = u;
      chunks.back().bytes += units[u].bytes;
    } else if (u == units.size() - 1) {  // a tied head rides with the embeddings
      chunks.front().bytes += units[u].bytes;
    } else {
      chunks.push_back({u, u, units[u].bytes});
    }
  }
  // Balanced: each accelerator takes up to an equal share of the model (the last one, and the host, up to
  // its budget), in order.
  size_t accelerators = 0;
  while (accelerators < budgets.size() && !host(budgets[accelerators])) ++accelerators;
  const int64_t share =
      accelerators > 0 ? (total + static_cast<int64_t>(accelerators) - 1) / static_cast<int64_t>(accelerators)
                       : 0;
  std::vector<Device> unit_device(units.size(), budgets.front().device);
  size_t d = 0;
  int64_t used = 0;
  for (const Chunk& c : chunks) {
    for (;; ++d, used = 0) {
      TR_CHECK(
          d < budgets.size(),
          "device_map auto: the model's {} ({}) do not fit the devices' budgets ({}); {} is left without a "
          "place: give larger budgets (--max_memory; --device_memory for generate and info), or a host "
          "budget",
          gib(total), fmt::format("{} parameters' bytes in {}", model.num_parameters(), dtype_name(dtype)),
          [&] {
            std::string s;
            for (const auto& b : budgets)
              s +=
                  (s.empty() ? "" : ", ") + b.device.str() + " " + (b.bytes > 0 ? gib(b.bytes) : "unbounded");
            return s;
          }(),
          units[c.first].name);
      const bool last_accelerator = d + 1 >= accelerators;
      const int64_t fair = std::max(share, c.bytes);
      const int64_t cap = host(budgets[d]) || last_accelerator ? budgets[d].bytes
                          : budgets[d].bytes > 0               ? std::min(budgets[d].bytes, fair)
                                                               : fair;
      if (fits(used, c.bytes, cap)) break;
    }
    for (size_t u = c.first; u <= c.last; ++u) unit_device[u] = budgets[d].device;
    used += c.bytes;
  }
  p.embeddings = unit_device.front();
  for (size_t i = 0; i < L; ++i) p.layers[i] = unit_device[i + 1];
  p.head = tied ? p.embeddings : unit_device.back();
  return p;
}

void place_parameters(CausalLM& model, const DevicePlacement& p) {
  for (auto& [name, t] : model.named_parameters()) {
    if (t->device() == p.of(name)) continue;
    *t = detach(ops::to_device(*t, p.of(name)));
    autograd::set_requires_grad(*t, true);
  }
  model.set_placement(p);
}

std::vector<DeviceBudget> parse_device_memory(const std::string& text, const std::string& flag) {
  std::vector<DeviceBudget> out;
  int next_gpu = 0;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, comma - start);
    start = comma + 1;
    Device dev = Device::cuda(next_gpu);
    if (const size_t colon = item.find(':'); colon != std::string::npos) {
      const std::string key = item.substr(0, colon);
      item = item.substr(colon + 1);
      if (key == "cpu" && item.find(':') != std::string::npos) {
        // cpu:N:SIZE: host partition N (1..7), placed like a GPU - a split on a machine without GPUs
        // (tests, and trying a placement before renting the devices).
        const std::string index = item.substr(0, item.find(':'));
        item = item.substr(item.find(':') + 1);
        TR_CHECK(index.size() == 1 && index[0] >= '1' && index[0] < '0' + CpuAllocator::kHostPartitions,
                 "--{} '{}': 'cpu:{}' is not a host partition (cpu:1 .. cpu:{})", flag, text, index,
                 CpuAllocator::kHostPartitions - 1);
        dev = Device{DeviceType::cpu, index[0] - '0'};
      } else if (key == "cpu") {
        dev = Device::cpu();
      } else {
        TR_CHECK(!key.empty() && key.size() <= 4 && std::all_of(key.begin(), key.end(), ::isdigit),
                 "--{} '{}': '{}' is not a GPU index or cpu (expected 24GB,24GB or 0:24GB,1:24GB,cpu:64GB)",
                 flag, text, key);
        dev = Device::cuda(std::stoi(key));
      }
    }
    uint64_t bytes = 0;
    try {
      bytes = io::parse_size(item);
    } catch (const Error&) {
      bytes = 0;
    }
    TR_CHECK(bytes > 0 && bytes < (uint64_t{1} << 62),
             "--{} '{}': '{}' is not a size (expected 24GB, 24GiB or 512MB per device)", flag, text, item);
    TR_CHECK(std::none_of(out.begin(), out.end(), [&](const DeviceBudget& b) { return b.device == dev; }),
             "--{} '{}': {} is given twice", flag, text, dev.str());
    TR_CHECK(dev == Device::cpu() || out.empty() || out.back().device != Device::cpu(),
             "--{} '{}': the host (cpu) comes last, after the GPUs", flag, text);
    out.push_back({dev, static_cast<int64_t>(bytes)});
    if (dev.is_cuda()) next_gpu = dev.index + 1;
    if (comma == text.size()) break;
  }
  return out;
}

}  // namespace tr::models
