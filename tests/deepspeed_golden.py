# The numbers of tests/test_deepspeed.cpp: DeepSpeed's own lr_schedules.py and fp16/loss_scaler.py, run with
# a stubbed logger and comm (they need nothing else of DeepSpeed) on Debian's torch.
# Usage: python3 tests/deepspeed_golden.py DEEPSPEED_SOURCE_DIR   (a checkout of microsoft/DeepSpeed)
import logging, sys, types

import torch

root = sys.argv[1]
ds, utils, comm = (types.ModuleType(n) for n in ("deepspeed", "deepspeed.utils", "deepspeed.comm"))
utils.logger, comm.get_rank = logging.getLogger("deepspeed"), lambda: 0
ds.utils, ds.comm = utils, comm
sys.modules.update({"deepspeed": ds, "deepspeed.utils": utils, "deepspeed.comm": comm})
schedules, scalers = {}, {}
exec(open(f"{root}/deepspeed/runtime/lr_schedules.py").read(), schedules)
exec(open(f"{root}/deepspeed/runtime/fp16/loss_scaler.py").read(), scalers)


def rates(cls, kw, steps):  # the lr each optimizer step runs at: the engine steps the scheduler after it
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    s, out = cls(opt, **kw), []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        s.step()
    return out


for name, kw, n in [
    ("WarmupLR", dict(warmup_min_lr=0.0, warmup_max_lr=1e-3, warmup_num_steps=5), 9),
    ("WarmupLR", dict(warmup_min_lr=1e-5, warmup_max_lr=1e-3, warmup_num_steps=4, warmup_type="linear"), 7),
    ("WarmupDecayLR", dict(total_num_steps=10, warmup_min_lr=0.0, warmup_max_lr=1e-3, warmup_num_steps=3), 12),
    ("WarmupDecayLR", dict(total_num_steps=6, warmup_min_lr=0.0, warmup_max_lr=1e-3, warmup_num_steps=0), 7),
    ("WarmupCosineLR", dict(total_num_steps=10, warmup_num_steps=3), 11),
    ("WarmupCosineLR", dict(total_num_steps=8, warmup_num_steps=4, warmup_min_ratio=0.1, cos_min_ratio=0.2,
                            warmup_type="linear"), 9),
]:
    print(name, kw, [repr(x) for x in rates(schedules[name], kw, n)])
for kw, overflows in [
    (dict(init_scale=2**16, scale_window=3, delayed_shift=2, min_scale=1), [1, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0]),
    (dict(init_scale=2**16, scale_window=2, delayed_shift=3, consecutive_hysteresis=True, min_scale=1),
     [1, 0, 1, 1, 1, 0, 0, 1, 1, 0]),
]:
    s, out = scalers["DynamicLossScaler"](**kw), []
    for o in overflows:
        s.update_scale(bool(o))
        out.append((s.cur_scale, s.cur_hysteresis))
    print(kw, overflows, out)
