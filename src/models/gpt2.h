// Factories of the model families (used by the registry in pretrained.cpp).
#pragma once
#include "models/causal_lm.h"

namespace tr::models {
std::unique_ptr<CausalLM> make_gpt2(const ModelConfig& c, Device d, DType t, const nn::Init& init);
std::unique_ptr<CausalLM> make_llama(const ModelConfig& c, Device d, DType t, const nn::Init& init);
}  // namespace tr::models
