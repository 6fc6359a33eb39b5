"""strata.torch.AdamW: a torch.optim.Optimizer whose states live in Strata.

The fp32 master weights and the Adam moments of every parameter are Strata's optimizer states
(tensors of kinds MASTER_WEIGHT, ADAM_M, ADAM_V, home NVMe); step() runs strata_optimizer_step,
which streams them through pinned memory and writes the new weights into the parameters.

Over parameters of a strata.torch.offload model, the optimizer uses that model's runtime: the
gradients are already in Strata (the backward hooks put them there) and the new weights land in
the parameters' Strata tensors. Over ordinary parameters it creates a runtime of its own
(nvme_path=... is then required): step() copies each .grad in, runs the update, and copies the new
weights back into .data.

param_groups, add_param_group, zero_grad, state_dict / load_state_dict (torch.optim.AdamW's
format: state[i] = {step, exp_avg, exp_avg_sq}) and torch.optim.lr_scheduler all work; the
group settings are pushed to Strata (strata_optimizer_set_group) at every step where they
changed.
"""
import torch

from .. import _lib
from ..errors import StrataError
from ..runtime import Runtime
from . import _views
from .offload import _np_view, build_config

_STATES = (("exp_avg", _lib.OPTIMIZER_EXP_AVG), ("exp_avg_sq", _lib.OPTIMIZER_EXP_AVG_SQ))


def _group_settings(group):
    betas = tuple(float(b) for b in group["betas"])
    return (float(group["lr"]), betas, float(group["eps"]), float(group["weight_decay"]),
            bool(group.get("decoupled_weight_decay", True)))


class _Standalone:
    """Strata tensors for a parameter that is not offloaded (the optimizer's own runtime)."""

    def __init__(self, runtime, name, param, layer):
        dtype = _views.TORCH_TO_STRATA.get(param.dtype)
        if dtype is None or param.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise StrataError(_lib.E_UNSUPPORTED, f"parameter dtype {param.dtype}: Strata's "
                                                  "optimizer takes float32, bfloat16, float16")
        nbytes = param.numel() * param.element_size()
        self.name = name
        self.param = param
        self.shape = tuple(param.shape)
        self.dtype = param.dtype
        self.tensor = runtime.register(name, nbytes, dtype, "parameter", layer, "nvme")
        self.tensor.write(_views.host_numpy(param))
        self.grad = runtime.register(name + ".grad", nbytes, dtype, "gradient", layer, "nvme")
        self.grad_written = False


