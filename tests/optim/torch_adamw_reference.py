#!/usr/bin/python3
"""Runs several steps of torch.optim.AdamW (or torch.optim.Adam) for torch_adamw_test.cpp.

Usage: torch_adamw_reference.py DIR [DIR...]   (one case per directory: importing torch is slow)

DIR/config.json: n, steps, lr, beta1, beta2, eps, weight_decay, decoupled (AdamW vs Adam),
grad_dtype ("fp32" | "bf16" | "fp16"), grad_scales (one per step), foreach.
DIR/p0.bin: n fp32 initial weights. DIR/grad<k>.bin: the stored gradients of step k (k from 1), in
grad_dtype. Each step's gradient is converted to fp32 and multiplied by that step's grad_scale in
fp32 - what Strata folds into its update - then handed to torch as p.grad.
Writes DIR/p.bin, DIR/m.bin, DIR/v.bin (fp32) and DIR/p_bf16.bin, DIR/p_fp16.bin (torch's own
conversions of the final weights).
"""
import json
import os
import sys

import torch


def load(path, dtype, n):
    raw_dtype = torch.int16 if dtype in (torch.bfloat16, torch.float16) else dtype
    t = torch.from_file(path, shared=False, size=n, dtype=raw_dtype)
    return t.view(dtype) if raw_dtype != dtype else t


def save(path, tensor):
    with open(path, "wb") as f:
        f.write(tensor.contiguous().view(torch.int16 if tensor.element_size() == 2 else tensor.dtype)
                .numpy().tobytes())


def run_case(root):
    with open(os.path.join(root, "config.json")) as f:
        cfg = json.load(f)
    n = cfg["n"]
    grad_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg["grad_dtype"]]
    p = torch.nn.Parameter(load(os.path.join(root, "p0.bin"), torch.float32, n).clone())
    kind = torch.optim.AdamW if cfg["decoupled"] else torch.optim.Adam
    opt = kind([p], lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
               weight_decay=cfg["weight_decay"], foreach=cfg["foreach"])
    for k in range(1, cfg["steps"] + 1):
        g = load(os.path.join(root, "grad%d.bin" % k), grad_dtype, n).float()
        g.mul_(torch.tensor(cfg["grad_scales"][k - 1], dtype=torch.float32))
        p.grad = g
        opt.step()

    state = opt.state[p]
    with torch.no_grad():
        save(os.path.join(root, "p.bin"), p.detach())
        save(os.path.join(root, "m.bin"), state["exp_avg"])
        save(os.path.join(root, "v.bin"), state["exp_avg_sq"])
        save(os.path.join(root, "p_bf16.bin"), p.detach().to(torch.bfloat16))
        save(os.path.join(root, "p_fp16.bin"), p.detach().to(torch.float16))


def main():
    torch.set_num_threads(1)
    for root in sys.argv[1:]:
        run_case(root)


if __name__ == "__main__":
    main()
