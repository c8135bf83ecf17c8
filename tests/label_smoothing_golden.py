#!/usr/bin/env python3
# Golden values of test_ops.cpp's CrossEntropyGolden: torch.nn.functional.cross_entropy with label_smoothing
# (reduction 'none', ignore_index -100) and its gradient for per-row weights, on logits given by a formula.
# Run with Debian's python3-torch (1.13): python3 tests/label_smoothing_golden.py
import math
import torch
import torch.nn.functional as F

R, V = 5, 11
labels = [3, -100, 0, 10, 7]
weights = [0.5, 1.0, 2.0, -1.0, 3.0]
x = torch.tensor([[3.0 * math.sin(7 * r + 3 * i) for i in range(V)] for r in range(R)], dtype=torch.float64,
                 requires_grad=True)
for e in (0.1, 0.3):
    loss = F.cross_entropy(x, torch.tensor(labels), ignore_index=-100, label_smoothing=e, reduction="none")
    x.grad = None
    (loss * torch.tensor(weights, dtype=torch.float64)).sum().backward()
    print(f"// torch {torch.__version__}, label_smoothing {e}")
    print("{" + ", ".join(f"{v:.17g}" for v in loss.tolist()) + "},")
    print("{" + ", ".join(f"{v:.17g}" for v in x.grad.flatten().tolist()) + "},")
