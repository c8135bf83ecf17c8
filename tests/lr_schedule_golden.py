#!/usr/bin/env python3
# Golden values of tests/test_lr_schedule.cpp: HF's schedule lambdas (transformers/optimization.py), in Python.
import math
T,W,base=100,10,1e-3
def warm(s): return s/max(1,W)
def linear(s): return warm(s) if s<W else max(0.0,(T-s)/max(1,T-W))
def cosine(s,nc=0.5): 
    if s<W: return warm(s)
    p=(s-W)/max(1,T-W); return max(0.0,0.5*(1+math.cos(math.pi*nc*2*p)))
def restarts(s,nc=3):
    if s<W: return warm(s)
    p=(s-W)/max(1,T-W)
    if p>=1: return 0.0
    return max(0.0,0.5*(1+math.cos(math.pi*((nc*p)%1.0))))
def poly(s,lr_end=1e-5,power=2.0):
    if s<W: return warm(s)
    if s>T: return lr_end/base
    pct=1-(s-W)/(T-W); return ((base-lr_end)*pct**power+lr_end)/base
def cww(s): return warm(s) if s<W else 1.0
def isqrt(s):
    ts=W or 10000
    if s<W: return warm(s)
    return 1/math.sqrt((s+ts-W)/ts)
def cminlr(s,rate=0.1,nc=0.5):
    if s<W: return warm(s)
    p=(s-W)/max(1,T-W); f=0.5*(1+math.cos(math.pi*nc*2*p)); return max(0.0,f*(1-rate)+rate)
def cwminlr(s,rate=0.1,nc=0.5,wr=None):
    if s<W: return (s+1)/max(1.0,W) if wr is None else wr+(1-wr)*s/max(1,W-1)
    p=(s-W+1)/max(1.0,T-W); f=0.5*(1+math.cos(math.pi*nc*2*p)); return max(0.0,f*(1-rate)+rate)
def wsd(s,D=30,S=None,wt='linear',dt='cosine',mr=0.05,nc=0.5):
    if S is None: S=T-W-D
    def sh(c,p,up):
        if c=='linear': f=p if up else 1-p
        elif c=='cosine': f=0.5*(1-math.cos(math.pi*p)) if up else 0.5*(1+math.cos(math.pi*nc*2*p))
        else: f=1-math.sqrt(1-p) if up else 1-math.sqrt(p)
        return max(0.0,f*(1-mr)+mr)
    if s<W: return sh(wt,s/max(1,W),True)
    if s<W+S: return 1.0
    if s<W+S+D: return sh(dt,(s-W-S)/max(1,D),False)
    return mr
rows=[('linear','',linear),('cosine','{"num_cycles": 0.5}',cosine),('cosine_with_restarts','{"num_cycles": 3}',restarts),
('polynomial','{"lr_end": 1e-5, "power": 2.0}',poly),('constant_with_warmup','',cww),('inverse_sqrt','',isqrt),
('cosine_with_min_lr','{"min_lr": 1e-4}',cminlr),('cosine_warmup_with_min_lr','{"min_lr_rate": 0.1}',cwminlr),
('cosine_warmup_with_min_lr','{"min_lr_rate": 0.1, "warmup_lr_rate": 0.2}',lambda s: cwminlr(s,wr=0.2)),
('warmup_stable_decay','{"num_decay_steps": 30, "min_lr_ratio": 0.05}',wsd),
('warmup_stable_decay','{"num_decay_steps": 30, "num_stable_steps": 40, "warmup_type": "cosine", "decay_type": "1-sqrt", "min_lr_ratio": 0.05}',lambda s: wsd(s,S=40,wt='cosine',dt='1-sqrt')),
('warmup_stable_decay','{"num_decay_steps": 20, "decay_type": "linear"}',lambda s: wsd(s,D=20,dt='linear',mr=0.0))]
steps=[0,3,9,10,11,37,64,79,99,100,120]
for name,kw,f in rows:
    vals=', '.join(repr(base*f(s)) for s in steps)
    kwc=kw.replace('"','\\"')
    print(f'      {{"{name}", "{kwc}", {{{vals}}}}},')
