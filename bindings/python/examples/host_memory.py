#!/usr/bin/env python3
"""Peak host memory and step time of fine-tuning on the CPU: plain PyTorch (torch.optim.AdamW)
beside Strata's quick start (strata.torch.offload(model, nvme_path=...) with its budgets sized
from the model, and strata.torch.AdamW), on the same Llama-architecture model, weights and data.

Each side runs in a fresh interpreter, so that its peak resident set (ru_maxrss, VmHWM) is its
own; the line printed per side gives the parameters, the model states (16 bytes per parameter:
weights, gradients, two fp32 Adam moments), the resident set after importing torch and strata
("base"), the peak, the mean time of the steps after the first, and the losses.

    # the quick start against plain PyTorch, a 123M-parameter model
    /usr/bin/python3 bindings/python/examples/host_memory.py --hidden 768 --layers 12 \
        --steps 4 --nvme /var/tmp --nvme-capacity-gib 6
    # tinyllama-1.1b itself, Strata only (17.6 GB of model states, 8x the RAM it may use),
    # then plain PyTorch at the largest hidden size (22 layers) under the same 2.2 GB
    /usr/bin/python3 bindings/python/examples/host_memory.py --side strata --steps 3 \
        --nvme /var/tmp --nvme-capacity-gib 26
    /usr/bin/python3 bindings/python/examples/host_memory.py --side torch --steps 3 \
        --hidden 1024 --fit-rss-mib 2098

The model is built on the meta device for Strata (offload initialises it one module at a time,
param_init_fn=init_weights: it is never whole in host RAM) and materialised in the same module
order for plain PyTorch, so both start from the same weights.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_side(args):
    """One side in this process; prints one JSON line."""
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, ".."))
    import torch

    import strata.torch as st
    from tiny_llama import PRESETS, Llama, batches, corpus_bytes, init_weights, loss_fn

    if args.threads:
        torch.set_num_threads(args.threads)
    base = current_rss()
    preset = PRESETS[args.preset]
    config = preset if args.hidden is None else preset.scaled(
        args.hidden, args.layers if args.layers is not None else preset.num_hidden_layers,
        vocab_size=preset.vocab_size)
    if args.hidden is None and args.layers is not None:
        config = preset.scaled(preset.hidden_size, args.layers, vocab_size=preset.vocab_size)
    torch.manual_seed(args.seed)
    model = Llama(config, device="meta")
    n_params = sum(p.numel() for p in model.parameters())
    data = batches(corpus_bytes(), args.steps, args.batch, args.seq, seed=args.seed)
    data = [(x % config.vocab_size, y % config.vocab_size) for x, y in data]
    info = {}
    if args.side == "torch":
        buffers = {n: b.clone() for n, b in model.named_buffers()}  # real, unlike the weights
        model = model.to_empty(device="cpu")
        for name, value in buffers.items():
            module_name, _, key = name.rpartition(".")
            model.get_submodule(module_name)._buffers[key] = value
        for m in model.modules():  # the order strata.torch.offload initialises them in
            init_weights(m)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
        handle = None
    else:
        kw = {}
        if args.nvme_capacity_gib:
            kw["nvme_capacity_bytes"] = int(args.nvme_capacity_gib * (1 << 30))
        handle = st.offload(model, nvme_path=args.nvme, device="cpu",
                            param_init_fn=init_weights, **kw)
        optimizer = st.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
        info["budgets"] = {k: v[0] for k, v in (handle.budgets or {}).items()}
    losses, times = [], []
    for x, y in data:
        start = time.perf_counter()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
        print(f"# {args.side} step {len(losses)}: loss {losses[-1]:.6f} {times[-1]:.2f} s "
              f"peak RSS {peak_rss() / 2**20:.0f} MiB", file=sys.stderr, flush=True)
    if handle is not None:
        stats = handle.stats()
        info["nvme_read_bytes"] = stats["nvme_bytes_read"]
        info["nvme_written_bytes"] = stats["nvme_bytes_written"]
        info["pinned_peak_bytes"] = stats["pinned"]["peak_in_use_bytes"]
        handle.close(restore=False)
    later = times[1:] or times
    print(json.dumps(dict(side=args.side, params=n_params, states_bytes=16 * n_params,
                          hidden=config.hidden_size, layers=config.num_hidden_layers,
                          vocab=config.vocab_size, batch=args.batch, seq=args.seq,
                          base_rss=base, peak_rss=peak_rss(), step_seconds=times,
                          mean_step_seconds=sum(later) / len(later), losses=losses, **info)),
          flush=True)


def child(args, side, **changes):
    argv = [sys.executable, os.path.abspath(__file__), "--side", side, "--child"]
    values = dict(vars(args), **changes)
    for key in ("preset", "hidden", "layers", "steps", "batch", "seq", "lr", "seed", "nvme",
                "nvme_capacity_gib", "threads"):
        if values[key] is not None:
            argv += [f"--{key.replace('_', '-')}", str(values[key])]
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def describe(r):
    mib = 2 ** 20
    return (f"{r['side']:6s} {r['params'] / 1e6:8.1f} M params (hidden {r['hidden']}, "
            f"{r['layers']} layers), states {r['states_bytes'] / 1e9:6.2f} GB: peak RSS "
            f"{r['peak_rss'] / mib:7.0f} MiB (base {r['base_rss'] / mib:.0f} MiB; "
            f"{r['peak_rss'] / r['params']:.1f} B/param), step {r['mean_step_seconds']:.2f} s, "
            f"losses {' '.join(f'{v:.5f}' for v in r['losses'])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--side", choices=("torch", "strata", "both"), default="both")
    ap.add_argument("--preset", default="tinyllama-1.1b")
    ap.add_argument("--hidden", type=int, default=None, help="scaled hidden size (default: "
                                                             "the preset's)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--nvme", default=tempfile.gettempdir(), help="Strata's swap file directory")
    ap.add_argument("--nvme-capacity-gib", type=float, default=None,
                    help="swap file size (default: Strata's, half the free space)")
    ap.add_argument("--fit-rss-mib", type=float, default=None,
                    help="torch side: the largest hidden size (multiples of 64, the preset's "
                         "layers and vocabulary) whose peak RSS stays under this")
    ap.add_argument("--json", help="append each side's result to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_side(args)
        return
    results = []
    if args.fit_rss_mib is not None:
        lo, hi, best = 1, (args.hidden or 2048) // 64, None
        while lo <= hi:  # peak RSS grows with the hidden size
            mid = (lo + hi) // 2
            r = child(args, "torch", hidden=mid * 64)
            ok = r is not None and r["peak_rss"] <= args.fit_rss_mib * 2 ** 20
            print(f"# hidden {mid * 64}: " + (describe(r) if r else "failed"), flush=True)
            if ok:
                best, lo = r, mid + 1
            else:
                hi = mid - 1
        if best is not None:
            results.append(best)
    else:
        for side in (("torch", "strata") if args.side == "both" else (args.side,)):
            r = child(args, side)
            if r is None:
                sys.exit(f"the {side} side failed")
            results.append(r)
    for r in results:
        print(describe(r), flush=True)
    if len(results) == 2 and results[0]["params"] == results[1]["params"]:
        t, s = results
        print(f"strata / torch: peak RSS {s['peak_rss'] / t['peak_rss']:.3f}, above the base "
              f"{(s['peak_rss'] - s['base_rss']) / (t['peak_rss'] - t['base_rss']):.3f}; step "
              f"time {s['mean_step_seconds'] / t['mean_step_seconds']:.2f}x; largest loss "
              f"difference {max(abs(a - b) / abs(b) for a, b in zip(s['losses'], t['losses'])):.2e}"
              " (relative)")
    if args.json:
        with open(args.json, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