class AdamW(torch.optim.Optimizer):
    """AdamW (or Adam with decoupled_weight_decay=False) run by Strata.

    AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *,
          max_grad_norm=0.0, check_overflow=True, sub_group_bytes=0,
          nvme_path=None, config=None, deepspeed_config=None, **config_fields)

    The defaults are torch.optim.AdamW's. max_grad_norm clips the global gradient norm (0: off);
    check_overflow skips a step whose gradients hold inf or nan (step() then returns without
    changing anything; see last_result). nvme_path / config / deepspeed_config / config_fields
    configure the runtime the optimizer creates for parameters that are not offloaded; a
    deepspeed_config's "optimizer" and "gradient_clipping" also set the defaults above.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *,
                 decoupled_weight_decay=True, max_grad_norm=0.0, check_overflow=True,
                 sub_group_bytes=0, nvme_path=None, config=None, deepspeed_config=None,
                 **config_fields):
        self._ready = False
        mapped = None
        if deepspeed_config is not None:
            from ..deepspeed import from_deepspeed
            mapped = from_deepspeed(deepspeed_config, warn=False)
            lr = mapped.optimizer.get("lr", lr)
            betas = mapped.optimizer.get("betas", betas)
            eps = mapped.optimizer.get("eps", eps)
            weight_decay = mapped.optimizer.get("weight_decay", weight_decay)
            decoupled_weight_decay = mapped.optimizer.get("decoupled_weight_decay",
                                                          decoupled_weight_decay)
            max_grad_norm = mapped.optimizer_options.get("max_grad_norm", max_grad_norm)
            sub_group_bytes = mapped.optimizer_options.get("sub_group_bytes", sub_group_bytes)
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameters: {betas}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        decoupled_weight_decay=bool(decoupled_weight_decay), amsgrad=False,
                        maximize=False)
        super().__init__(params, defaults)

        all_params = [p for g in self.param_groups for p in g["params"]]
        owners = {id(getattr(p, "_strata", None) and p._strata.owner()) for p in all_params}
        offloaded = [p for p in all_params if getattr(p, "_strata", None) is not None]
        if offloaded and len(offloaded) != len(all_params):
            raise StrataError(_lib.E_INVALID, "some parameters are offloaded by "
                                              "strata.torch.offload and some are not; give "
                                              "AdamW one kind")
        if offloaded:
            if len(owners) != 1:
                raise StrataError(_lib.E_INVALID, "parameters of several strata.torch.offload "
                                                  "models: create one AdamW per model")
            self._model = offloaded[0]._strata.owner()
            if self._model.optimizer is not None:
                raise StrataError(_lib.E_STATE, "this offloaded model already has a "
                                                "strata.torch.AdamW")
            self.runtime = self._model.runtime
            self._own_runtime = False
            self._model.optimizer = self
        else:
            cfg, _, _ = build_config(nvme_path, "cpu", config, deepspeed_config if mapped else
                                     None, **config_fields)
            self.runtime = Runtime(cfg)
            self._own_runtime = True
            self._model = None
        self._records = {}  # id(param) -> record (_Param of offload, or _Standalone)
        self._group_index = []  # param_groups[i] -> Strata group index
        self._pushed = []  # the settings last given to Strata, per group
        self.last_result = None
        try:
            self.runtime.optimizer_configure(max_grad_norm=max_grad_norm,
                                             check_overflow=check_overflow,
                                             sub_group_bytes=sub_group_bytes)
            self._ready = True
            for group in self.param_groups:
                self._register_group(group)
        except BaseException:
            self._detach()
            raise

    # -- groups ---------------------------------------------------------------------------------
    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if getattr(self, "_ready", False):
            self._register_group(self.param_groups[-1])

    def _register_group(self, group):
        if group.get("amsgrad") or group.get("maximize"):
            raise StrataError(_lib.E_UNSUPPORTED, "amsgrad and maximize are not supported")
        settings = _group_settings(group)
        index = self.runtime.optimizer_add_group(*settings)
        self._group_index.append(index)
        self._pushed.append(settings)
        for p in group["params"]:
            rec = self._record_for(p)
            self.runtime.optimizer_add_param(index, rec.tensor, rec.grad)

    def _record_for(self, p):
        rec = self._records.get(id(p))
        if rec is not None:
            raise StrataError(_lib.E_INVALID, "a parameter appears twice in the optimizer")
        if self._model is not None:
            rec = p._strata
            if rec.owner() is not self._model:
                raise StrataError(_lib.E_INVALID, "parameter of another offloaded model")
            if rec.grad is None:
                raise StrataError(_lib.E_INVALID, f"parameter {rec.name!r} does not require "
                                                  "grad: leave it out of the optimizer")
        else:
            if getattr(p, "_strata", None) is not None:
                raise StrataError(_lib.E_INVALID, "an offloaded parameter added to a standalone "
                                                  "strata.torch.AdamW")
            rec = _Standalone(self.runtime, f"param{len(self._records)}", p, -1)
        self._records[id(p)] = rec
        return rec

    def _push_groups(self):
        for i, group in enumerate(self.param_groups):
            settings = _group_settings(group)
            if settings != self._pushed[i]:
                self.runtime.optimizer_set_group(self._group_index[i], *settings)
                self._pushed[i] = settings

    # -- step -----------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None, loss_scale=1.0):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_live()
        self._push_groups()
        params = [p for g in self.param_groups for p in g["params"]]
        if self._model is None:
            missing = [self._records[id(p)].name for p in params if p.grad is None]
            self._require_grads(missing)
            for p in params:
                rec = self._records[id(p)]
                rec.tensor.write(_views.host_numpy(p.detach()))
                rec.grad.write(_views.host_numpy(p.grad))
        else:
            missing = [self._records[id(p)].name for p in params
                       if not self._records[id(p)].grad_written]
            self._require_grads(missing)
        model = self._model
        if model is not None:
            with model._lock:
                model._close_phase()
                if not model._step_open:
                    model.runtime.step_begin()
                    model._step_open = True
                model._enter_phase("optimizer", -1)
        try:
            self.last_result = self.runtime.optimizer_step(loss_scale)
        finally:
            if model is not None:
                model._end_step()
        if not self.last_result["found_nonfinite"]:
            # Strata discarded the gradients it consumed.
            for p in params:
                self._records[id(p)].grad_written = False
        if self._model is None:
            for p in params:
                rec = self._records[id(p)]
                out = torch.empty(rec.shape, dtype=rec.dtype)
                rec.tensor.read(_np_view(out))
                p.data.copy_(out)
        return loss

    def _require_grads(self, missing):
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise StrataError(_lib.E_STATE,
                              f"{len(missing)} parameter(s) have no gradient this step ({shown}); "
                              "Strata's optimizer updates every parameter it holds at each step "
                              "(torch's skips them): leave parameters that get no gradient out "
                              "of the optimizer")

    def zero_grad(self, set_to_none=True):
        if self._model is not None:
            self._model.zero_grad()
        else:
            super().zero_grad(set_to_none=set_to_none)

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self):
        self._check_live()
        step = self.runtime.optimizer_get_step()
        state = {}
        groups = []
        index = 0
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = []
            for p in group["params"]:
                rec = self._records[id(p)]
                packed["params"].append(index)
                if step > 0:
                    entry = {"step": torch.tensor(float(step))}
                    for key, which in _STATES:
                        value = torch.empty(rec.shape, dtype=torch.float32)
                        self.runtime.optimizer_read_state(rec.tensor, which, _np_view(value))
                        entry[key] = value
                    if rec.dtype != torch.float32:
                        value = torch.empty(rec.shape, dtype=torch.float32)
                        self.runtime.optimizer_read_state(rec.tensor, _lib.OPTIMIZER_MASTER,
                                                          _np_view(value))
                        entry["strata_master"] = value
                    state[index] = entry
                index += 1
            groups.append(packed)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Loads a state_dict of strata.torch.AdamW or torch.optim.AdamW."""
        self._check_live()
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for mine, theirs in zip(self.param_groups, groups):
            if len(mine["params"]) != len(theirs["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
        ids = {}
        for mine, theirs in zip(self.param_groups, groups):
            for p, key in zip(mine["params"], theirs["params"]):
                ids[key] = p
            for k, v in theirs.items():
                if k != "params":
                    mine[k] = v
            mine.setdefault("decoupled_weight_decay", True)
        steps = set()
        states = state_dict["state"]
        for key, p in ids.items():
            rec = self._records[id(p)]
            entry = states.get(key)
            if entry is None:
                continue
            for name, which in _STATES:
                value = entry[name].detach().to("cpu", torch.float32).contiguous()
                if tuple(value.shape) != rec.shape:
                    raise ValueError(f"state {name} of {rec.name}: shape {tuple(value.shape)} "
                                     f"is not {rec.shape}")
                self.runtime.optimizer_write_state(rec.tensor, which, _np_view(value))
            # The fp32 master: saved by Strata for half-precision parameters; otherwise the
            # parameter's current value (torch's AdamW keeps no separate master).
            if "strata_master" in entry:
                master = entry["strata_master"].detach().to("cpu", torch.float32).contiguous()
            else:
                current = torch.empty(rec.shape, dtype=rec.dtype)
                if self._model is None:
                    current.copy_(p.detach())
                else:
                    rec.tensor.read(_np_view(current))
                master = current.to(torch.float32)
            self.runtime.optimizer_write_state(rec.tensor, _lib.OPTIMIZER_MASTER,
                                               _np_view(master))
            step = entry.get("step", 0)
            steps.add(int(step.item() if torch.is_tensor(step) else step))
        if len(steps) > 1:
            raise ValueError(f"parameters have different step counts {sorted(steps)}; Strata "
                             "keeps one step count")
        if steps:
            self.runtime.optimizer_set_step(steps.pop())
        self._push_groups()

    def save(self, path):
        """strata_optimizer_export: every state to one checksummed file, atomically."""
        self._check_live()
        self.runtime.optimizer_export(path)

    def load(self, path):
        """strata_optimizer_import: the inverse of save (all or nothing)."""
        self._check_live()
        self.runtime.optimizer_import(path)

    def _check_live(self):
        if self.runtime is None or self.runtime.closed:
            raise StrataError(_lib.E_STATE, "the optimizer's runtime is closed")

    def _detach(self):
        if self._model is not None and self._model.optimizer is self:
            self._model.optimizer = None
        if getattr(self, "_own_runtime", False) and self.runtime is not None:
            self.runtime.close()

    def close(self):
        self._detach()

    def __del__(self):
        try:
            if getattr(self, "_own_runtime", False):
                self.runtime.close()
        except Exception:
            pass
