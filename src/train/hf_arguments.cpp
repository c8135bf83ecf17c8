// HF's TrainingArguments and run_clm.py arguments that are not flags here, each with why: an arguments file
// that HF wrote (every field listed) trains when they hold HF's defaults, and a flag given on the command
// line gets the reason instead of "unknown flag" (transformers 5.2's fields).
#include <algorithm>

#include "train/args.h"

namespace tr::train {

namespace {

const char* const kHub =
    "the Hugging Face Hub needs the network and Python's huggingface_hub; upload output_dir with "
    "`huggingface-cli upload` or git";
const char* const kPython = "a Python library, not available here";
const char* const kNoPredictions =
    "evaluation here computes the loss and perplexity only (run_clm's metrics); no predictions are kept";

const std::vector<UnsupportedArg>& table() {
  using J = nlohmann::json;
  static const std::vector<UnsupportedArg> t = {
      {"push_to_hub", false, kHub},
      {"hub_model_id", J(), kHub},
      {"hub_token", J(), kHub},
      {"hub_private_repo", J(), kHub},
      {"hub_strategy", "every_save", kHub},
      {"hub_always_push", false, kHub},
      {"hub_revision", J(), kHub},
      {"token", J(), kHub},
      {"use_auth_token", false, kHub},
      {"cache_dir", J(),
       "run_clm's Hub download cache; give local files (--model_name_or_path, --train_file)"},
      {"model_revision", "main", kHub},
      {"dataset_name", J(),
       "datasets from the Hub need the network; download the files and give --train_file (text, .jsonl, "
       ".json, "
       ".csv, .tsv, or token shards)"},
      {"dataset_config_name", J(), "datasets from the Hub need the network; give --train_file"},
      {"streaming", false,
       "--train_file is tokenized in bounded memory and cached as token shards (trainer tokenize) already"},
      {"keep_linebreaks", true,
       "text files are tokenized with their line breaks (false, dropping them, is not "
       "supported)"},
      {"trust_remote_code", false, "GPT-2 and Llama-family models only: there is no remote code to run"},
      {"use_liger_kernel", false, "Liger's Triton kernels are Python; --torch_compile fuses our own"},
      {"liger_kernel_config", J(), "Liger's Triton kernels are Python; --torch_compile fuses our own"},
      {"fp16_opt_level", "O1",
       "apex AMP's levels; --fp16 is torch.amp's scheme (fp32 masters, loss scaling)"},
      {"half_precision_backend", "auto",
       "apex AMP is a Python library; --fp16/--bf16 are torch.amp's scheme"},
      {"bf16_full_eval", false, "evaluation runs in the training precision"},
      {"fp16_full_eval", false, "evaluation runs in the training precision"},
      {"jit_mode_eval", false, "TorchScript is Python's; evaluation runs our kernels"},
      {"use_ipex", false, kPython},
      {"use_cpu_amp", false, "--bf16 on the CPU is native here (AMX / AVX512_BF16 where present)"},
      {"torchdynamo", J(), "retired in HF; --torch_compile_backend"},
      {"tpu_num_cores", J(), "no TPU support"},
      {"tpu_metrics_debug", false, "no TPU support"},
      {"ray_scope", "last", kPython},
      {"debug", "", "PyTorch debug options (underflow_overflow, tpu_metrics_debug) are not here"},
      {"include_inputs_for_metrics", false, kNoPredictions},
      {"include_for_metrics", J::array(), kNoPredictions},
      {"batch_eval_metrics", false, kNoPredictions},
      {"eval_do_concat_batches", true, kNoPredictions},
      {"eval_use_gather_object", false, kNoPredictions},
      {"past_index", -1, "models here keep no past state between batches"},
      {"label_names", J(), "a causal LM's labels are its inputs, shifted"},
      {"length_column_name", "length",
       "every block holds block_size tokens: there are no lengths to group by"},
      {"train_sampling_strategy", "random", "batches are drawn in a seeded random order (--data_seed)"},
      {"fsdp_min_num_params", 0, "--fsdp shards per decoder layer; --fsdp_config"},
      {"fsdp_transformer_layer_cls_to_wrap", J(), "--fsdp shards per decoder layer; --fsdp_config"},
      {"accelerator_config",
       J{{"split_batches", false},
         {"dispatch_batches", J()},
         {"even_batches", true},
         {"use_seedable_sampler", true},
         {"non_blocking", false},
         {"gradient_accumulation_kwargs", J()},
         {"use_configured_state", false}},
       "accelerate is a Python library; the loader is ours (--dataloader_*), each rank drawing its slice"},
      {"place_model_on_device", J(), "the model is placed by --use_cpu / --device_map"},
      {"parallelism_config", J(), "accelerate is a Python library; --fsdp and trainer launch"},
      {"dispatch_batches", J(), "accelerate is a Python library; each rank draws its own slice"},
      {"split_batches", J(), "accelerate is a Python library; each rank draws its own slice"},
      {"project", "huggingface", "trackio's; --report_to tensorboard or jsonl"},
      {"trackio_space_id", "trackio", "trackio's; --report_to tensorboard or jsonl"},
      {"use_cache", false, "training keeps no key/value cache"},
      {"enable_jit_checkpoint", false, "saves are checkpoint-N folders at save_steps; SIGTERM saves one"},
      {"restore_callback_states_from_checkpoint", false, "no Python callbacks here"},
      {"save_on_each_node", false, "rank 0 saves; a sharded run checks that every node sees output_dir"},
      {"mp_parameters", "", "SageMaker's; not here"},
      {"use_mps_device", false, "no Apple MPS support"},
      {"use_legacy_prediction_loop", false, kNoPredictions},
      {"push_to_hub_model_id", J(), kHub},
      {"push_to_hub_organization", J(), kHub},
      {"push_to_hub_token", J(), kHub},
      {"ddp_backend_config", J(), "--ddp_backend nccl or gloo"},
      {"evaluation_strategy", J(), "renamed eval_strategy in HF"},
  };
  return t;
}

}  // namespace

const UnsupportedArg* unsupported_hf_argument(const std::string& name) {
  const auto& t = table();
  const auto it = std::find_if(t.begin(), t.end(), [&](const UnsupportedArg& a) { return a.name == name; });
  return it == t.end() ? nullptr : &*it;
}

}  // namespace tr::train
