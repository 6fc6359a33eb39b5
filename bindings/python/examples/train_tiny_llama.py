#!/usr/bin/env python3
"""Trains a scaled-down Llama (tinyllama-1.1b's architecture, random initialisation) on the
byte-level text of examples/corpus.txt with Strata's offload: parameters, gradients and AdamW
states live in Strata (NVMe swap file, pinned staging, device tier), the model's forward and
backward fetch each layer just in time. Prints the loss per step and peak host memory.

    /usr/bin/python3 bindings/python/examples/train_tiny_llama.py --nvme /tmp --steps 20

On a machine without a GPU, Strata's host-emulated device stands in for one (the "device" tier
is host memory), and peak host memory is reported without it, as a GPU run would see it.
"""
import argparse
import os
import resource
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import strata  # noqa: E402
import strata.torch as st  # noqa: E402
from tiny_llama import PRESETS, Llama, batches, corpus_bytes, loss_fn  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvme", default=tempfile.gettempdir(),
                    help="directory for Strata's swap file (default: %(default)s)")
    ap.add_argument("--preset", default="tinyllama-1.1b", choices=sorted(PRESETS))
    ap.add_argument("--hidden", type=int, default=128, help="scaled hidden size")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pinned-mib", type=int, default=8,
                    help="Strata's pinned budget; below the model states, so NVMe is used")
    ap.add_argument("--device-mib", type=int, default=8, help="Strata's device budget")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    config = PRESETS[args.preset].scaled(args.hidden, args.layers, vocab_size=256,
                                         max_positions=args.seq)
    model = Llama(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"strata {strata.version()} ({strata.library_path}); torch {torch.__version__}")
    print(f"model: {args.preset} scaled to hidden {config.hidden_size}, {config.num_hidden_layers}"
          f" layers, {config.num_attention_heads} heads ({config.num_key_value_heads} KV), "
          f"{n_params / 1e6:.2f} M parameters")

    offloaded = st.offload(model, nvme_path=args.nvme, device=args.device,
                           nvme_capacity_bytes=max(256 << 20, 64 * n_params),
                           pinned_budget_bytes=args.pinned_mib << 20,
                           device_budget_bytes=args.device_mib << 20)
    device = offloaded.device
    optimizer = st.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    data = batches(corpus_bytes(), args.steps, args.batch, args.seq, seed=args.seed)

    for step, (x, y) in enumerate(data):
        start = time.perf_counter()
        loss = loss_fn(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        stats = offloaded.stats()
        print(f"step {step:3d}  loss {loss.item():.4f}  lr {scheduler.get_last_lr()[0]:.2e}  "
              f"{(time.perf_counter() - start) * 1e3:6.1f} ms  "
              f"nvme read {stats['nvme_bytes_read'] / 2**20:7.1f} MiB  "
              f"written {stats['nvme_bytes_written'] / 2**20:7.1f} MiB", flush=True)

    stats = offloaded.stats()
    mib = 2 ** 20
    print(f"peak host memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB"
          f" (VmHWM; {stats['os_peak_host_bytes_excluding_emulated_device'] / mib:.1f} MiB "
          f"excluding the emulated device, as a GPU run would count it)")
    print(f"peak pinned in use {stats['pinned']['peak_in_use_bytes'] / mib:.1f} MiB, "
          f"peak device in use {stats['device']['peak_in_use_bytes'] / mib:.1f} MiB, "
          f"parameters + fp32 Adam states {n_params * 16 / mib:.1f} MiB")
    offloaded.close()


if __name__ == "__main__":
    main()
