#!/usr/bin/env python3
"""LoRA / QLoRA with the frozen base streamed from NVMe, and activation offload, on the CPU
(issue 22; docs/results.md, "LoRA and QLoRA").

    # LoRA on a scaled llama-2-7b (its shapes at hidden 1024, 8 layers), the base streamed:
    # NVMe bytes per step against the adapters' state, step time against max(reading the base
    # twice at the rate measured in the same run, the same step with the base in memory)
    /usr/bin/python3 bindings/python/examples/lora_offload.py lora --nvme /var/tmp
    /usr/bin/python3 bindings/python/examples/lora_offload.py lora --quantize nf4 --nvme /var/tmp
    # the adapters, their gradients and optimizer states at home in pinned memory (auto: when
    # they fit a quarter of the pinned budget)
    /usr/bin/python3 bindings/python/examples/lora_offload.py lora --trainable-home pinned \
        --pinned-mib 128 --nvme /var/tmp

    # The longest sequence whose training step stays within a host-memory budget (peak resident
    # set above the interpreter's and the model's), with and without activation offload; one
    # process per try, under a fixed glibc mmap threshold (MALLOC_MMAP_THRESHOLD_)
    /usr/bin/python3 bindings/python/examples/lora_offload.py longest-seq --budget-mib 1024 \
        --nvme /var/tmp

    # The bytes autograd saves per layer in one step, at --seq and twice it, against strata
    # plan's activation formula for the same shapes (docs/planner.md, "Activations measured")
    /usr/bin/python3 bindings/python/examples/lora_offload.py saved-bytes --method full \
        --dtype bf16 --hidden 256 --layers 3 --seq 256 --pinned-mib 256 --nvme /var/tmp

    # Activation offload to NVMe under a pinned budget smaller than a step's saved activations:
    # the bytes packed, shared and the runtime's activation bytes written and read back
    /usr/bin/python3 bindings/python/examples/lora_offload.py spill --preset tinyllama-1.1b \
        --hidden 128 --layers 3 --batch 4 --seq 128 --steps 2 --pinned-mib 12 --nvme /var/tmp

    # Activation offload's cost in step time: the same step timed without and with it
    # (alternating), and the bytes it packed; the extra time over the bytes is the rate its
    # copies ran at, against the plan's (--copy-gbps: strata bench copy's one-way rates)
    /usr/bin/python3 bindings/python/examples/lora_offload.py copy-time --device cpu \
        --dtype bf16 --hidden 256 --layers 4 --seq 512 --pinned-mib 1024 --nvme /var/tmp

Each line printed is one JSON object.
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
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def model_config(args):
    from tiny_llama import PRESETS

    return PRESETS[getattr(args, "preset", "llama-2-7b")].scaled(
        args.hidden, args.layers, vocab_size=256, max_positions=max(args.seq, 64))


def build(args, method="lora"):
    import torch

    from strata.torch import lora
    from tiny_llama import Llama

    torch.manual_seed(0)
    model = Llama(model_config(args))
    if method == "full":
        return model
    return lora.apply(model, rank=args.rank, alpha=2 * args.rank, targets=TARGETS)


def nbytes(params):
    return sum(p.numel() * p.element_size() for p in params)


def lora_step_figures(args):
    """One JSON line: the streamed run's per-step NVMe bytes and time against its yardsticks,
    measured in the same process, step by step alternately (the machine is shared and noisy):
    the same LoRA step with the base in memory (plain torch: "compute"), and reading the base
    twice at the read rate Strata measured on this drive in this run."""
    import torch

    import strata.torch as st
    from strata.torch import lora
    from tiny_llama import batches, corpus_bytes, loss_fn

    if args.threads:
        torch.set_num_threads(args.threads)
    data = batches(corpus_bytes(), args.steps, batch=args.batch, seq=args.seq, seed=1)
    plain = build(args)
    plain_opt = torch.optim.AdamW(lora.trainable(plain), lr=1e-3)
    model = build(args)
    base_params = [p for p in model.parameters() if not p.requires_grad]
    adapters = lora.trainable(model)
    with tempfile.TemporaryDirectory(dir=args.nvme) as d:
        handle = st.offload(model, nvme_path=d, device="cpu", quantize_frozen=args.quantize,
                            nvme_capacity_bytes=args.nvme_capacity_mib << 20,
                            pinned_budget_bytes=args.pinned_mib << 20,
                            trainable_home=None if args.trainable_home == "auto" else
                            args.trainable_home)
        trainable_home = (handle.trainable_home, handle.trainable_why)
        stored_base = sum(p._strata.tensor.nbytes for p in base_params)
        # The drive's read rate through Strata in this run: the base read once as stored, cold
        # (the pinned budget holds a fraction of it; the swap file is read with O_DIRECT).
        import numpy as np
        scratch = np.empty(max(p._strata.tensor.nbytes for p in base_params), dtype=np.uint8)
        start = time.perf_counter()
        before = handle.runtime.stats()["nvme_bytes_read"]
        for p in base_params:
            p._strata.tensor.read(scratch[:p._strata.tensor.nbytes])
        read_bytes = handle.runtime.stats()["nvme_bytes_read"] - before
        read_rate = read_bytes / (time.perf_counter() - start) if read_bytes else None
        opt = st.AdamW(adapters, lr=1e-3)
        steps = []
        for x, y in data:
            start = time.perf_counter()
            loss_fn(plain(x), y).backward()
            plain_opt.step()
            plain_opt.zero_grad()
            compute = time.perf_counter() - start
            s0 = handle.runtime.stats()
            start = time.perf_counter()
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            handle.runtime.sync()
            seconds = time.perf_counter() - start
            s1 = handle.runtime.stats()
            steps.append({
                "seconds": seconds, "compute": compute,
                "nvme_written": s1["nvme_bytes_written"] - s0["nvme_bytes_written"],
                "parameters_written": (s1["nvme_bytes_written_by_kind"]["parameter"] -
                                       s0["nvme_bytes_written_by_kind"]["parameter"]),
                "base_read": (s1["nvme_bytes_read_by_kind"]["parameter"] -
                              s0["nvme_bytes_read_by_kind"]["parameter"]),
            })
        handle.close()
    later = steps[1:]  # the first step records the schedule

    def median(values):
        values = sorted(values)
        return values[len(values) // 2]

    adapter_state = 5 * nbytes(adapters)  # fp32: weight, gradient, master, m, v
    read_twice = 2 * stored_base / read_rate if read_rate else 0.0
    ratios = [s["seconds"] / max(read_twice, s["compute"]) for s in later]
    print(json.dumps({
        "mode": "lora", "quantize": args.quantize, "hidden": args.hidden, "layers": args.layers,
        "seq": args.seq, "batch": args.batch, "pinned_mib": args.pinned_mib,
        "trainable_home": trainable_home[0], "trainable_home_why": trainable_home[1],
        "base_bytes_stored": stored_base, "base_bytes_fp32": nbytes(base_params),
        "adapter_param_bytes": nbytes(adapters), "adapter_state_bytes": adapter_state,
        "nvme_written_per_step_max": max(s["nvme_written"] for s in later),
        "written_over_adapter_state": max(s["nvme_written"] for s in later) / adapter_state,
        # every PARAMETER write is an adapter's: equal to the adapters' bytes, the base wrote 0
        "parameters_written_per_step_max": max(s["parameters_written"] for s in later),
        "base_read_per_step_min": min(s["base_read"] for s in later),
        "read_rate_bytes_per_s": read_rate,
        "step_seconds_median": median([s["seconds"] for s in later]),
        "compute_seconds_median": median([s["compute"] for s in later]),
        "read_base_twice_seconds": read_twice,
        "step_over_bound_median": median(ratios),
        "step_over_bound_range": [min(ratios), max(ratios)],
    }))


def peak_run(args):
    """One training step at args.seq in this process; prints its peak resident set above the
    interpreter's (after imports and building the model) as one JSON line."""
    import torch

    import strata.torch as st
    from strata.torch import lora
    from tiny_llama import loss_fn

    if args.threads:
        torch.set_num_threads(args.threads)
    model = build(args)
    # Random tokens: the example corpus is shorter than the longest sequences tried.
    torch.manual_seed(1)
    tokens = torch.randint(0, 256, (args.batch, args.seq + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    with tempfile.TemporaryDirectory(dir=args.nvme) as d:
        handle = st.offload(model, nvme_path=d, device="cpu",
                            activations="nvme" if args.offload_activations else None,
                            nvme_capacity_bytes=args.nvme_capacity_mib << 20,
                            pinned_budget_bytes=args.pinned_mib << 20)
        opt = st.AdamW(lora.trainable(model), lr=1e-3)
        with open("/proc/self/status") as f:
            base = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))
        # VmHWM is a high-water mark since exec: reset it (Linux >= 4.0, 5 in clear_refs).
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        loss_fn(model(x), y).backward()
        opt.step()
        with open("/proc/self/status") as f:
            peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
        handle.close()
    print(json.dumps({"seq": args.seq, "offload": bool(args.offload_activations),
                      "peak_above_base": peak - base}))


