// HF's device_map="auto" (accelerate's infer_auto_device_map with the "balanced" split): a model that fits on
// the first device goes there whole; one that does not is split by decoder layers across the devices in
// order - the embeddings with the first layer, the final norm and an untied head with the last (a tied head
// stays with the embeddings it shares) - balanced by bytes, with the host taking what is left. The model then
// runs split: activations move between devices at the layer boundaries (CausalLM::set_placement).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace tr::models {

class CausalLM;

// A device and the bytes the placement may put there (0: unbounded, the host's default).
struct DeviceBudget {
  Device device;
  int64_t bytes = 0;
};

// Where each part of a model lives.
struct DevicePlacement {
  Device embeddings;           // token (and GPT-2's position) embeddings
  std::vector<Device> layers;  // decoder layer i
  Device head;                 // the final norm and the LM head (tied: the embeddings' device)
  // Everything on `d`.
  static DevicePlacement whole(Device d, int64_t layers);
  bool single() const;
  // The device of parameter `name` (HF names).
  Device of(const std::string& name) const;
  // The distinct devices, in the order the forward pass first uses them.
  std::vector<Device> devices() const;
  // "embeddings and layers 0-1 on cpu:1, layers 2-5 on cpu:2, the head on cpu".
  std::string summary() const;
};

// One placeable unit: the embeddings, a decoder layer, or the head, and its parameters' bytes in the load
// dtype.
struct PlacementUnit {
  std::string name;  // "embeddings", "layer 3", "head"
  int layer = -1;    // decoder layer, or -1
  int64_t bytes = 0;
};
// The units of `model` (parameters as meta tensors will do: only shapes are read) in `dtype`.
std::vector<PlacementUnit> placement_units(CausalLM& model, DType dtype);

// The placement over `budgets` (accelerators first, in order - GPUs, or host partitions cpu:N - then the
// host, cpu: added, unbounded, when not given). Throws naming the model's size and the budgets when even they
// cannot hold it.
DevicePlacement infer_auto_device_map(CausalLM& model, DType dtype, std::vector<DeviceBudget> budgets);

// Moves each parameter of `model` (made whole on one device) to its place in `p`, as a trainable leaf, and
// sets the placement: how a fresh model is split (initialized on the host first, as HF initializes).
void place_parameters(CausalLM& model, const DevicePlacement& p);

// "24GB,24GB" or "0:24GB,1:24GB,cpu:64GB" (HF's max_memory): the budget of each GPU in order, and the host's
// when named. Throws naming `flag` on a size that does not parse.
std::vector<DeviceBudget> parse_device_memory(const std::string& text, const std::string& flag);

}  // namespace tr::models
