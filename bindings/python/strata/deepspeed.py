"""DeepSpeed-style configs mapped onto Strata.

    mapped = strata.deepspeed.from_deepspeed({
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": "/mnt/nvme", "buffer_count": 5,
                              "buffer_size": 1e8},
            "offload_optimizer": {"device": "nvme", "nvme_path": "/mnt/nvme"},
        },
        "aio": {"block_size": 1048576, "queue_depth": 16},
    })
    mapped.config            # a strata.Config
    mapped.param_home        # "nvme", "pinned" or "device": where parameters rest
    mapped.optimizer         # AdamW keyword arguments from "optimizer" (may be empty)
    mapped.optimizer_options # max_grad_norm / sub_group_bytes for the Strata optimizer
    mapped.notes             # keys understood but without effect in Strata, and why

Every key is accounted for. A key DeepSpeed does not have, or that is misspelt, is an error; so
are contradictions (two NVMe paths, an NVMe device without a path, parameter offload below
stage 3) and settings Strata cannot honour (GPUDirect Storage, offload ratios). Keys that
configure what Strata leaves to the training loop or to torch.distributed (batch sizes,
communication buckets) are accepted and listed in `notes`, and warned about once, so nothing
is silently dropped. The table in docs/pytorch.md lists every mapping.
"""
import difflib
import math
import os
import warnings

from . import _lib
from .config import Config
from .errors import StrataError

_DEVICE_HOME = {"nvme": "nvme", "cpu": "pinned", "none": "device"}

# Keys DeepSpeed has that concern the training loop, the engine or torch.distributed: accepted,
# reported in notes.
_LOOP_KEYS = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "steps_per_print", "wall_clock_breakdown", "dump_state", "prescale_gradients",
    "gradient_predivide_factor", "sparse_gradients", "zero_allow_untested_optimizer",
    "scheduler", "communication_data_type", "flops_profiler", "tensorboard", "wandb",
    "csv_monitor", "comms_logger", "memory_breakdown", "activation_checkpointing",
    "checkpoint", "data_types", "seed", "elasticity", "autotuning",
    "zero_force_ds_cpu_optimizer", "compile", "dataloader_drop_last",
}
_ZERO_COMM_KEYS = {
    "contiguous_gradients", "overlap_comm", "reduce_bucket_size", "reduce_scatter",
    "allgather_partitions", "allgather_bucket_size", "round_robin_gradients",
    "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
    "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "elastic_checkpoint", "ignore_unused_parameters", "legacy_stage1", "load_from_fp32_weights",
    "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients",
    "memory_efficient_linear", "mics_shard_size",
    # The names DeepSpeed reads beside their stage3_ aliases (runtime/zero/config.py).
    "prefetch_bucket_size", "param_persistence_threshold", "max_live_parameters",
    "max_reuse_distance", "gather_16bit_weights_on_model_save",
    "stage3_model_persistence_threshold", "stage3_module_granularity_threshold",
    "use_multi_rank_bucket_allreduce", "zero_quantized_nontrainable_weights",
}
# DeepSpeed's deprecated spellings of the offload sections (runtime/zero/config.py turns
# cpu_offload into offload_optimizer {device: cpu}, cpu_offload_param into offload_param
# {device: cpu}, cpu_offload_use_pin_memory into their pin_memory).
_ZERO_DEPRECATED = {"cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory"}
_ZERO_KEYS = {"stage", "offload_param", "offload_optimizer", "sub_group_size"} | \
    _ZERO_COMM_KEYS | _ZERO_DEPRECATED