def saved_bytes_of_one_step(args, seq):
    """The bytes of every tensor autograd saves inside each layer in one training step at seq
    (activation offload with min_bytes=1 packs them all; a tensor saved twice counts once, as
    torch holds it once)."""
    import torch

    import strata.torch as st
    from tiny_llama import loss_fn

    model = build(argparse.Namespace(**dict(vars(args), seq=seq)), args.method)
    model.to(getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[args.dtype]))
    torch.manual_seed(1)
    tokens = torch.randint(0, 256, (args.batch, seq + 1))
    per_layer = []
    with tempfile.TemporaryDirectory(dir=args.nvme) as d:
        handle = st.offload(model, nvme_path=d, device="cpu",
                            nvme_capacity_bytes=args.nvme_capacity_mib << 20,
                            pinned_budget_bytes=args.pinned_mib << 20)
        acts = handle.offload_activations("pinned", min_bytes=1)
        for layer in model.layers:
            layer.register_forward_pre_hook(lambda m, i: per_layer.append(acts.packed_bytes))
            layer.register_forward_hook(
                lambda m, i, o: per_layer.append(acts.packed_bytes - per_layer.pop()))
        loss_fn(model(tokens[:, :-1]), tokens[:, 1:]).backward()
        handle.close()
    return per_layer


