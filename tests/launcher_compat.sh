#!/usr/bin/env bash
# `trainer train` started by other launchers than ours, each where it is installed (skipped loudly where
# not; exit 77 when none is):
#  1. real torchrun (PyTorch's elastic agent, `--no_python`; Debian's python3-torch): with static rendezvous
#     (--master_addr/--master_port) the agent's own TCPStore holds MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=
#     True) and the ranks meet through it in torch's protocol; with --standalone (c10d) torch < 2.5 leaves
#     MASTER_PORT to rank 0 and 2.5+ shares a fresh agent store;
#  2. Open MPI's mpirun (OMPI_COMM_WORLD_* and MASTER_ADDR/MASTER_PORT passed with -x; rank 0 serves);
#  3. Slurm's srun, where a cluster answers (SLURM_PROCID / SLURM_STEP_NUM_TASKS / SLURM_LOCALID; rank 0 serves).
# Each trains 2 ranks to the losses of 1 process with the same global batch (1e-5) and of `trainer launch`
# (bitwise).
# Usage: launcher_compat.sh TRAINER TOKENIZER_DIR TEXT WORK_DIR
set -euo pipefail
suite=launcher_compat
source "$(dirname "$0")/dist_lib.sh"
py=
for p in python3 /usr/bin/python3; do  # (a pyenv python3 first on PATH may lack Debian's torch)
  if "$p" -c "import torch.distributed.run" 2>/dev/null; then py=$p && break; fi
done
mpi=$(command -v mpirun || true)
slurm=
command -v srun >/dev/null && timeout 10 srun -n 1 true >/dev/null 2>&1 && slurm=srun
if [[ -z $py && -z $mpi && -z $slurm ]]; then
  echo "$suite: SKIPPED: no PyTorch torchrun, mpirun or Slurm cluster here - other launchers NOT tested"
  exit 77
fi
one w1 6 --config_name gpt2.json
many launch_w2 2 3 --config_name gpt2.json
tested=()

# --redirects/--tee: Debian's torch 1.13 torchrun fails under Python 3.11 without them (its Std flag parsing).
torchrun() {  # NAME ARGS... (torchrun's flags, then `--`, then the trainer's)
  local name=$1; shift
  local -a launch=()
  while [[ $1 != -- ]]; do launch+=("$1"); shift; done
  shift
  "$py" -m torch.distributed.run --nproc_per_node 2 --redirects 1 --tee 1 "${launch[@]}" --no_python \
    "$trainer" train "${common[@]}" --per_device_train_batch_size 3 --output_dir "$name" "$@" >"$name.log" 2>&1 ||
    { tail -20 "$name.log"; fail "torchrun $name (torch $torch_version)"; }
}
if [[ -n $py ]]; then
  torch_version=$("$py" -c "import torch; print(torch.__version__)")
  next_port
  torchrun static_w2 --master_addr 127.0.0.1 --master_port "$port" -- --config_name gpt2.json
  grep -q "x 2 processes (DDP over gloo" static_w2.log || fail "torchrun's run did not train on 2 processes"
  grep -q "rendezvous through torchrun's store at 127.0.0.1:$port" static_w2.log ||
    fail "the ranks did not meet in the agent's store"
  compare w1 static_w2 1e-5
  compare launch_w2 static_w2 0
  torchrun standalone_w2 --standalone -- --config_name gpt2.json
  compare w1 standalone_w2 1e-5
  tested+=("torchrun (torch $torch_version)")
else
  echo "$suite: SKIPPED PART: no PyTorch (torch.distributed.run) here - real torchrun NOT tested"
fi

if [[ -n $mpi ]]; then
  next_port
  root=()
  [[ $(id -u) == 0 ]] && root=(--allow-run-as-root)
  "$mpi" "${root[@]}" --oversubscribe -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" -x OMP_NUM_THREADS=1 \
    "$trainer" train "${common[@]}" --config_name gpt2.json --per_device_train_batch_size 3 --output_dir mpi_w2 \
    >mpi_w2.log 2>&1 || { tail -20 mpi_w2.log; fail "mpirun"; }
  grep -q "x 2 processes (DDP over gloo" mpi_w2.log || fail "mpirun's run did not train on 2 processes"
  compare w1 mpi_w2 1e-5
  compare launch_w2 mpi_w2 0
  tested+=("mpirun ($("$mpi" --version 2>/dev/null | head -n 1))")
else
  echo "$suite: SKIPPED PART: no mpirun here - Open MPI NOT tested"
fi
if [[ -n $slurm ]]; then
  next_port
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 timeout 300 srun -n 2 --export=ALL "$trainer" train \
    "${common[@]}" --config_name gpt2.json --per_device_train_batch_size 3 --output_dir srun_w2 >srun_w2.log 2>&1 ||
    { tail -20 srun_w2.log; fail "srun"; }
  grep -q "x 2 processes (DDP over gloo" srun_w2.log || fail "srun's run did not train on 2 processes"
  compare w1 srun_w2 1e-5
  compare launch_w2 srun_w2 0
  tested+=("srun ($(srun --version 2>/dev/null))")
else
  echo "$suite: SKIPPED PART: no Slurm cluster answers srun here - srun NOT tested"
fi
echo "$suite: OK: $(IFS=,; echo "${tested[*]}")"