_PARAM_KEYS = {"device", "nvme_path", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu"}
_OPTIM_KEYS = {"device", "nvme_path", "pin_memory", "buffer_count", "fast_init", "ratio",
               "pipeline", "pipeline_read", "pipeline_write"}
_AIO_KEYS = {"block_size", "queue_depth", "thread_count", "intra_op_parallelism",
             "single_submit", "overlap_events", "use_gds"}
_TOP_KEYS = {"zero_optimization", "aio", "optimizer", "gradient_clipping", "fp16", "bf16",
             "bfloat16", "amp", "strata"} | _LOOP_KEYS
# DeepSpeed's own (runtime/precision_config.py: DeepSpeedFP16Config, DeepSpeedBF16Config, which
# refuse any other key).
_FP16_KEYS = {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
              "hysteresis", "consecutive_hysteresis", "min_loss_scale",
              "fp16_master_weights_and_grads"}
_BF16_KEYS = {"enabled", "immediate_grad_update", "check_grad_overflow"}
_ADAM_PARAMS = {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "bias_correction",
                "torch_adam", "amsgrad"}


class DeepSpeedConfigError(StrataError):
    """Every problem found in a DeepSpeed-style config, one per line (code STRATA_E_INVALID)."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__(_lib.E_INVALID, "DeepSpeed config: " + "; ".join(self.problems))


class Mapped:
    def __init__(self):
        self.config = Config()
        self.param_home = "nvme"
        self.optimizer = {}
        self.optimizer_options = {}
        self.param_dtype = None  # "float16" / "bfloat16" when fp16 / bf16 is enabled
        self.notes = []

    def __repr__(self):
        return (f"Mapped(config={self.config!r}, param_home={self.param_home!r}, "
                f"optimizer={self.optimizer!r}, optimizer_options={self.optimizer_options!r}, "
                f"param_dtype={self.param_dtype!r}, notes={self.notes!r})")


def _assign(out, field, value, source, problems):
    """out.config.field = value, where a value the field cannot hold (out of its C range) is one
    of the config's problems, reported with the others, not an exception of its own."""
    try:
        setattr(out.config, field, value)
    except StrataError as e:
        problems.append(f"{source}: {e.message}")


def _unknown(keys, known, where, problems):
    # A JSON file has only string keys; a dict built in Python may not (found by
    # tests/python/test_deepspeed_fuzz.py: sorting mixed keys raised TypeError).
    for key in keys:
        if not isinstance(key, str):
            problems.append(f"key {where}{key!r} is not a string")
    for key in sorted(k for k in set(keys) - known if isinstance(k, str)):
        near = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        problems.append(f"unknown key {where}{key!r}{hint}")


def _number(section, key, where, problems, minimum=0):
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum or \
            (isinstance(value, float) and not value.is_integer()):
        problems.append(f"{where}{key} must be an integer >= {minimum}, not {value!r}")
        return None
    return int(value)


def _flag(section, key, where, problems):
    value = section[key]
    if not isinstance(value, bool):
        problems.append(f"{where}{key} must be true or false, not {value!r}")
        return None
    return value


def _finite(value):
    """A real number (not a bool, inf or nan)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _path(section, where, paths, problems):
    value = section["nvme_path"]
    if isinstance(value, str) and value:
        paths[where + "nvme_path"] = os.path.normpath(value)  # "/a" and "/a/" are one directory
    else:
        problems.append(f"{where}nvme_path must be a directory name, not {value!r}")


def from_deepspeed(ds, warn=True, **strata_overrides):
    """Maps a DeepSpeed config dict; raises DeepSpeedConfigError listing every problem.

    strata_overrides are strata.Config fields applied last (they win over the mapping).
    """
    if not isinstance(ds, dict):
        raise DeepSpeedConfigError([f"expected a dict, not {type(ds).__name__}"])
    problems, out = [], Mapped()
    _unknown(ds, _TOP_KEYS, "", problems)
    for key in sorted(set(ds) & _LOOP_KEYS):
        out.notes.append(f"{key}: the training loop's (or torch's) business; Strata does not use it")

    zero = ds.get("zero_optimization", {})
    if not isinstance(zero, dict):
        problems.append("zero_optimization must be a dict")
        zero = {}
    _unknown(zero, _ZERO_KEYS, "zero_optimization.", problems)
    for key in sorted(set(zero) & _ZERO_COMM_KEYS):
        out.notes.append(f"zero_optimization.{key}: communication and partitioning are "
                         "torch.distributed's; Strata has no collectives")
    # DeepSpeed's default stage is 0 (DeepSpeedZeroConfig.stage): no parameter offload there.
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        problems.append(f"zero_optimization.stage {stage!r} is not 0-3")

    param = zero.get("offload_param")
    optim = zero.get("offload_optimizer")
    for key in sorted(set(zero) & _ZERO_DEPRECATED):
        if not isinstance(zero[key], bool):
            problems.append(f"zero_optimization.{key} must be true or false, not {zero[key]!r}")
    if zero.get("cpu_offload") is True:
        problems.append("zero_optimization.cpu_offload true is DeepSpeed's old spelling of "
                        "offload_optimizer {device: cpu}: Strata's optimizer keeps its states "
                        "on NVMe (offload_optimizer {device: nvme, nvme_path: ...})")
    if zero.get("cpu_offload_param") is True:
        if param is not None:
            problems.append("zero_optimization.cpu_offload_param and offload_param are both "
                            "given: one spelling of the parameters' offload")
        else:
            param = {"device": "cpu"}
            if isinstance(zero.get("cpu_offload_use_pin_memory"), bool):
                param["pin_memory"] = zero["cpu_offload_use_pin_memory"]
    elif zero.get("cpu_offload_use_pin_memory") is False:
        out.notes.append("zero_optimization.cpu_offload_use_pin_memory false: Strata always "
                         "stages through pinned buffers, sized exactly to each tensor")
    paths = {}
    elem_bytes = 4
    fp16 = ds.get("fp16", {})
    # DeepSpeed reads "bf16", else its older name "bfloat16" (precision_config.get_bfloat16_config).
    bf16_key = "bf16" if "bf16" in ds else "bfloat16"
    bf16 = ds.get(bf16_key, {})
    if "bf16" in ds and "bfloat16" in ds:
        out.notes.append("bfloat16: DeepSpeed's older name for bf16, which is given too and wins")
    precisions = (
        ("fp16", fp16, _FP16_KEYS, "float16", "loss scaling is the caller's; pass loss_scale to "
         "strata.torch.AdamW.step"),
        (bf16_key, bf16, _BF16_KEYS, "bfloat16", "DeepSpeed's bf16 optimizer settings; "
         "strata.torch.AdamW checks overflow itself (check_overflow)"))
    for name, section, keys, dtype, extra_note in precisions:
        if not isinstance(section, dict):
            problems.append(f"{name} must be a dict")
            continue
        _unknown(section, keys, f"{name}.", problems)
        enabled = section.get("enabled", False)
        if not isinstance(enabled, bool):
            problems.append(f"{name}.enabled {enabled!r} must be true or false (\"auto\" is the "
                            "Hugging Face Trainer's, which fills it in before DeepSpeed reads it)")
        elif enabled:
            out.param_dtype = dtype
            elem_bytes = 2
            extra = set(section) - {"enabled"}
            if extra:
                out.notes.append(f"{name}.{sorted(extra)}: {extra_note}")
            elif name == "fp16":
                # DeepSpeed's fp16 default is dynamic loss scaling (loss_scale 0,
                # runtime/precision_config.py): a note even where no key asks for it.
                out.notes.append("fp16.enabled: DeepSpeed scales the loss dynamically by "
                                 "default; here " + extra_note)
    if isinstance(fp16, dict) and isinstance(bf16, dict) and fp16.get("enabled") is True and \
            bf16.get("enabled") is True:
        problems.append("fp16.enabled and bf16.enabled are both true")

    pinned_budget = 0
    if param is None:
        # DeepSpeed without offload_param keeps the parameters on the GPU.
        out.param_home = "device"
        out.notes.append("no zero_optimization.offload_param: the parameters stay on the device, "
                         "as in DeepSpeed (offload_param.device nvme or cpu offloads them)")
    else:
        where = "zero_optimization.offload_param."
        if not isinstance(param, dict):
            problems.append("zero_optimization.offload_param must be a dict")
            param = {}
        _unknown(param, _PARAM_KEYS, where, problems)
        device = param.get("device", "none")
        if not isinstance(device, str) or device not in _DEVICE_HOME:
            problems.append(f"{where}device {device!r} is not 'nvme', 'cpu' or 'none'")
        else:
            out.param_home = _DEVICE_HOME[device]
        if device in ("nvme", "cpu") and stage is not None and stage != 3:
            problems.append(f"{where}device {device!r} needs zero_optimization.stage 3 "
                            f"(it is {stage}), as in DeepSpeed")
        if param.get("nvme_path") is not None:
            if device != "nvme":
                problems.append(f"{where}nvme_path is set but device is {device!r}")
            _path(param, where, paths, problems)
        elif device == "nvme":
            problems.append(f"{where}device is 'nvme' but nvme_path is missing")
        if "pin_memory" in param and _flag(param, "pin_memory", where, problems) is False:
            out.notes.append(f"{where}pin_memory false: Strata always stages through pinned "
                             "buffers, sized exactly to each tensor")
        count = _number(param, "buffer_count", where, problems, 1) if "buffer_count" in param \
            else None
        size = _number(param, "buffer_size", where, problems, 1) if "buffer_size" in param \
            else None
        if count is not None or size is not None:
            # DeepSpeed pins buffer_count buffers of buffer_size elements for parameters; Strata
            # takes the same bytes as a cap on its pinned arena and sizes buffers exactly in it.
            pinned_budget += (count or 5) * (size or 100_000_000) * elem_bytes
            _assign(out, "zero_param_buffer_elements", size or 0, where + "buffer_size", problems)
        if "max_in_cpu" in param:
            # DeepSpeed keeps up to max_in_cpu parameter elements in a CPU buffer instead of on
            # NVMe when offloading to NVMe (stage3.py:678-701, as runtime/model/deepspeed_config
            # models it); with device cpu every parameter is in CPU memory and it does nothing.
            limit = _number(param, "max_in_cpu", where, problems, 0)
            if device == "nvme" and limit is not None:
                pinned_budget += limit * elem_bytes
            elif limit is not None:
                out.notes.append(f"{where}max_in_cpu: only meaningful with device 'nvme'")

    if optim is not None:
        where = "zero_optimization.offload_optimizer."
        if not isinstance(optim, dict):
            problems.append("zero_optimization.offload_optimizer must be a dict")
            optim = {}
        _unknown(optim, _OPTIM_KEYS, where, problems)
        device = optim.get("device", "none")
        if device != "nvme":
            problems.append(f"{where}device {device!r}: Strata's optimizer keeps its states "
                            "(fp32 master, m, v) on NVMe; use 'nvme' (or omit offload_optimizer "
                            "and use torch.optim)")
        if optim.get("nvme_path") is not None:
            _path(optim, where, paths, problems)
        elif device == "nvme":
            problems.append(f"{where}device is 'nvme' but nvme_path is missing")
        if "pin_memory" in optim and _flag(optim, "pin_memory", where, problems) is False:
            out.notes.append(f"{where}pin_memory false: Strata always stages through pinned "
                             "buffers")
        if "ratio" in optim and optim["ratio"] != 1:
            problems.append(f"{where}ratio {optim['ratio']!r}: partial optimizer offload is not "
                            "supported (ratio must be 1)")
        if "fast_init" in optim:
            _flag(optim, "fast_init", where, problems)
            out.notes.append(f"{where}fast_init: Strata initialises states lazily anyway")
        for key in ("pipeline", "pipeline_read", "pipeline_write"):
            if key in optim and _flag(optim, key, where, problems) is False:
                out.notes.append(f"{where}{key} false: Strata always overlaps state reads, "
                                 "updates and write-backs")
        if "buffer_count" in optim:
            count = _number(optim, "buffer_count", where, problems, 1)
            sub = zero.get("sub_group_size", 1_000_000_000)
            if count is not None and _finite(sub):
                pinned_budget += count * int(sub) * 4

    if "sub_group_size" in zero:
        sub = _number(zero, "sub_group_size", "zero_optimization.", problems, 1)
        if sub is not None:
            out.optimizer_options["sub_group_bytes"] = sub * 4
            _assign(out, "zero_sub_group_elements", sub, "zero_optimization.sub_group_size",
                    problems)

    distinct = set(paths.values())
    if len(distinct) > 1:
        problems.append("offload_param.nvme_path and offload_optimizer.nvme_path differ "
                        f"({', '.join(f'{k}={v!r}' for k, v in paths.items())}): a Strata "
                        "runtime has one swap file")
    elif distinct:
        _assign(out, "nvme_path", distinct.pop(), "nvme_path", problems)
    if pinned_budget:
        _assign(out, "pinned_budget_bytes", pinned_budget, "the buffers' pinned bytes", problems)

    aio = ds.get("aio")
    if aio is not None:
        where = "aio."
        if not isinstance(aio, dict):
            problems.append("aio must be a dict")
            aio = {}
        _unknown(aio, _AIO_KEYS, where, problems)
        if "block_size" in aio:
            block = _number(aio, "block_size", where, problems, 4096)
            if block is not None and block % 4096:
                problems.append(f"aio.block_size {block} is not a multiple of 4096 (O_DIRECT)")
            elif block is not None:
                _assign(out, "block_size", block, "aio.block_size", problems)
        if "queue_depth" in aio:
            qd = _number(aio, "queue_depth", where, problems, 1)
            if qd is not None:
                _assign(out, "queue_depth", qd, "aio.queue_depth", problems)
        threads = {}
        for key in ("thread_count", "intra_op_parallelism"):
            if key in aio:
                n = _number(aio, key, where, problems, 1)
                if n is not None:
                    threads[key] = n
        if len(set(threads.values())) > 1:
            problems.append(f"aio.thread_count and aio.intra_op_parallelism differ ({threads})")
        elif threads:
            _assign(out, "worker_threads", next(iter(threads.values())), "aio threads", problems)
        if "single_submit" in aio and _flag(aio, "single_submit", where, problems):
            out.notes.append("aio.single_submit true: Strata's io_uring engine submits in "
                             "batches regardless")
        if "overlap_events" in aio and _flag(aio, "overlap_events", where, problems) is False:
            out.notes.append("aio.overlap_events false: Strata always overlaps submission and "
                             "completion")
        if "use_gds" in aio and _flag(aio, "use_gds", where, problems):
            problems.append("aio.use_gds true: GPUDirect Storage is not supported; Strata stages "
                            "through pinned host memory")

    opt = ds.get("optimizer")
    if opt is not None:
        if not isinstance(opt, dict):
            problems.append("optimizer must be a dict")
            opt = {}
        _unknown(opt, {"type", "params"}, "optimizer.", problems)
        kind = str(opt.get("type", "AdamW"))
        params = opt.get("params", {})
        if not isinstance(params, dict):
            problems.append("optimizer.params must be a dict")
            params = {}
        _unknown(params, _ADAM_PARAMS, "optimizer.params.", problems)
        if kind.lower() not in ("adam", "adamw", "cpuadam", "deepspeedcpuadam"):
            problems.append(f"optimizer.type {kind!r}: Strata's optimizer is Adam / AdamW")
        decoupled = kind.lower() == "adamw" or params.get("adam_w_mode", True)
        if kind.lower() == "adamw" and params.get("adam_w_mode") is False:
            problems.append("optimizer.type 'AdamW' with params.adam_w_mode false")
        correction = params.get("bias_correction", True)
        if not isinstance(correction, (bool, int)) or not correction:
            problems.append(f"optimizer.params.bias_correction {correction!r}: only true is "
                            "supported")
        if params.get("amsgrad", False):
            problems.append("optimizer.params.amsgrad is not supported")
        if "torch_adam" in params:
            out.notes.append("optimizer.params.torch_adam: Strata always runs its own CPU kernels")
        # DeepSpeed builds the optimizer from params alone, with its constructors' defaults:
        # DeepSpeedCPUAdam and FusedAdam take weight_decay=0 (deepspeed/ops/adam/cpu_adam.py,
        # fused_adam.py), not torch.optim.AdamW's 1e-2; lr, betas and eps default as torch's.
        out.optimizer["weight_decay"] = 0.0
        for key in ("lr", "eps", "weight_decay"):
            if key in params:
                if not _finite(params[key]) or params[key] < 0:
                    problems.append(f"optimizer.params.{key} must be a number >= 0, not "
                                    f"{params[key]!r}")
                else:
                    out.optimizer[key] = float(params[key])
        if "betas" in params:
            betas = params["betas"]
            if not isinstance(betas, (list, tuple)) or len(betas) != 2 or \
                    not all(_finite(b) for b in betas):
                problems.append(f"optimizer.params.betas must be two numbers, not {betas!r}")
            else:
                out.optimizer["betas"] = (float(betas[0]), float(betas[1]))
        out.optimizer["decoupled_weight_decay"] = bool(decoupled)

    amp = ds.get("amp")
    if amp is not None:
        if not isinstance(amp, dict):
            problems.append("amp must be a dict")
        elif amp.get("enabled", False):
            problems.append("amp.enabled: apex's mixed precision is not supported (use bf16 or "
                            "fp16 parameters)")
        else:
            out.notes.append("amp: not enabled; Strata does not use apex")

    if "gradient_clipping" in ds:
        clip = ds["gradient_clipping"]
        if not _finite(clip) or clip < 0:
            problems.append(f"gradient_clipping must be a number >= 0, not {clip!r}")
        else:
            out.optimizer_options["max_grad_norm"] = float(clip)

    strata_section = ds.get("strata", {})
    if not isinstance(strata_section, dict):
        problems.append("strata must be a dict of strata.Config fields")
        strata_section = {}
    for key, value in {**strata_section, **strata_overrides}.items():
        if not isinstance(key, str):
            problems.append(f"strata key {key!r} is not a string")
            continue
        try:
            setattr(out.config, key, value)
        except StrataError as e:
            problems.append(f"strata.{key}: {e.message}")

    if problems:
        raise DeepSpeedConfigError(problems)
    if warn:
        for note in out.notes:
            warnings.warn("strata: " + note, stacklevel=2)
    return out