def planned_activation_bytes(args, seq):
    """strata plan's activations for the same model and step: --dtype, eager attention, no
    checkpointing, everything on the GPU (its "activations" line of GPU memory)."""
    from dataclasses import asdict

    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        config = asdict(model_config(args))
        config["model_type"] = "mixtral" if config["num_local_experts"] > 1 else "llama"
        json.dump(config, f)
        f.flush()
        out = subprocess.run([args.strata, "plan", "--model", f.name, "--method", args.method,
                              "--lora-rank", str(args.rank), "--precision", args.dtype, "--seq",
                              str(seq), "--batch", str(args.batch), "--checkpointing", "none",
                              "--attention", "eager", "--offload", "none", "--gpu", "h100-sxm",
                              "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["gpu_memory"]["activations"]


def saved_bytes(args):
    """One JSON line: per layer, the bytes saved at --seq and at twice it, measured and planned,
    and each split into the bytes that grow with s (per s*b*h, in 16-bit units as the formula
    counts them) and those that grow with s^2 (per heads*s^2*b, the attention scores)."""
    import torch

    config = model_config(args)
    heads = config.num_attention_heads
    # The planner counts torch 2.x's saves. torch 1.13's mean(dim) also keeps its input (the
    # norm's squared fp32 input: generated MeanBackward1 has self_), 4 bytes a token and hidden
    # unit in each of a layer's two norms: counted here when this torch does it.
    probe = torch.ones(2, 2, requires_grad=True).pow(2).mean(-1, keepdim=True)
    mean_keeps_input = hasattr(probe.grad_fn, "_saved_self")
    rows, fits = [], {}
    for seq in (args.seq, 2 * args.seq):
        measured = saved_bytes_of_one_step(args, seq)
        planned = planned_activation_bytes(args, seq) / args.layers
        torch_extra = 2 * 4 * seq * args.batch * args.hidden if mean_keeps_input else 0
        # The last layer: the first one's input does not need a gradient under adapters (the
        # embedding is frozen), so its first norm keeps nothing.
        rows.append({"seq": seq, "measured_per_layer": measured[-1],
                     "planned_per_layer": planned, "planned_over_measured":
                     round(planned / measured[-1], 4), "this_torch_extra_per_layer": torch_extra,
                     "planned_with_this_torch_minus_measured": planned + torch_extra - measured[-1],
                     "later_layers_equal": len(set(measured[1:])) <= 1})
    for key in ("measured_per_layer", "planned_per_layer"):
        # bytes(s) = (c1 * s*b*h + c2 * heads*s^2*b) * x, c1 and c2 in 16-bit units (Korthikanti's
        # 34 and 5): x = 2 at fp32, whose every tensor is twice its 16-bit size, 1 at bf16
        s1, s2 = rows[0]["seq"], rows[1]["seq"]
        y1, y2 = rows[0][key], rows[1][key]
        b, h = args.batch, args.hidden
        x = 2 if args.dtype == "fp32" else 1
        c2 = (y2 - 2 * y1) / (x * heads * b * (s2 * s2 - 2 * s1 * s1))
        c1 = (y1 - c2 * x * heads * s1 * s1 * b) / (x * s1 * b * h)
        fits[key.split("_")[0]] = {"per_sbh": round(c1, 2), "per_scores": round(c2, 2)}
    print(json.dumps({"mode": "saved-bytes", "torch": torch.__version__, "method": args.method,
                      "preset": args.preset, "dtype": args.dtype, "hidden": args.hidden,
                      "kv_heads": config.num_key_value_heads,
                      "heads": heads, "intermediate": config.intermediate_size,
                      "layers": args.layers, "batch": args.batch, "rows": rows,
                      "coefficients_16bit": fits}))


def copy_time(args):
    """One JSON line: a full fine-tuning forward and backward of the example model (--dtype, on
    --device, no checkpointing, no optimizer) timed without and with activation offload to
    pinned memory, alternating step by step after one warm-up of each; the medians, the bytes
    packed a step, and the extra time's rate: strata.torch copies a saved tensor out in forward
    and back in backward, blocking on the compute stream, so the plan adds packed / rate for
    each direction to compute's time (docs/planner.md, "Activation offload"). --copy-gbps (the
    two one-way rates of `strata bench copy`, D2H,H2D) gives the plan's extra time beside it."""
    import statistics

    import torch

    import strata.torch as st
    from tiny_llama import loss_fn

    device = torch.device(args.device)
    model = build(args, "full")
    model.to(getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[args.dtype]))
    torch.manual_seed(1)
    tokens = torch.randint(0, 256, (args.batch, args.seq + 1), device=device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    seconds = {False: [], True: []}
    packed = []
    with tempfile.TemporaryDirectory(dir=args.nvme) as d:
        handle = st.offload(model, nvme_path=d, device=args.device,
                            nvme_capacity_bytes=args.nvme_capacity_mib << 20,
                            pinned_budget_bytes=args.pinned_mib << 20)
        acts = handle.offload_activations("pinned")
        for k in range(2 * (args.steps + 1)):
            offloaded = k % 2 == 1
            handle.offload_activations("pinned" if offloaded else None)
            before = acts.packed_bytes
            synchronize()
            start = time.perf_counter()
            loss_fn(model(x), y).backward()
            synchronize()
            elapsed = time.perf_counter() - start
            handle.zero_grad()
            if k >= 2:
                seconds[offloaded].append(elapsed)
                if offloaded:
                    packed.append(acts.packed_bytes - before)
        handle.close()
    without, with_offload = statistics.median(seconds[False]), statistics.median(seconds[True])
    extra = with_offload - without
    per_step = max(packed) if packed else 0
    result = {"mode": "copy-time", "torch": torch.__version__, "device": str(device),
              "dtype": args.dtype, "hidden": args.hidden, "layers": args.layers, "seq": args.seq,
              "batch": args.batch, "steps_each": args.steps, "seconds_without": without,
              "seconds_with": with_offload, "packed_bytes_per_step": per_step,
              "packed_bytes_steps": sorted(set(packed)), "extra_seconds": extra,
              "extra_gbps_both_ways": 2 * per_step / extra / 1e9 if extra > 0 else None}
    if args.copy_gbps:
        d2h, h2d = (float(v) for v in args.copy_gbps.split(","))
        planned = per_step / (d2h * 1e9) + per_step / (h2d * 1e9)
        result.update({"copy_gbps_d2h_h2d": [d2h, h2d], "planned_extra_seconds": planned,
                       "extra_over_planned": extra / planned if planned > 0 else None})
    print(json.dumps(result))


def spill(args):
    """One JSON line: full fine-tuning with activation offload to NVMe under a pinned budget too
    small for one step's saved activations (--pinned-mib), --steps steps with strata.torch's
    AdamW; the bytes packed and shared by saves (handle.activations) and the runtime's NVMe bytes
    of kind activation_checkpoint written and read, which stay near each other: read <= written
    + shared (docs/scheduling.md, a hinted tensor the schedule does not name). --device: where
    the model computes; the median step time too."""
    import statistics

    import torch

    import strata.torch as st
    from tiny_llama import loss_fn

    device = torch.device(args.device)
    model = build(args, "full")
    torch.manual_seed(1)
    seconds = []
    with tempfile.TemporaryDirectory(dir=args.nvme) as d:
        handle = st.offload(model, nvme_path=d, device=args.device, activations="nvme",
                            nvme_capacity_bytes=args.nvme_capacity_mib << 20,
                            pinned_budget_bytes=args.pinned_mib << 20)
        opt = st.AdamW(model.parameters(), lr=1e-3)
        for _ in range(args.steps):
            tokens = torch.randint(0, 256, (args.batch, args.seq + 1), device=device)
            start = time.perf_counter()
            loss_fn(model(tokens[:, :-1]), tokens[:, 1:]).backward()
            opt.step()
            opt.zero_grad()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - start)
        stats = handle.runtime.stats()
        acts = handle.activations
        result = {"mode": "spill", "device": str(device), "preset": args.preset,
                  "hidden": args.hidden, "layers": args.layers, "batch": args.batch,
                  "seq": args.seq, "steps": args.steps, "pinned_mib": args.pinned_mib,
                  "step_seconds_median": statistics.median(seconds),
                  "packed_bytes": acts.packed_bytes, "shared_bytes": acts.shared_bytes,
                  "reused_bytes": acts.reused_bytes, "learned_hints": acts.learned_hints,
                  "peak_held_bytes": acts.peak_held_bytes,
                  "nvme_written_bytes": stats["nvme_bytes_written_by_kind"]["activation_checkpoint"],
                  "nvme_read_bytes": stats["nvme_bytes_read_by_kind"]["activation_checkpoint"]}
        handle.close()
    print(json.dumps(result))


def longest_seq(args):
    """Doubles the sequence from --seq until a step's peak passes the budget, without and with
    activation offload, each try in a fresh interpreter."""
    result = {"mode": "longest-seq", "budget_mib": args.budget_mib, "hidden": args.hidden,
              "layers": args.layers, "batch": args.batch, "pinned_mib": args.pinned_mib}
    for offload in (False, True):
        seq, longest, tries = args.seq, 0, []
        while seq <= args.max_seq:
            cmd = [sys.executable, os.path.abspath(__file__), "peak-run", "--seq", str(seq),
                   "--hidden", str(args.hidden), "--layers", str(args.layers),
                   "--batch", str(args.batch), "--pinned-mib", str(args.pinned_mib),
                   "--nvme", args.nvme, "--nvme-capacity-mib", str(args.nvme_capacity_mib),
                   "--threads", str(args.threads)]
            if offload:
                cmd.append("--offload-activations")
            # A fixed mmap threshold: glibc then returns a freed tensor's pages at once, so
            # the resident set follows the tensors alive (its default raises the threshold
            # after the first large free and keeps freed heap memory resident).
            env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode != 0:
                tries.append({"seq": seq, "error": out.stderr.strip().splitlines()[-1:]})
                break
            peak = json.loads(out.stdout.strip().splitlines()[-1])["peak_above_base"]
            tries.append({"seq": seq, "peak_mib": round(peak / 2**20, 1)})
            if peak > args.budget_mib << 20:
                break
            longest = seq
            seq *= 2
        key = "with_offload" if offload else "without_offload"
        result[key] = {"longest_seq": longest, "tries": tries}
    without = result["without_offload"]["longest_seq"]
    result["ratio"] = result["with_offload"]["longest_seq"] / without if without else None
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("lora", "longest-seq", "peak-run", "saved-bytes",
                                         "copy-time", "spill"))
    parser.add_argument("--preset", choices=("llama-2-7b", "tinyllama-1.1b", "mixtral-8x7b"),
                        default="llama-2-7b", help="the shapes scaled to --hidden (tinyllama: "
                        "grouped-query attention; mixtral: 8 experts, 2 a token)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="saved-bytes: the model's and the plan's precision")
    parser.add_argument("--method", choices=("full", "lora"), default="lora",
                        help="saved-bytes: the model fine-tuned in full or through adapters")
    parser.add_argument("--strata", default=os.path.join(HERE, "..", "..", "..", "build", "bin",
                                                         "strata"),
                        help="saved-bytes: the strata binary whose plan is compared")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--quantize", choices=("nf4",), default=None)
    parser.add_argument("--pinned-mib", type=int, default=64)
    parser.add_argument("--trainable-home", choices=("auto", "nvme", "pinned"), default="auto")
    parser.add_argument("--nvme", default=tempfile.gettempdir())
    parser.add_argument("--nvme-capacity-mib", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--budget-mib", type=int, default=1024)
    parser.add_argument("--max-seq", type=int, default=65536)
    parser.add_argument("--offload-activations", action="store_true")
    parser.add_argument("--device", default="cpu",
                        help="copy-time, spill: where the model computes")
    parser.add_argument("--copy-gbps", default=None,
                        help="copy-time: the plan's one-way copy rates D2H,H2D in GB/s")
    args = parser.parse_args()
    {"lora": lora_step_figures, "longest-seq": longest_seq, "peak-run": peak_run,
     "saved-bytes": saved_bytes, "copy-time": copy_time, "spill": spill}[args.mode](args)


if __name__ == "__main__":
    main()
