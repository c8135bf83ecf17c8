// The TrainingArguments table: every flag once, with its member, help and group. The CLI, the JSON arguments
// file, training_args.json and docs/FLAGS.md are all generated from it.
#include "train/args.h"

namespace tr::train {

using A = TrainingArguments;

const std::vector<ArgSpec>& argument_specs() {
  static const std::vector<ArgSpec> specs = {
      {"model_name_or_path", &A::model_name_or_path, "HF model folder to fine-tune", "model and data"},
      {"config_name", &A::config_name,
       "train from scratch: a built-in name (gpt2, gpt2-medium, gpt2-mini, llama-60m, ...), a config.json or "
       "an "
       "HF folder",
       "model and data"},
      {"model_type", &A::model_type,
       "run_clm's from scratch: gpt2 or llama, HF's config class at its defaults (GPT2Config(): 124M; "
       "LlamaConfig(): 6.7B), edited by --config_overrides",
       "model and data"},
      {"config_overrides", &A::config_overrides,
       "with --model_type: \"n_embd=256,n_layer=4\" (each key in the config; a value read as the type it "
       "replaces, as HF's update_from_string)",
       "model and data"},
      {"tokenizer_name", &A::tokenizer_name, "tokenizer.json, or a folder with one (default: the model's)",
       "model and data"},
      {"train_file", &A::train_file,
       "a text, .jsonl, .json, .csv or .tsv file or a glob of them (data/**/*.txt, as datasets' data_files), "
       "or "
       "llm.c / nanoGPT token shards (.bin, glob)",
       "model and data"},
      {"validation_file", &A::validation_file,
       "text or token shards for evaluation (default: validation_split_percentage of train_file)",
       "model and data"},
      {"validation_split_percentage", &A::validation_split_percentage,
       "without validation_file, the first this-many percent of the training tokens are held out for "
       "evaluation",
       "model and data"},
      {"block_size", &A::block_size, "tokens per training sequence", "model and data"},
      {"attn_implementation", &A::attn_implementation, "eager, sdpa or flash_attention_2", "model and data"},
      {"pad_vocab_to_multiple_of", &A::pad_vocab_to_multiple_of,
       "round the vocab_size up to a multiple of N (tensor-core friendly GEMMs: 64; 0: off; pretrained "
       "models grow with mean-initialized rows)",
       "model and data"},
      {"device_map", &A::device_map,
       "from_pretrained's device_map: auto splits a model too large for the first device by decoder layers "
       "across the GPUs, then the host (train runs the split as a naive pipeline); eval also takes a device",
       "model and data"},
      {"max_memory", &A::max_memory,
       "with device_map auto: each GPU's budget in order, and the host's (HF's max_memory): 24GB,24GB or "
       "0:24GB,1:24GB,cpu:64GB (cpu:1:8MB: a host partition placed like a GPU, for trying a split)",
       "model and data"},
      {"max_train_samples", &A::max_train_samples,
       "train on the first N blocks of block_size tokens (run_clm's, after the validation split; 0: all)",
       "model and data"},
      {"max_eval_samples", &A::max_eval_samples,
       "evaluate on the first N blocks of the validation tokens (0: all)", "model and data"},
      {"text_column_name", &A::text_column_name,
       "the column of .jsonl/.json/.csv/.tsv data files holding the text (default: text, else the first)",
       "model and data"},
      {"output_dir", &A::output_dir, "where checkpoints, the final model, tokenizer and metrics go",
       "training"},
      {"do_train", &A::do_train, "run_clm's: trainer train always trains (false: use trainer eval)",
       "training"},
      {"overwrite_output_dir", &A::overwrite_output_dir,
       "allow an output_dir that already holds a trained model or checkpoints", "training"},
      {"per_device_train_batch_size", &A::per_device_train_batch_size,
       "sequences per micro-batch, or auto: the largest power of two the memory estimate fits (a GPU's "
       "memory; on the CPU the allocator's cap or the memory available)",
       "training"},
      {"total_batch_size", &A::total_batch_size,
       "ours: sequences (64) or tokens (65536tokens) per optimizer step; gradient_accumulation_steps becomes "
       "it divided by per_device_train_batch_size",
       "training"},
      {"gradient_accumulation_steps", &A::gradient_accumulation_steps,
       "micro-batches per optimizer step (loss normalized by the label tokens of the whole step)",
       "training"},
      {"learning_rate", &A::learning_rate, "peak learning rate", "training"},
      {"weight_decay", &A::weight_decay, "decoupled weight decay (not for biases and norm weights)",
       "training"},
      {"adam_beta1", &A::adam_beta1, "", "training"},
      {"adam_beta2", &A::adam_beta2, "", "training"},
      {"adam_epsilon", &A::adam_epsilon, "", "training"},
      {"max_grad_norm", &A::max_grad_norm, "clip the global gradient L2 norm to this (<= 0: off)",
       "training"},
      {"label_smoothing_factor", &A::label_smoothing_factor,
       "label smoothing epsilon, 0 to 1 (0: none): each token's loss against (1 - e) * one-hot + e / vocab, "
       "normalized by the step's label tokens; eval_loss is smoothed too, as HF's",
       "training"},
      {"neftune_noise_alpha", &A::neftune_noise_alpha,
       "NEFTune: uniform noise in +-alpha / sqrt(block_size * hidden) on the token embeddings of training "
       "steps (not evaluations); the paper used 5 to 15; 0: off",
       "training"},
      {"num_train_epochs", &A::num_train_epochs, "epochs (fractions allowed); max_steps > 0 overrides",
       "training"},
      {"max_steps", &A::max_steps, "optimizer steps (-1: from num_train_epochs)", "training"},
      {"lr_scheduler_type", &A::lr_scheduler_type,
       "linear, cosine, cosine_with_restarts, polynomial, constant, constant_with_warmup, inverse_sqrt, "
       "reduce_lr_on_plateau (stepped by each evaluation's metric_for_best_model), cosine_with_min_lr, "
       "cosine_warmup_with_min_lr or warmup_stable_decay",
       "training"},
      {"lr_scheduler_kwargs", &A::lr_scheduler_kwargs,
       "the schedule's own arguments as a JSON object, e.g. '{\"min_lr_rate\": 0.1}' (cosine_with_min_lr), "
       "'{\"num_decay_steps\": 100}' (warmup_stable_decay), '{\"patience\": 2}' (reduce_lr_on_plateau)",
       "training"},
      {"warmup_steps", &A::warmup_steps, "warmup steps, or a ratio of the total below 1", "training"},
      {"warmup_ratio", &A::warmup_ratio, "warmup as a ratio of the total steps", "training"},
      {"optim", &A::optim,
       "adamw_torch, adamw_torch_fused, adamw_apex_fused (= adamw_torch_xla, adamw_torch_npu_fused), "
       "adafactor, adamw_bnb_8bit (= adamw_8bit, "
       "paged_adamw_8bit), paged_adamw_32bit, sgd, adagrad, rmsprop, rmsprop_bnb (= rmsprop_bnb_32bit), "
       "rmsprop_bnb_8bit, lion_32bit (= paged_lion_32bit), lion_8bit (= paged_lion_8bit), ademamix (= "
       "paged_ademamix_32bit), ademamix_8bit (= paged_ademamix_8bit), schedule_free_adamw, "
       "schedule_free_radam, schedule_free_sgd, stable_adamw, galore_adamw, galore_adamw_8bit, "
       "galore_adafactor, apollo_adamw (with --optim_target_modules; each also _layerwise), grokadamw, lomo, "
       "adalomo "
       "(lomo, adalomo and _layerwise update each parameter during backward), adamw_anyprecision "
       "(torchdistx's: states in chosen dtypes, Kahan summation for bf16 weights); paged: the state stays "
       "resident",
       "training"},
      {"optim_args", &A::optim_args,
       "extra optimizer arguments, e.g. \"momentum=0.9,nesterov=true\": sgd momentum, dampening, nesterov; "
       "adafactor beta1, clip_threshold, decay_rate, eps1, eps2, scale_parameter, relative_step, "
       "warmup_init; "
       "adagrad lr_decay, initial_accumulator_value, eps; rmsprop alpha, eps, momentum; rmsprop_bnb* alpha, "
       "eps; ademamix* beta1, beta2, beta3, alpha, eps, t_alpha, t_beta3; schedule_free_* weight_lr_power, r "
       "(schedule_free_sgd also momentum); stable_adamw decouple_lr, max_lr, kahan_sum; galore_* rank, "
       "update_proj_gap, scale, proj_type (std, reverse_std, right, left, full); apollo_* rank, proj "
       "(random, "
       "svd), scale_type (channel, tensor), update_proj_gap, scale, proj_type; grokadamw alpha_init, "
       "lamb, gamma, grokking_signal_decay_rate, gradient_clipping; adamw_anyprecision use_kahan_summation, "
       "momentum_dtype, variance_dtype, compensation_buffer_dtype (float32, bfloat16, float16); the 8-bit "
       "ones "
       "min_8bit_size",
       "training"},
      {"optim_target_modules", &A::optim_target_modules,
       "the galore_* and apollo_* optimizers' targets: a regex of whole module names (e.g. "
       "'.*(attn|mlp).*'), all-linear, "
       "or a JSON list of names, each matching exactly, as a substring or as a regex (e.g. '[\"q_proj\", "
       "\"v_proj\"]'); linear layers only",
       "training"},
      {"seed", &A::seed, "seed of initialization, shuffling and dropout", "training"},
      {"data_seed", &A::data_seed, "seed of the data order alone (-1: --seed)", "training"},
      {"dataloader_num_workers", &A::dataloader_num_workers, "batch-building threads (0: the main thread)",
       "training"},
      {"dataloader_pin_memory", &A::dataloader_pin_memory, "page-locked batches for a GPU", "training"},
      {"dataloader_prefetch_factor", &A::dataloader_prefetch_factor,
       "batches each loader worker queues ahead (0: 2; needs --dataloader_num_workers > 0, as HF)",
       "training"},
      {"dataloader_drop_last", &A::dataloader_drop_last, "drop an epoch's incomplete last batch", "training"},
      {"ignore_data_skip", &A::ignore_data_skip,
       "a resume starts the current epoch's data from its first batch instead of where the run stopped "
       "(HF's; "
       "the losses then differ from the uninterrupted run's)",
       "training"},
      {"resume_from_checkpoint", &A::resume_from_checkpoint,
       "a checkpoint folder, or true for the newest checkpoint-N in output_dir", "training"},
      {"do_eval", &A::do_eval, "evaluate at the end of training", "evaluation and saving"},
      {"do_predict", &A::do_predict, "run_clm's: there is no test split (true is refused)",
       "evaluation and saving"},
      {"eval_strategy", &A::eval_strategy, "no, steps or epoch", "evaluation and saving"},
      {"eval_steps", &A::eval_steps, "evaluate every N steps (ratio below 1; 0: logging_steps)",
       "evaluation and saving"},
      {"eval_delay", &A::eval_delay,
       "steps (epochs, under eval_strategy epoch) to wait before the first evaluation",
       "evaluation and saving"},
      {"eval_on_start", &A::eval_on_start, "evaluate once before the first step", "evaluation and saving"},
      {"per_device_eval_batch_size", &A::per_device_eval_batch_size, "sequences per evaluation batch",
       "evaluation and saving"},
      {"metric_for_best_model", &A::metric_for_best_model,
       "the evaluation metric that picks the best checkpoint: loss or perplexity (eval_ prefix optional); "
       "default loss with load_best_model_at_end or reduce_lr_on_plateau",
       "evaluation and saving"},
      {"greater_is_better", &A::greater_is_better,
       "whether a larger metric_for_best_model is better; unset: false for a metric ending in loss",
       "evaluation and saving"},
      {"load_best_model_at_end", &A::load_best_model_at_end,
       "the final model (and the final evaluation) is the best checkpoint's; needs save and eval strategies "
       "that match (save_steps a multiple of eval_steps)",
       "evaluation and saving"},
      {"logging_strategy", &A::logging_strategy,
       "no, steps or epoch (the last step is logged too, unless no)", "evaluation and saving"},
      {"logging_steps", &A::logging_steps, "log every N steps (ratio below 1)", "evaluation and saving"},
      {"logging_first_step", &A::logging_first_step, "also log the first step", "evaluation and saving"},
      {"include_num_input_tokens_seen", &A::include_num_input_tokens_seen,
       "no, all or non_padding (true: all): each log gets num_input_tokens_seen, the input tokens of every "
       "rank trained on so far (blocks hold no padding, so all and non_padding count alike)",
       "evaluation and saving"},
      {"disable_tqdm", &A::disable_tqdm, "print each log as a line instead of the progress bar",
       "evaluation and saving"},
      {"run_name", &A::run_name,
       "a name for the run (HF's integrations): in the banner and TensorBoard's args",
       "evaluation and saving"},
      {"log_level", &A::log_level, "debug, info, warning, error, critical or passive (accepted, as HF)",
       "evaluation and saving"},
      {"log_level_replica", &A::log_level_replica, "the log level of ranks other than 0 (accepted, as HF)",
       "evaluation and saving"},
      {"logging_nan_inf_filter", &A::logging_nan_inf_filter,
       "log a nan/inf step loss as the mean of the logging window so far (false: as it is)",
       "evaluation and saving"},
      {"report_to", &A::report_to,
       "tensorboard, jsonl, all or none, or a comma-separated list (metrics.jsonl is always written)",
       "evaluation and saving"},
      {"logging_dir", &A::logging_dir,
       "TensorBoard's folder (default: output_dir/runs/<Mon DD_HH-MM-SS>_<host>; a resume keeps the run's)",
       "evaluation and saving"},
      {"save_strategy", &A::save_strategy,
       "no, steps or epoch (a checkpoint is also saved at the end), or best: whenever an evaluation finds a "
       "new best metric_for_best_model",
       "evaluation and saving"},
      {"save_steps", &A::save_steps, "checkpoint every N steps (ratio below 1)", "evaluation and saving"},
      {"save_total_limit", &A::save_total_limit,
       "keep N checkpoints: the newest, and the best one when metric_for_best_model is tracked (1 keeps 2 "
       "while the best is not the newest); 0: all",
       "evaluation and saving"},
      {"save_only_model", &A::save_only_model,
       "checkpoints hold the model and tokenizer only: no optimizer, scheduler or RNG state, so no resume",
       "evaluation and saving"},
      {"use_cpu", &A::use_cpu, "train on the CPU even when a GPU is present", "precision and memory"},
      {"bf16", &A::bf16, "bf16 compute copies, fp32 master weights", "precision and memory"},
      {"torch_dtype", &A::torch_dtype,
       "the model's dtype: bfloat16 trains its own bf16 weights (no fp32 masters; AdamW's moments bf16, "
       "other "
       "optimizers' state f32; gradients accumulate in bf16), float32, or auto (the checkpoint's config); "
       "unset: float32",
       "precision and memory"},
      {"dtype", &A::dtype, "transformers 5's name for --torch_dtype", "precision and memory"},
      {"fp16", &A::fp16, "fp16 compute copies, fp32 master weights, dynamic loss scaling",
       "precision and memory"},
      {"tf32", &A::tf32,
       "fp32 matmuls with TF32 inputs (tensor cores; emulated by rounding on the CPU); unset: on for "
       "torch_compile on a GPU without fp16, else off",
       "precision and memory"},
      {"gradient_checkpointing", &A::gradient_checkpointing, "recompute each decoder layer in backward",
       "precision and memory"},
      {"gradient_checkpointing_kwargs", &A::gradient_checkpointing_kwargs,
       "HF's dict for torch.utils.checkpoint: use_reentrant and preserve_rng_state (true or false; the "
       "recompute gives the same numbers either way, dropout redrawn as it was drawn)",
       "precision and memory"},
      {"torch_empty_cache_steps", &A::torch_empty_cache_steps,
       "release the allocator's cached blocks every N steps (after forward, before backward; 0: never)",
       "precision and memory"},
      {"auto_find_batch_size", &A::auto_find_batch_size,
       "on out-of-memory retry with a smaller batch, raising gradient_accumulation_steps to keep the "
       "effective batch",
       "precision and memory"},
      {"torch_compile", &A::torch_compile,
       "capture the training step once per shape and replay it (static memory plan; same numbers as eager)",
       "precision and memory"},
      {"torch_compile_backend", &A::torch_compile_backend,
       "inductor (default), cudagraphs, aot_cudagraphs, aot_eager or eager; setting it turns compile on",
       "precision and memory"},
      {"torch_compile_mode", &A::torch_compile_mode,
       "default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs; setting it turns compile on",
       "precision and memory"},
      {"ddp_backend", &A::ddp_backend, "gloo or nccl (GPUs); default: gloo (until NCCL has run on GPUs)",
       "distributed"},
      {"ddp_timeout", &A::ddp_timeout,
       "seconds a rank waits for the others (rendezvous and every collective) before failing", "distributed"},
      {"ddp_bucket_cap_mb", &A::ddp_bucket_cap_mb, "MB of gradients per all-reduce bucket", "distributed"},
      {"ddp_find_unused_parameters", &A::ddp_find_unused_parameters,
       "accepted for HF compatibility: every parameter of our models gets a gradient", "distributed"},
      {"ddp_broadcast_buffers", &A::ddp_broadcast_buffers,
       "accepted for HF compatibility: our models hold no buffers that training changes", "distributed"},
      {"fsdp", &A::fsdp,
       "sharding (space-separated): shard_grad_op (ZeRO-2: gradients and optimizer state 1/N per rank), "
       "full_shard (ZeRO-3: parameters too, gathered per layer); hybrid_shard, hybrid_shard_zero2 (the same "
       "within each node, replicated across nodes); offload (with one of them: fp32 masters, gradient shard "
       "and optimizer state in host memory, updated there); auto_wrap, no_shard",
       "distributed"},
      {"fsdp_config", &A::fsdp_config, "a JSON file of FSDP options (an arguments file may hold HF's dict)",
       "distributed"},
      {"deepspeed", &A::deepspeed,
       "a DeepSpeed config (ds_config.json, or an arguments file's dict), read as HF's Trainer reads it: "
       "\"auto\" values take the flags', others must equal them; zero_optimization.stage 1-2 trains as "
       "--fsdp "
       "shard_grad_op, 3 as full_shard, offload_optimizer cpu adds offload; its Adam/AdamW, WarmupLR, "
       "WarmupDecayLR, WarmupCosineLR and fp16 loss scaler run with DeepSpeed's arithmetic",
       "distributed"},
      {"average_tokens_across_devices", &A::average_tokens_across_devices,
       "normalize the loss by the label tokens of all ranks (false: each rank by its own, gradients "
       "averaged)",
       "distributed"},
      {"full_determinism", &A::full_determinism,
       "accepted: runs here are deterministic (same seed, same bits)", "compatibility"},
      {"skip_memory_metrics", &A::skip_memory_metrics,
       "accepted: memory peaks are always measured (they cost nothing here)", "compatibility"},
      {"include_tokens_per_second", &A::include_tokens_per_second, "accepted: tokens/s is always reported",
       "compatibility"},
      {"dataloader_persistent_workers", &A::dataloader_persistent_workers,
       "accepted: the loader's workers live for the whole run", "compatibility"},
      {"prediction_loss_only", &A::prediction_loss_only,
       "accepted: evaluation computes the loss (and perplexity) only", "compatibility"},
      {"eval_accumulation_steps", &A::eval_accumulation_steps,
       "accepted: evaluation gathers no predictions to accumulate", "compatibility"},
      {"remove_unused_columns", &A::remove_unused_columns, "accepted: only the text column is read",
       "compatibility"},
      {"group_by_length", &A::group_by_length, "accepted: every block holds block_size tokens",
       "compatibility"},
      {"log_on_each_node", &A::log_on_each_node, "accepted: rank 0 alone prints", "compatibility"},
      {"save_safetensors", &A::save_safetensors, "weights are always saved as safetensors (false is refused)",
       "compatibility"},
      {"use_fast_tokenizer", &A::use_fast_tokenizer,
       "run_clm's: tokenizer.json (the fast tokenizer's file) is what runs here (false is refused)",
       "compatibility"},
      {"low_cpu_mem_usage", &A::low_cpu_mem_usage, "run_clm's; accepted: weights load one tensor at a time",
       "compatibility"},
      {"local_rank", &A::local_rank,
       "accepted: torch.distributed.launch passes it; the LOCAL_RANK environment variable is what is read",
       "compatibility"},
      {"overwrite_cache", &A::overwrite_cache,
       "run_clm's; accepted: no tokenization cache is kept (trainer tokenize writes shards to reuse)",
       "compatibility"},
      {"preprocessing_num_workers", &A::preprocessing_num_workers,
       "run_clm's; accepted: tokenization uses every core (trainer tokenize --num_proc sets a number)",
       "compatibility"},
  };
  return specs;
}

std::vector<std::string> argument_names() {
  std::vector<std::string> n;
  for (const auto& s : argument_specs()) n.push_back(s.name);
  return n;
}

}  // namespace tr::train
