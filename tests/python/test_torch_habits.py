"""Ordinary PyTorch habits around an offloaded model (issue 17): each one either gives plain
PyTorch's result (losses within 1e-5 relative over 20 steps, from the same weights and data) or
raises a clear error at the moment of misuse. The model is a Llama-style 2-block model with
tied input and output embeddings, as in most small language models."""
import collections
import copy
import gc
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch
import torch.nn.utils.prune
import torch.utils.checkpoint

import strata
import strata.torch as st
from strata.torch import _intercept
from conftest import ROOT, SMALL
from tiny_llama import PRESETS, Llama, batches, corpus_bytes, loss_fn

STEPS = 20
REL = 1e-5


def tied_llama(seed=0, layers=2):
    torch.manual_seed(seed)
    c = PRESETS["tinyllama-1.1b"].scaled(64, layers, vocab_size=256, max_positions=64)
    model = Llama(c)
    model.lm_head.weight = model.embed_tokens.weight
    return model


@pytest.fixture(scope="module")
def data():
    return batches(corpus_bytes(), STEPS + 1, batch=4, seq=32, seed=3)


def assert_close(ours, theirs, what="loss"):
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert abs(a - b) <= REL * abs(b), f"step {step}: {what} strata {a!r} vs torch {b!r}"


def pair(nvme_dir, seed=0, model=None, opt_args=None, offload_args=None, **adamw):
    """(reference model, its torch AdamW, offloaded copy, its Strata AdamW, handle)."""
    reference = model if model is not None else tied_llama(seed)
    ours = copy.deepcopy(reference)
    ref_opt = torch.optim.AdamW(opt_args(reference) if opt_args else reference.parameters(),
                                **adamw)
    handle = st.offload(ours, nvme_path=nvme_dir, device="cpu", **(offload_args or SMALL))
    opt = st.AdamW(opt_args(ours) if opt_args else ours.parameters(), **adamw)
    return reference, ref_opt, ours, opt, handle


def train_step(model, opt, x, y):
    """The documented loop's step; returns the loss."""
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def train_both(pairs, data, losses):
    """One train_step per batch for each (model, optimizer); losses[i] collects pair i's."""
    for x, y in data:
        for i, (m, o) in enumerate(pairs):
            losses[i].append(train_step(m, o, x, y))


def losses_of(model, opt, batches_, loss_of):
    """One step per batch (loss_of(model, batch), backward, step, zero_grad): the losses."""
    losses = []
    for batch in batches_:
        loss = loss_of(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def swap_files(directory):
    return [f for f in os.listdir(directory) if f.endswith(".swap")]


# 1 ----------------------------------------------------------------------------------------------
def test_clip_grad_norm_gives_torchs_result(data, nvme_dir):
    reference, ref_opt, ours, opt, _ = pair(nvme_dir, lr=3e-3, weight_decay=0.1)
    losses, norms, clipped = ([], []), ([], []), 0
    for x, y in data[:STEPS]:
        for i, (m, o) in enumerate(((reference, ref_opt), (ours, opt))):
            loss = loss_fn(m(x), y)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            o.step()
            o.zero_grad()
            losses[i].append(loss.item())
            norms[i].append(float(norm))
        clipped += norms[0][-1] > 0.5
    assert clipped >= STEPS // 2  # the clip really acts
    assert_close(norms[1], norms[0], "gradient norm")
    assert_close(losses[1], losses[0])
    # clip_grad_value_ too, on one more step.
    x, y = data[STEPS]
    for m in (reference, ours):
        loss_fn(m(x), y).backward()
        torch.nn.utils.clip_grad_value_(m.parameters(), 1e-3)
    theirs = reference.lm_head.weight.grad
    mine = ours._strata_offload.gradient(ours.lm_head.weight)
    assert theirs.abs().max() == 1e-3 and torch.equal(mine == 1e-3, theirs == 1e-3)


PRE_BOUND = """
from torch.nn.utils import clip_grad_norm_, clip_grad_value_  # bound before strata.torch
import copy, sys
import torch
sys.path.insert(0, {examples!r})
import strata.torch as st
from tiny_llama import PRESETS, Llama, loss_fn
torch.manual_seed(0)
reference = Llama(PRESETS["tinyllama-1.1b"].scaled(32, 1, vocab_size=64, max_positions=16))
ours = copy.deepcopy(reference)
handle = st.offload(ours, nvme_path={nvme!r}, device="cpu", nvme_capacity_bytes=32 << 20)
x = torch.randint(0, 64, (2, 16))
for m in (reference, ours):
    loss_fn(m(x), x).backward()
norms = [float(clip_grad_norm_(m.parameters(), 0.05)) for m in (reference, ours)]
clipped = [reference.lm_head.weight.grad, handle.gradient(ours.lm_head.weight)]
print(norms[0], norms[1], float((clipped[0] - clipped[1]).abs().max()))
"""


def test_clip_grad_norm_bound_before_importing_strata(nvme_dir):
    code = PRE_BOUND.format(examples=os.path.join(ROOT, "bindings", "python", "examples"),
                            nvme=nvme_dir)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "bindings", "python"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    theirs, ours, diff = map(float, done.stdout.split())
    assert theirs > 0.05  # the clip acts
    assert abs(ours - theirs) <= REL * theirs and diff <= 1e-7


# 2 ----------------------------------------------------------------------------------------------
def test_zero_grad_means_what_it_means_in_torch(data, nvme_dir):
    reference, ref_opt, ours, opt, handle = pair(nvme_dir, seed=1, lr=3e-3, weight_decay=0.1)
    losses = ([], [])
    for step, (x, y) in enumerate(data[:STEPS]):
        for i, (m, o) in enumerate(((reference, ref_opt), (ours, opt))):
            # An unwanted backward, then the model's zero_grad (Hugging Face Trainer style),
            # alternating set_to_none True / False.
            loss_fn(m(data[STEPS][0]), data[STEPS][1]).backward()
            m.zero_grad(set_to_none=step % 2 == 0)
            loss = loss_fn(m(x), y)
            loss.backward()
            o.step()
            o.zero_grad(set_to_none=step % 3 == 0)
            losses[i].append(loss.item())
        if step == 10:
            # zero_grad(set_to_none=False), then step() with no backward: torch steps on zero
            # gradients (decay and momentum); so must Strata.
            for m, o in ((reference, ref_opt), (ours, opt)):
                o.zero_grad(set_to_none=False)
                o.step()
    assert_close(losses[1], losses[0])
    # set_to_none=True, then step() with no backward: torch would skip every parameter; Strata
    # refuses rather than update on stale or zero gradients.
    opt.zero_grad(set_to_none=True)
    with pytest.raises(strata.StrataError) as e:
        opt.step()
    assert "no gradient" in e.value.message
    # backward after step() without zero_grad: torch adds to the gradient step() used, which
    # Strata has consumed. Refused when read (step, clip, gradient()); zero_grad() clears it.
    x, y = data[0]
    loss_fn(ours(x), y).backward()
    opt.step()
    loss_fn(ours(x), y).backward()
    for read in (opt.step, lambda: torch.nn.utils.clip_grad_norm_(ours.parameters(), 1.0),
                 lambda: handle.gradient(ours.lm_head.weight)):
        with pytest.raises(strata.StrataError) as e:
            read()
        assert "zero_grad" in e.value.message
    ours.zero_grad(set_to_none=True)
    assert handle.gradient(ours.lm_head.weight) is None


# 9 ----------------------------------------------------------------------------------------------
def test_failed_adamw_leaves_nothing_registered(data, nvme_dir):
    model = tied_llama(seed=2)
    model.norm.weight.requires_grad_(False)
    st.offload(model, nvme_path=nvme_dir, device="cpu", **SMALL)
    with pytest.raises(strata.StrataError) as e:
        st.AdamW(model.parameters())
    assert "does not require grad" in e.value.message
    opt = st.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    x, y = data[0]
    loss_fn(model(x), y).backward()
    opt.step()
    assert opt.runtime.optimizer_get_step() == 1


def test_adamw_refuses_the_options_it_would_otherwise_ignore(data, nvme_dir, tmp_path):
    """torch.optim.AdamW's signature: an option that changes torch's numbers and that Strata's
    update does not compute is refused, never dropped; runtime settings given with offloaded
    parameters (whose model's runtime is used) likewise. Then a plain AdamW works."""
    model = tied_llama(seed=2)
    st.offload(model, nvme_path=nvme_dir, device="cpu", **SMALL)
    for option in ("amsgrad", "maximize", "capturable", "differentiable"):
        with pytest.raises(strata.StrataError) as e:
            st.AdamW(model.parameters(), **{option: True})
        assert e.value.name == "STRATA_E_UNSUPPORTED" and option in e.value.message
    with pytest.raises(strata.StrataError) as e:
        st.AdamW(model.parameters(), 1e-3, (0.9, 0.999), 1e-8, 1e-2, True)  # amsgrad, positional
    assert e.value.name == "STRATA_E_UNSUPPORTED"
    for extra in ({"nvme_path": str(tmp_path)}, {"pinned_budget_bytes": 1 << 20},
                  {"weight_decy": 0.5}):
        with pytest.raises(strata.StrataError) as e:
            st.AdamW(model.parameters(), **extra)
        assert e.value.name == "STRATA_E_INVALID" and next(iter(extra)) in e.value.message
    opt = st.AdamW(model.parameters(), lr=1e-3, foreach=True, fused=False)
    x, y = data[0]
    loss_fn(model(x), y).backward()
    opt.step()
    assert opt.runtime.optimizer_get_step() == 1
    plain = torch.nn.Linear(4, 4)
    with pytest.raises(strata.StrataError) as e:
        st.AdamW(plain.parameters(), nvme_path=str(tmp_path), maximize=True, **SMALL)
    assert e.value.name == "STRATA_E_UNSUPPORTED"


def test_weights_loaded_after_the_optimizer_exists_are_where_the_next_step_starts(data,
                                                                                  nvme_dir):
    """torch.optim.AdamW steps from the parameter as it is: weights loaded between steps (a
    checkpoint's, a merged adapter's) are updated from there, with the moments kept. Strata's
    fp32 master takes them, so the losses go on equal to torch's."""
    reference, ref_opt, ours, opt, _ = pair(nvme_dir, seed=5, lr=3e-3)
    losses = [[], []]
    train_both([(reference, ref_opt), (ours, opt)], data[:3], losses)
    new = tied_llama(seed=6).state_dict()
    reference.load_state_dict(new)
    ours.load_state_dict(new)
    train_both([(reference, ref_opt), (ours, opt)], data[3:8], losses)
    assert_close(losses[1], losses[0])
    expected = reference.state_dict()
    for name, value in ours.state_dict().items():
        assert torch.allclose(value, expected[name], rtol=1e-5, atol=1e-6), name


def test_a_standalone_parameter_edited_between_steps_is_stepped_from_the_edit(data, nvme_dir):
    """The standalone AdamW (parameters not offloaded) copies the new weights into each
    parameter after a step; an edit made afterwards, even through .data (which no version
    counter sees), is where its next step starts, as in torch."""
    torch.manual_seed(7)
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 4))
    ours = copy.deepcopy(reference)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    opt = st.AdamW(ours.parameters(), lr=1e-2, nvme_path=nvme_dir, **SMALL)
    x = torch.randn(8, 16)
    y = torch.randn(8, 4)

    def step(model, o):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        o.step()
        o.zero_grad()
        return loss.item()

    losses = [[], []]
    for k in range(6):
        if k == 3:
            for model in (reference, ours):
                model[0].weight.data.mul_(0.5)  # not seen by the version counter
                with torch.no_grad():
                    model[2].bias.copy_(torch.ones(4))
        for i, (m, o) in enumerate(((reference, ref_opt), (ours, opt))):
            losses[i].append(step(m, o))
    assert_close(losses[1], losses[0])
    for a, b in zip(ours.parameters(), reference.parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_deepcopy_of_an_offloaded_model_is_refused_until_it_is_closed(data, nvme_dir):
    """A copy would hold NaN placeholders and hooks driving the original's Strata tensors:
    copy.deepcopy of the model, a submodule or the handle raises at once, naming what to do;
    after close(restore=True) the model is plain again and copies as torch copies it."""
    model = tied_llama(seed=8)
    handle = st.offload(model, nvme_path=nvme_dir, device="cpu", **SMALL)
    x, _ = data[0]
    before = model(x).detach()
    for what in (model, model.layers[0], handle):
        with pytest.raises(strata.StrataError) as e:
            copy.deepcopy(what)
        assert e.value.name == "STRATA_E_UNSUPPORTED" and "state_dict()" in e.value.message
    handle.close()
    twin = copy.deepcopy(model)
    assert torch.equal(twin(x), before)


# 3 ----------------------------------------------------------------------------------------------
def decay_groups(model):
    """The model files' own configure_optimizers: weight decay on 2-D weights only."""
    return [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


def test_parameters_keep_shape_and_dtype_while_offloaded(data, nvme_dir):
    reference, ref_opt, ours, opt, handle = pair(nvme_dir, seed=3, opt_args=decay_groups,
                                                 lr=3e-3)
    plain = {n: (p.shape, p.dtype, p.dim(), p.numel(), p.device)
             for n, p in reference.named_parameters()}
    after = {n: (p.shape, p.dtype, p.dim(), p.numel(), p.device)
             for n, p in ours.named_parameters()}
    assert after == plain
    assert [len(g["params"]) for g in opt.param_groups] == \
        [len(g["params"]) for g in ref_opt.param_groups] and \
        len(opt.param_groups[1]["params"]) > 0 and len(opt.param_groups[0]["params"]) > 0
    assert repr(ours) == repr(reference)
    # No memory behind the shape: one element per parameter, whatever its size.
    for p in ours.parameters():
        storage = p.untyped_storage() if hasattr(p, "untyped_storage") else p.storage()
        assert storage.nbytes() == p.element_size(), storage.nbytes()
    losses = ([], [])
    train_both(((reference, ref_opt), (ours, opt)), data[:STEPS], losses)
    assert_close(losses[1], losses[0])
    # A value read outside the parameter's unit is refused (it is a NaN placeholder there).
    with pytest.raises(strata.StrataError, match="'norm.weight' was read outside .* by isnan"):
        torch.isnan(ours.norm.weight)
    # Writes there would go nowhere: refused at the write, or, for an assigned .data, at the
    # next use.
    for write in (lambda: ours.layers[0].mlp.up_proj.weight.mul_(2),
                  lambda: ours.norm.weight.fill_(1.0)):
        with torch.no_grad(), pytest.raises(strata.StrataError, match="load_state_dict"):
            write()
    ours.norm.weight.data = torch.ones(ours.norm.weight.shape)
    with pytest.raises(strata.StrataError) as e:
        ours(data[0][0])
    assert "load_state_dict" in e.value.message


# 10 ---------------------------------------------------------------------------------------------
def test_swap_file_removed_at_gc(nvme_dir):
    def make():
        st.offload(tied_llama(), nvme_path=nvme_dir, device="cpu", **SMALL)

    make()
    gc.collect()
    assert swap_files(nvme_dir) == []


SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, {examples!r})
import strata.torch as st
from tiny_llama import PRESETS, Llama
{before}
model = Llama(PRESETS["tinyllama-1.1b"].scaled(32, 1, vocab_size=64, max_positions=16))
st.offload(model, nvme_path={nvme!r}, device="cpu", nvme_capacity_bytes=32 << 20)
assert [f for f in os.listdir({nvme!r}) if f.endswith(".swap")]
print("ready", flush=True)
{after}
"""


def run_script(nvme_dir, after, before="", send=None):
    code = SCRIPT.format(examples=os.path.join(ROOT, "bindings", "python", "examples"),
                         nvme=nvme_dir, before=textwrap.dedent(before),
                         after=textwrap.dedent(after))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "bindings", "python"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    if send is not None:
        proc.send_signal(send)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


@pytest.mark.parametrize("case", ["exception", "sigterm", "sigint", "chained"])
def test_swap_file_removed_at_exit_and_on_signals(nvme_dir, case):
    if case == "exception":
        rc, _, err = run_script(nvme_dir, "raise RuntimeError('the loop failed')")
        assert rc == 1 and "the loop failed" in err
    elif case == "sigterm":
        rc, _, _ = run_script(nvme_dir, "time.sleep(60)", send=signal.SIGTERM)
        assert rc == -signal.SIGTERM  # still dies of the signal, as without Strata
    elif case == "sigint":
        rc, _, err = run_script(nvme_dir, "time.sleep(60)", send=signal.SIGINT)
        # Python's own handler: KeyboardInterrupt, and an exit by SIGINT once it is uncaught.
        assert rc == -signal.SIGINT and "KeyboardInterrupt" in err
    else:  # the application's own SIGTERM handler still runs (chained)
        before = """
        def handler(signum, frame):
            print("own handler", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, handler)
        """
        rc, out, _ = run_script(nvme_dir, "time.sleep(60)", before=before, send=signal.SIGTERM)
        assert rc == 3 and "own handler" in out
    assert swap_files(nvme_dir) == []


# 4 and 7 ----------------------------------------------------------------------------------------
def test_add_param_group_mid_run_keeps_per_parameter_steps(data, nvme_dir):
    def frozen_mlp(model):
        return [p for n, p in model.named_parameters() if "layers.1.mlp" in n]

    def first(model):
        for p in frozen_mlp(model):
            p.requires_grad_(False)
        return [p for p in model.parameters() if p.requires_grad]

    reference, ref_opt, ours, opt, _ = pair(nvme_dir, seed=4, opt_args=first, lr=3e-3,
                                            weight_decay=0.1)
    losses = ([], [])
    for step, (x, y) in enumerate(data[:STEPS]):
        if step == 5:  # unfreeze: a new group, at its own step 1
            for m, o in ((reference, ref_opt), (ours, opt)):
                for p in frozen_mlp(m):
                    p.requires_grad_(True)
                o.add_param_group({"params": frozen_mlp(m), "weight_decay": 0.0})
        train_both(((reference, ref_opt), (ours, opt)), [(x, y)], losses)
    assert_close(losses[1], losses[0])
    # optimizer.state[p], read out of Strata, as torch keeps it (7).
    names = dict(ours.named_parameters())
    for name, p in reference.named_parameters():
        theirs, mine = ref_opt.state[p], opt.state[names[name]]
        assert float(mine["step"]) == float(theirs["step"]), name
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(mine[key], theirs[key], rtol=1e-3, atol=1e-8)
    assert float(opt.state[names["layers.1.mlp.up_proj.weight"]]["step"]) == STEPS - 5
    assert len(opt.state) == len(list(ours.parameters()))
    sd = opt.state_dict()
    assert sorted({float(e["step"]) for e in sd["state"].values()}) == [STEPS - 5, STEPS]
    with pytest.raises(strata.StrataError):
        opt.state[names["norm.weight"]] = {}
    with pytest.raises(strata.StrataError) as e:
        opt.save(os.path.join(nvme_dir, "opt.ckpt"))
    assert "state_dict" in e.value.message


def test_optimizer_state_edits_are_refused_not_dropped(data, nvme_dir):
    """optimizer.state[p] is a copy read out of Strata: torch's ways of changing the state
    through it (assigning or deleting an entry, clearing, replacing optimizer.state, writing a
    moment in place) would change only the copy; each is refused at once (before: accepted, and
    the next step moved the weights as if nothing had happened)."""
    _, _, ours, opt, _ = pair(nvme_dir, seed=6, lr=3e-3)
    train_both(((ours, opt),), data[:1], ([],))
    p = next(ours.parameters())
    entry = opt.state[p]
    for edit in (lambda: entry.__setitem__("exp_avg", torch.zeros(1)),
                 lambda: entry.pop("exp_avg"), lambda: opt.state.clear(),
                 lambda: opt.state.__delitem__(p),
                 lambda: setattr(opt, "state", collections.defaultdict(dict)),
                 lambda: opt.state[p]["exp_avg"].zero_(),
                 lambda: opt.state[p]["exp_avg"].mul_(0.5),
                 lambda: opt.state[p]["exp_avg_sq"].__setitem__(0, 1.0),
                 lambda: torch.add(entry["exp_avg"], 1, out=entry["exp_avg"])):
        with pytest.raises(strata.StrataError) as e:
            edit()
        assert e.value.name == "STRATA_E_UNSUPPORTED"
    # Reading it is torch's reading: int() and iteration are not writes.
    assert int(entry["step"]) == 1 and len(list(entry["exp_avg"][:2])) == 2
    # What is computed from it, and a copy of it, are the user's to change.
    scaled = entry["exp_avg"] * 2
    scaled.zero_()
    clone = entry["exp_avg"].clone()
    clone.add_(1)
    copied = copy.deepcopy(entry)
    assert type(copied) is dict and type(copied["exp_avg"]) is torch.Tensor
    copied["exp_avg"].zero_()
    theirs = pair(nvme_dir, seed=6, lr=3e-3)[:2]
    train_both((theirs,), data[:2], ([],))
    train_both(((ours, opt),), data[1:2], ([],))  # the step runs as torch's, untouched
    for (name, a), b in zip(ours.named_parameters(), theirs[0].parameters()):
        torch.testing.assert_close(opt._model.parameter(a), b.detach(), rtol=1e-5, atol=1e-7)


def test_a_step_skipped_for_non_finite_gradients_is_warned_about(data, nvme_dir):
    """check_overflow skips a step whose gradients hold nan, where torch's AdamW would step into
    nan; a loop that never reads last_result saw nothing, every step skipped."""
    _, _, ours, opt, handle = pair(nvme_dir, seed=9, lr=3e-3)
    x, y = data[0]
    before = handle.parameter(ours.norm.weight).clone()
    (loss_fn(ours(x), y) * float("nan")).backward()
    with pytest.warns(RuntimeWarning, match="skipped its update"):
        opt.step()
    assert opt.last_result["found_nonfinite"]
    assert torch.equal(handle.parameter(ours.norm.weight), before)


def test_a_torch_optimizer_over_offloaded_parameters_is_refused(data, nvme_dir):
    """torch's optimizers find no p.grad on offloaded parameters and would skip them all,
    training nothing without a word (the loss stayed where it was): refused when the
    parameters are added, the constructor or add_param_group."""
    _, _, ours, _, _ = pair(nvme_dir, seed=8, lr=3e-3)
    for make in (lambda ps: torch.optim.SGD(ps, lr=0.1), lambda ps: torch.optim.AdamW(ps),
                 lambda ps: torch.optim.Adam([{"params": ps}])):
        with pytest.raises(strata.StrataError) as e:
            make(ours.parameters())
        assert e.value.name == "STRATA_E_INVALID" and "strata.torch.AdamW" in e.value.message
    plain = torch.nn.Linear(2, 2)
    sgd = torch.optim.SGD(plain.parameters(), lr=0.1)  # other parameters: torch's, as ever
    with pytest.raises(strata.StrataError):
        sgd.add_param_group({"params": [next(ours.parameters())]})
    # One made before offload() took its parameters: refused at its step (torch >= 2.0's
    # global step pre-hook; before 2.0 each optimizer class's step, checked first), before it
    # changes anything, also for an optimizer class defined after strata.torch was imported.
    class Later(torch.optim.SGD):
        def step(self, closure=None):
            return super().step(closure)

    early = tied_llama(seed=8)
    before = [torch.optim.AdamW(early.parameters()), Later(early.parameters(), lr=0.1),
              torch.optim.SGD([{"params": plain.parameters()},
                               {"params": early.parameters()}], lr=0.1)]
    st.offload(early, nvme_path=nvme_dir, device="cpu", **SMALL)
    plain.weight.grad = torch.ones_like(plain.weight)
    kept = plain.weight.detach().clone()
    for optimizer in before:
        with pytest.raises(strata.StrataError) as e:
            optimizer.step()
        assert type(optimizer).__name__ in e.value.message
    assert torch.equal(plain.weight, kept)  # the mixed one changed nothing before refusing
    Later(plain.parameters(), lr=0.1).step()  # other parameters step as ever
    assert not torch.equal(plain.weight, kept)


def test_zero_grad_without_set_to_none_leaves_a_parameter_without_gradient_without(data,
                                                                                  nvme_dir):
    """torch's zero_grad(set_to_none=False) zeroes only the gradients that exist: a layer
    frozen after its gradients were set to None has none, and torch's AdamW leaves it alone.
    Strata refuses the step (a parameter without a gradient, docs/pytorch.md); before, it made
    the gradients zero and stepped the frozen layer with its weight decay and momentum."""
    _, _, ours, opt, _ = pair(nvme_dir, seed=7, lr=3e-3, weight_decay=0.1)
    train_both(((ours, opt),), data[:1], ([],))
    opt.zero_grad(set_to_none=True)
    frozen = [p for n, p in ours.named_parameters() if "layers.1.mlp" in n]
    for p in frozen:
        p.requires_grad_(False)
    opt.zero_grad(set_to_none=False)
    x, y = data[1]
    loss_fn(ours(x), y).backward()
    with pytest.raises(strata.StrataError) as e:
        opt.step()
    assert e.value.name == "STRATA_E_STATE" and "no gradient" in e.value.message


# 6 ----------------------------------------------------------------------------------------------
def test_state_dict_with_tied_weights_loads_strictly_into_plain_model(data, nvme_dir):
    reference, ref_opt, ours, opt, handle = pair(nvme_dir, seed=5, lr=3e-3)
    train_both(((reference, ref_opt), (ours, opt)), data[:3], ([], []))
    sd = ours.state_dict()
    ref_sd = reference.state_dict()
    assert list(sd) == list(ref_sd)
    for name, value in ref_sd.items():
        assert sd[name].shape == value.shape, name
        torch.testing.assert_close(sd[name], value, rtol=1e-5, atol=1e-6)
    # The tied weight: one tensor under both names, as torch has it.
    assert sd["lm_head.weight"] is sd["embed_tokens.weight"]
    assert handle.state_dict().keys() == sd.keys()
    plain = tied_llama(seed=77)
    plain.load_state_dict(sd, strict=True)
    x, y = data[3]
    assert_close([loss_fn(plain(x), y).item()], [loss_fn(reference(x), y).item()])
    # Streamed to disk one parameter at a time, in torch.save's format.
    path = os.path.join(nvme_dir, "full.pt")
    with warnings.catch_warnings():
        # torch 2.x warned "TypedStorage is deprecated" at every save (asked for a typed storage)
        warnings.simplefilter("error")
        st.save_full_state_dict(ours, path)
    streamed = torch.load(path)
    assert list(streamed) == list(ref_sd)
    assert all(torch.equal(streamed[k], sd[k]) for k in sd)
    assert streamed["lm_head.weight"].data_ptr() == streamed["embed_tokens.weight"].data_ptr()
    tied_llama(seed=79).load_state_dict(streamed, strict=True)
    # And back into an offloaded model, strict as well.
    again = tied_llama(seed=78)
    st.offload(again, nvme_path=nvme_dir, device="cpu", **SMALL)
    again.load_state_dict(ref_sd, strict=True)
    assert_close([loss_fn(again(x), y).item()], [loss_fn(reference(x), y).item()])
    bad = {**ref_sd, "norm.weight": torch.ones(3)}
    with pytest.raises(RuntimeError, match="size mismatch") as ours:
        again.load_state_dict(bad)
    with pytest.raises(RuntimeError) as torchs:
        tied_llama(seed=78).load_state_dict(bad)
    assert str(ours.value) == str(torchs.value)  # torch's words, torch.Size and all


# 5 ----------------------------------------------------------------------------------------------
class CheckpointedLlama(Llama):
    """The example Llama with every block under torch.utils.checkpoint."""

    reentrant = True

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=self.reentrant)
        return self.lm_head(self.norm(x))


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_exact_under_a_tight_budget(data, nvme_dir, reentrant):
    torch.manual_seed(6)
    # Hidden 128: blocks large beside the tied embedding, which stays on the device from the
    # output layer's backward to the input layer's.
    c = PRESETS["tinyllama-1.1b"].scaled(128, 3, vocab_size=256, max_positions=64)
    model = CheckpointedLlama(c)
    model.lm_head.weight = model.embed_tokens.weight
    model.reentrant = reentrant
    block = sum(p.numel() * 4 for p in model.layers[0].parameters())
    # A device budget below two blocks' parameters (the plain torch code without Strata's
    # handling of recomputation was off by up to 10% here).
    budget = dict(SMALL, device_budget_bytes=int(1.9 * block), compute_tier="device")
    reference, ref_opt, ours, opt, _ = pair(nvme_dir, model=model, offload_args=budget,
                                            lr=3e-3, weight_decay=0.1)
    losses = ([], [])
    train_both(((reference, ref_opt), (ours, opt)), data[:STEPS], losses)
    assert_close(losses[1], losses[0])


def test_activation_checkpointing_without_room_fails_at_once(data, nvme_dir):
    # A device budget below one recomputed block beside the tied embedding (held from the
    # output layer's backward to the input layer's): no order of acquires can fit, and Strata's
    # acquire would wait 300 s for a release. Refused at once, saying what to change.
    torch.manual_seed(6)
    c = PRESETS["tinyllama-1.1b"].scaled(128, 3, vocab_size=256, max_positions=64)
    model = CheckpointedLlama(c)
    model.lm_head.weight = model.embed_tokens.weight
    block = sum(p.numel() * 4 for p in model.layers[0].parameters())
    st.offload(model, nvme_path=nvme_dir, device="cpu", compute_tier="device",
               **dict(SMALL, device_budget_bytes=int(1.0 * block)))
    opt = st.AdamW(model.parameters())
    x, y = data[0]
    start = time.monotonic()
    with pytest.raises(strata.StrataError) as e:
        loss_fn(model(x), y).backward()
    assert time.monotonic() - start < 30
    assert e.value.name == "STRATA_E_DEVICE_BUDGET"
    assert "checkpoint smaller segments" in e.value.message
    assert "device_budget_bytes" in e.value.message
    del opt


# 8 ----------------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_ddp_around_an_offloaded_model_is_refused(nvme_dir, tmp_path):
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        model = tied_llama(seed=8)
        st.offload(model, nvme_path=nvme_dir, device="cpu", **SMALL)
        with pytest.raises(strata.StrataError) as e:
            torch.nn.parallel.DistributedDataParallel(model)
        assert "average_gradients" in e.value.message
        # Plain models are DDP's as before.
        torch.nn.parallel.DistributedDataParallel(tied_llama(seed=9))
    finally:
        dist.destroy_process_group()


# 11 ---------------------------------------------------------------------------------------------
def test_cpu_computes_on_pinned_buffers_without_a_device_copy(data, nvme_dir):
    # On a CPU torch computes on Strata's pinned host buffers: no emulated-device copy of the
    # parameters or gradients, with the same numbers as plain torch.
    reference, ref_opt, ours, opt, handle = pair(nvme_dir, seed=11, lr=3e-3)
    assert handle.compute_tier == "pinned"
    losses = ([], [])
    train_both(((reference, ref_opt), (ours, opt)), data[:STEPS], losses)
    assert_close(losses[1], losses[0])
    stats = handle.stats()
    assert stats["device"]["peak_in_use_bytes"] == 0
    assert stats["emulated_device_resident_bytes"] == 0
    assert stats["pinned"]["peak_in_use_bytes"] > 0


def test_an_enabled_grad_scaler_over_offloaded_parameters_is_refused(data, nvme_dir):
    """torch's GradScaler unscales and checks p.grad, which offloaded parameters never have:
    torch stopped at 'No inf checks were recorded for this optimizer' (its step) or let
    clip_grad_norm_ clip gradients still multiplied by the scale (unscale_ finding nothing).
    Refused while enabled, naming the loss_scale way; a disabled scaler (as torch makes one
    without CUDA) passes the step through unchanged. torch 1.13 has no CPU kernels for an
    enabled scaler, so enabling it is forced here."""
    reference, ref_opt, ours, opt, _ = pair(nvme_dir, seed=4, lr=3e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "GradScaler is enabled, but CUDA is not available"
        scaler = torch.cuda.amp.GradScaler(enabled=False)
    losses = ([], [])
    for x, y in data[:2]:
        for k, (model, optimizer) in enumerate(((reference, ref_opt), (ours, opt))):
            loss = loss_fn(model(x), y)
            losses[k].append(loss.item())
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    assert_close(losses[1], losses[0])
    assert losses[1][1] != losses[1][0]  # it stepped
    scaler._enabled = True
    for call in (scaler.unscale_, scaler.step):
        with pytest.raises(strata.StrataError) as e:
            call(opt)
        assert e.value.name == "STRATA_E_UNSUPPORTED"
        assert "loss_scale" in e.value.message and call.__name__ in e.value.message


class _FailsOnShortBatches(torch.nn.Module):
    """A unit (it owns a parameter) whose forward raises part-way on a batch of 3 rows, as an
    out-of-memory error raises from inside a layer."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8) * 0.3)

    def forward(self, x):
        h = x @ self.w
        if x.shape[0] == 3:
            raise RuntimeError("CUDA out of memory (simulated)")
        return h


def test_a_forward_that_raises_leaves_nothing_held_and_training_goes_on(nvme_dir):
    """A loop that skips a batch whose forward raised (an out-of-memory error, a bad batch)
    left the failing unit's parameters acquired: every later step() and state_dict() refused
    ("is acquired") until close(). Now the failed forward is forgotten, as in torch."""
    torch.manual_seed(0)
    reference, ref_opt, ours, opt, _ = pair(nvme_dir, model=torch.nn.Sequential(
        torch.nn.Linear(8, 8), _FailsOnShortBatches(), torch.nn.Linear(8, 1)), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    batches_ = [torch.randn(rows, 8, generator=g) for rows in (4, 3, 4, 3, 4)]
    losses = {}
    for name, model, opt in (("torch", reference, ref_opt), ("strata", ours, opt)):
        losses[name] = []
        for x in batches_:
            try:
                loss = model(x).pow(2).mean()
            except RuntimeError as e:
                assert "out of memory" in str(e)
                opt.zero_grad()
                continue
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[name].append(loss.item())
    assert len(losses["strata"]) == 3
    assert_close(losses["strata"], losses["torch"])
    state = ours.state_dict()  # refused before: "tensor '1.w' is acquired"
    for key, value in reference.state_dict().items():
        assert torch.allclose(state[key], value, rtol=1e-5, atol=1e-7), key


class _AttentionBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.layer(h).pow(2).mean()


def test_multihead_attention_trains_as_in_torch(nvme_dir):
    """nn.MultiheadAttention (and the TransformerEncoderLayer around one) reads its out_proj's
    weight and bias in its own forward, without calling out_proj: they read NaN, and every loss
    was NaN without an error. They belong to the attention's unit now."""
    torch.manual_seed(0)
    reference, ref_opt, ours, opt, _ = pair(nvme_dir, model=_AttentionBlock(), lr=1e-2)
    g = torch.Generator().manual_seed(2)
    tokens = [torch.randint(0, 32, (2, 6), generator=g) for _ in range(4)]
    assert_close(losses_of(ours, opt, tokens, lambda m, t: m(t)),
                 losses_of(reference, ref_opt, tokens, lambda m, t: m(t)))
    with torch.no_grad():  # inference reads them too
        assert abs(ours(tokens[0]).item() - reference(tokens[0]).item()) <= \
            REL * abs(reference(tokens[0]).item())


class _FunctionalHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)

    def forward(self, tokens):
        # The embedding's weight read outside the embedding's forward.
        return torch.nn.functional.linear(self.embed(tokens), self.embed.weight).mean()


def test_a_parameter_read_outside_its_module_is_refused_in_training(nvme_dir):
    """A weight used outside the forward of the module owning it reads the NaN placeholder; in
    training the saved-tensors hook sees it saved and refuses, naming it and its owner (the
    loss was NaN before, and every step skipped with only a warning)."""
    torch.manual_seed(0)
    model = _FunctionalHead()
    st.offload(model, nvme_path=nvme_dir, device="cpu", **SMALL)
    # Raised in torch's saved-tensors hook, which hands it on as a RuntimeError with its text.
    with pytest.raises(RuntimeError) as e:
        model(torch.randint(0, 32, (2, 6)))
    assert "STRATA_E_STATE" in str(e.value)
    assert "'embed.weight' was read outside the forward of the module that owns it ('embed')" \
        in str(e.value), str(e.value)
    # Nothing is left held: the model still saves.
    assert torch.isfinite(model.state_dict()["embed.weight"]).all()


class _BiasReader(torch.nn.Module):
    """Reads its child's bias again after calling the child: an addition, which autograd saves
    nothing for. Reads the child's weight's description before calling it, as shape-based code
    does."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        width = self.lin.weight.shape[1]
        assert self.lin.weight.dtype == x.dtype and self.lin.weight.numel() == 64
        return (self.lin(x[:, :width]) + self.lin.bias).sum()


def test_a_parameter_read_outside_its_module_is_refused_without_autograd(nvme_dir):
    """Under torch.no_grad() (evaluation, generation) autograd saves nothing, nor does it for an
    addition in training, so the saved-tensors hook never saw those reads: the output was NaN
    without a word (a perplexity of NaN, a generation from garbage). Every operation of the
    model's forward on a placeholder is refused now, at the operation, naming the parameter,
    its owner and the operation; the parameter's shape, dtype and numel still read as before."""
    torch.manual_seed(0)
    head = _FunctionalHead()
    st.offload(head, nvme_path=nvme_dir, device="cpu", **SMALL)
    with torch.no_grad(), pytest.raises(strata.StrataError) as e:
        head(torch.randint(0, 32, (2, 6)))
    assert "'embed.weight' was read outside the forward of the module that owns it ('embed'), " \
        "by linear" in str(e.value), str(e.value)
    assert torch.isfinite(head.state_dict()["embed.weight"]).all()  # nothing left held

    torch.manual_seed(0)
    reader = _BiasReader()
    st.offload(reader, nvme_path=nvme_dir, device="cpu", **SMALL)
    x = torch.randn(4, 8)
    for grad in (True, False):
        with torch.set_grad_enabled(grad), pytest.raises(strata.StrataError) as e:
            reader(x)
        assert "'lin.bias' was read outside the forward of the module that owns it ('lin'), " \
            "by add" in str(e.value), str(e.value)

    # A pre-hook of the hook-based weight_norm, registered before offload(), runs before
    # Strata's and reads the placeholders of the two parameters it made.
    torch.manual_seed(0)
    normed = torch.nn.Sequential(torch.nn.utils.weight_norm(torch.nn.Linear(8, 8)))
    st.offload(normed, nvme_path=nvme_dir, device="cpu", **SMALL)
    with torch.no_grad(), pytest.raises(strata.StrataError, match=r"'0\.weight_[gv]' was read"):
        normed(x)


def test_a_parameter_unfrozen_after_offload_trains_from_the_next_forward(nvme_dir):
    """requires_grad_(True) on a frozen parameter, then a forward: Strata's own pre-hook hooks
    its gradient there, an operation on the placeholder that is not a read of it."""
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    ours = copy.deepcopy(reference)
    for m in (reference, ours):
        m[0].weight.requires_grad_(False)
    handle = st.offload(ours, nvme_path=nvme_dir, device="cpu", **SMALL)
    x = torch.randn(2, 4)
    for m in (reference, ours):
        m[0].weight.requires_grad_(True)
        m(x).sum().backward()
    assert torch.equal(handle.gradient(ours[0].weight), reference[0].weight.grad)


def test_sparse_gradients_are_refused_naming_the_parameter(nvme_dir):
    """An Embedding with sparse=True failed in the first backward with torch's internal
    "copy_() between dense and sparse Tensors is not implemented", naming nothing: refused at
    offload(), and one made sparse after offload() refused at its gradient, naming it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 1))
    with pytest.raises(strata.StrataError, match=r"module '0' is an nn.Embedding\(sparse=True\)"):
        st.offload(model, nvme_path=nvme_dir, device="cpu", **SMALL)
    model[0].sparse = False
    st.offload(model, nvme_path=nvme_dir, device="cpu", **SMALL)
    model[0].sparse = True
    with pytest.raises(RuntimeError, match=r"the gradient of '0.weight' is torch.sparse_coo"):
        model(torch.tensor([[1, 2]])).sum().backward()
    model[0].sparse = False  # and training goes on
    model(torch.tensor([[1, 2]])).sum().backward()
    assert torch.isfinite(model.state_dict()["0.weight"]).all()


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_offload_under_no_grad_trains_as_in_torch(nvme_dir, mode):
    """An inference script's set-up under no_grad() or inference_mode() (a @torch.no_grad()
    main): offload() failed in its own code ('NoneType' object has no attribute
    'next_functions'); the model it gives trains and infers as torch's."""
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    ours = copy.deepcopy(reference)
    with mode():
        handle = st.offload(ours, nvme_path=nvme_dir, device="cpu", **SMALL)
    x = torch.randn(2, 4)
    for m in (reference, ours):
        m(x).sum().backward()
    assert torch.equal(handle.gradient(ours[0].weight), reference[0].weight.grad)
    with mode():
        assert torch.equal(ours(x), reference(x))
    if mode is torch.inference_mode:  # a model made inside it has inference tensors: refused
        with mode():
            made_inside = torch.nn.Linear(4, 4)
        with pytest.raises(strata.StrataError, match="'weight' was made under "
                                                     r"torch.inference_mode\(\)"):
            st.offload(made_inside, nvme_path=nvme_dir, device="cpu", **SMALL)


class _Probe(torch.nn.Module):
    """Runs probe(self, h) between its two children, reading the second child's weight."""

    def __init__(self, probe):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.fc = torch.nn.Linear(8, 8)
        self.probe = probe

    def forward(self, tokens):
        return self.fc(self.probe(self, self.embed(tokens))).sum()


def test_a_placeholder_is_refused_wherever_a_value_is_read_and_its_description_is_not(nvme_dir):
    """A value read from a placeholder, in a forward or anywhere else, was NaN or worse a
    plausible number without an error: an L2 penalty over model.parameters() in the loss (every
    step skipped), an argmax over embeddings (index 0), a pruning mask built from NaN, the .data
    of a child's weight in a parent's forward, torch.save of a parameter. Each is refused at the
    operation now. What reads only a parameter's description, or uses it as a template, or
    converts it to what it already is, still works as in torch."""
    torch.manual_seed(0)
    x = torch.randint(0, 16, (2, 5))
    reference = _Probe(lambda m, h: h)
    ours = copy.deepcopy(reference)
    st.offload(ours, nvme_path=nvme_dir, device="cpu", **SMALL)
    descriptions = [
        lambda m, h: h.type_as(m.fc.weight), lambda m, h: h.to(m.fc.weight),
        lambda m, h: h + torch.zeros_like(m.fc.weight)[0], lambda m, h: h + m.fc.weight.new_zeros(8),
        lambda m, h: h if m.fc.weight.type() == "torch.FloatTensor" else None,
        lambda m, h: h.reshape(-1, m.fc.weight.shape[1]).view(h.shape),
        lambda m, h: h if m.fc.weight.to("cpu") is m.fc.weight else None]
    for probe in descriptions:
        reference.probe = ours.probe = probe
        with torch.no_grad():
            assert torch.equal(ours(x), reference(x))
    ours.to("cpu")  # where it is already: nothing to convert, nothing read
    ours.share_memory()  # moves storages, reads no value
    w = ours.fc.weight  # views are checked aliases: their shape reads, their values refuse
    assert w.t().shape == w.T.shape == (8, 8) and w[0].shape == (8,)
    with pytest.raises(strata.StrataError, match="by sum"):
        w.t()[0].sum()
    with pytest.raises(strata.StrataError, match="by __getitem__"):
        w[[0, 1]]  # advanced indexing copies: a read

    reads = {"the .data of a child's weight": lambda m, h: h + m.fc.bias.data,
             "a slice of it": lambda m, h: h @ m.fc.weight.data[:8].T,
             "a detached copy": lambda m, h: h * m.fc.weight.detach().mean()}
    for what, probe in reads.items():
        ours.probe = probe
        for grad in (True, False):
            with torch.set_grad_enabled(grad), pytest.raises(strata.StrataError,
                                                             match="'fc.(weight|bias)' was read"):
                ours(x)
    ours.probe = reference.probe = lambda m, h: h
    loss = ours(x)  # after a forward, in the loss: an L2 penalty
    with pytest.raises(strata.StrataError, match="'embed.weight' was read .* by pow"):
        loss + 1e-3 * sum(p.pow(2).sum() for p in ours.parameters())
    with pytest.raises(strata.StrataError, match="by abs"):
        torch.nn.utils.prune.l1_unstructured(ours.fc, "weight", amount=0.5)
    with pytest.raises(strata.StrataError, match="by __reduce_ex__"):
        torch.save(ours.fc.weight, io.BytesIO())
    # Nothing was changed or left held: the values, and a forward, as in torch.
    for k, v in reference.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    with torch.no_grad():
        assert torch.equal(ours(x), reference(x))


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)
        self.scale = torch.nn.Parameter(torch.tensor(2.0))  # 0-dim: CLIP's logit_scale

    def forward(self, x):
        return (self.lin(x) * self.scale).sum()


def test_a_zero_dim_parameter_trains_as_in_torch(nvme_dir):
    """A learnable scalar (shape ()) made offload() fail in torch's expand, building its
    placeholder; it trains as torch's."""
    torch.manual_seed(0)
    reference, ref_opt, ours, opt, _ = pair(nvme_dir, model=_Scaled(), lr=1e-2)
    g = torch.Generator().manual_seed(2)
    inputs = [torch.randn(2, 16, generator=g) for _ in range(3)]
    assert_close(losses_of(ours, opt, inputs, lambda m, x: m(x)),
                 losses_of(reference, ref_opt, inputs, lambda m, x: m(x)))
    assert ours.scale.shape == torch.Size([])


def test_loading_an_optimizer_state_without_a_parameter_starts_it_afresh(data, nvme_dir):
    """torch's load_state_dict replaces the whole state: a parameter the loaded state has no
    entry for (an empty state: the way to reset an optimizer, since a second strata.torch.AdamW
    over the model is refused) starts from zero moments at step 0. Strata kept its old moments
    and step count, and the next steps differed from torch's."""
    reference, ref_opt, ours, opt, _ = pair(nvme_dir, lr=1e-2)
    empty_ref = copy.deepcopy(ref_opt.state_dict())  # before any step: no state at all
    assert empty_ref["state"] == {}
    losses = [[], []]
    train_both([(reference, ref_opt), (ours, opt)], data[:3], losses)
    ref_opt.load_state_dict(empty_ref)
    opt.load_state_dict(empty_ref)  # torch's empty state, as a user would pass it
    train_both([(reference, ref_opt), (ours, opt)], data[3:6], losses)
    assert_close(losses[1], losses[0])
    assert opt.state_dict()["state"][0]["step"] == ref_opt.state_dict()["state"][0]["step"] == 3


def test_a_refused_optimizer_load_changes_nothing(data, nvme_dir):
    """A state Strata cannot hold (one group's parameters at different step counts) is refused
    before anything is written: the group settings and states stay as they were."""
    reference, ref_opt, ours, opt, _ = pair(nvme_dir, lr=1e-2)
    losses = [[], []]
    train_both([(reference, ref_opt), (ours, opt)], data[:2], losses)
    before = copy.deepcopy(opt.state_dict())
    mixed = copy.deepcopy(before)
    mixed["param_groups"][0]["lr"] = 0.5
    first = next(iter(mixed["state"]))
    mixed["state"][first]["step"] = 7
    with pytest.raises(ValueError, match="different step counts"):
        opt.load_state_dict(mixed)
    assert opt.param_groups[0]["lr"] == 1e-2
    train_both([(reference, ref_opt), (ours, opt)], data[2:4], losses)
    assert_close(losses[1], losses[0])


def test_a_gradient_assigned_after_backward_is_the_one_stepped_and_clipped(data, nvme_dir):
    """Gradient surgery assigns p.grad after backward; torch's step and clipping read it. It
    read back as set and step() used Strata's gradient without a word; now it replaces it."""
    reference, ref_opt, ours, opt, _ = pair(nvme_dir, lr=1e-2)
    losses = [[], []]
    for x, y in data[:3]:
        for i, (model, o) in enumerate(((reference, ref_opt), (ours, opt))):
            loss = loss_fn(model(x), y)
            loss.backward()
            for name, p in model.named_parameters():
                if name.endswith("mlp.down_proj.weight"):
                    p.grad = torch.full(p.shape, 0.01)  # replaced outright
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            o.step()
            o.zero_grad()
            losses[i].append((loss.item(), float(norm)))
    assert_close([l for l, _ in losses[1]], [l for l, _ in losses[0]])
    assert_close([n for _, n in losses[1]], [n for _, n in losses[0]], "gradient norm")
    for (name, mine), (_, theirs) in zip(ours.state_dict().items(),
                                         reference.state_dict().items()):
        assert torch.allclose(mine, theirs, rtol=1e-4, atol=1e-6), name


def test_state_dict_with_keep_vars_keeps_requires_grad(nvme_dir):
    """model.state_dict(keep_vars=True) gives torch's Parameters; "save only the trainable
    weights" filters them on requires_grad. Strata's values came back as plain tensors, and the
    filter saved nothing; they are Parameters with the model's requires_grad now."""
    reference = tied_llama(seed=5)
    for name, p in reference.named_parameters():
        p.requires_grad_("layers.1." in name)
    ours = copy.deepcopy(reference)
    st.offload(ours, nvme_path=nvme_dir, device="cpu", **SMALL)
    trainable = {k: v for k, v in reference.state_dict(keep_vars=True).items() if v.requires_grad}
    mine = {k: v for k, v in ours.state_dict(keep_vars=True).items() if v.requires_grad}
    assert trainable and sorted(mine) == sorted(trainable)
    for key, value in trainable.items():
        assert isinstance(mine[key], torch.nn.Parameter)
        assert torch.equal(mine[key].detach(), value.detach()), key
    plain = ours.state_dict()
    assert not any(isinstance(v, torch.nn.Parameter) for v in plain.values())


def test_a_bf16_resume_is_the_same_in_either_load_order(nvme_dir):
    """Resuming a bf16 model: the optimizer's state (with its fp32 masters) loaded before the
    model's weights had the weights' load overwrite the masters with their bf16 rounding, and
    the resumed run differed from the uninterrupted one; in torch the order does not matter.
    A weight loaded as its master rounds keeps the master."""
    def make():
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                   torch.nn.Linear(64, 8)).to(torch.bfloat16)

    def train(model, opt, batches_):
        return losses_of(model, opt, batches_,
                         lambda m, b: torch.nn.functional.mse_loss(m(b[0]).float(), b[1]))

    g = torch.Generator().manual_seed(1)
    batches_ = [(torch.randn(4, 32, generator=g).bfloat16(), torch.randn(4, 8, generator=g))
                for _ in range(6)]
    torch.manual_seed(0)
    first = make()
    for directory in "abc":
        os.makedirs(os.path.join(nvme_dir, directory))
    st.offload(first, nvme_path=os.path.join(nvme_dir, "a"), device="cpu", **SMALL)
    opt = st.AdamW(first.parameters(), lr=1e-2)
    train(first, opt, batches_[:3])
    checkpoint = {"model": first.state_dict(), "opt": opt.state_dict()}
    uninterrupted = train(first, opt, batches_[3:])
    for order, directory in (("model first", "b"), ("optimizer first", "c")):
        torch.manual_seed(5)
        again = make()
        st.offload(again, nvme_path=os.path.join(nvme_dir, directory), device="cpu", **SMALL)
        resumed = st.AdamW(again.parameters(), lr=1e-2)
        if order == "model first":
            again.load_state_dict(checkpoint["model"])
            resumed.load_state_dict(checkpoint["opt"])
        else:
            resumed.load_state_dict(checkpoint["opt"])
            again.load_state_dict(checkpoint["model"])
        assert train(again, resumed, batches_[3:]) == uninterrupted, order
    # A weight loaded that differs from its master's rounding is a new value: the master
    # takes it, as before.
    new = {k: v + 1 for k, v in checkpoint["model"].items()}
    again.load_state_dict(new)
    master = resumed.state_dict()["state"][0]["strata_master"]
    assert torch.equal(master.to(torch.bfloat16), new["0.weight"])


@pytest.mark.parametrize("edit", ["zeros_", "half"])
def test_an_edit_of_a_placeholder_is_refused_at_the_edit(nvme_dir, edit):
    """nn.init.zeros_ and model.half() operate on the placeholder, which goes nowhere (the value
    is in Strata): refused at the operation (until 2026-12-06 at the parameter's next use),
    leaving every parameter as it was."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    st.offload(model, nvme_path=nvme_dir, device="cpu", **SMALL)
    expected = "written outside .* by zero_" if edit == "zeros_" else "read outside .* by half"
    with pytest.raises(strata.StrataError, match=expected):
        torch.nn.init.zeros_(model[2].weight) if edit == "zeros_" else model.half()
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert model(torch.randn(2, 8)).dtype == torch.float32


def test_an_edit_outside_forward_is_refused_by_state_dict_save_and_close(nvme_dir, tmp_path):
    """An assigned .data goes nowhere: the value is in Strata. A forward refused it;
    state_dict(), save_full_state_dict(), parameter() and close() handed back the old value
    without a word."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    handle = st.offload(model, nvme_path=nvme_dir, device="cpu", **SMALL)
    model[2].weight.data = torch.zeros(4, 16)
    for call in (model.state_dict, lambda: handle.parameter(model[2].weight),
                 lambda: st.save_full_state_dict(model, tmp_path / "full.pt"), handle.close):
        with pytest.raises(strata.StrataError) as e:
            call()
        assert "outside its module's forward and backward" in e.value.message, e.value.message
    assert not (tmp_path / "full.pt").exists()
    handle.close(restore=False)


class _RenormedEmbedding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4, max_norm=1.0)
        self.head = torch.nn.Linear(4, 10)

    def forward(self, tokens):
        return self.head(self.emb(tokens))


def test_a_weight_changed_in_place_in_forward_is_the_weight_after(nvme_dir):
    """nn.Embedding(max_norm=...) renormalises the rows it looks up, in place, in forward: in
    torch the parameter itself changes and the optimizer steps from it. The change was
    dropped at the release, and the step started from the old master."""
    torch.manual_seed(0)
    model = _RenormedEmbedding()
    with torch.no_grad():
        model.emb.weight.mul_(3)  # every row's norm above 1
    reference, ref_opt, ours, opt, _ = pair(nvme_dir, model=model, lr=1e-2)
    batches_ = [(torch.tensor([[0, 1, 2, 3]]), torch.tensor([[4, 5, 6, 7]]))] * 3

    def loss_of(m, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten())

    assert_close(losses_of(ours, opt, batches_, loss_of),
                 losses_of(reference, ref_opt, batches_, loss_of))
    assert torch.allclose(ours.state_dict()["emb.weight"], reference.emb.weight.detach(),
                          rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("between", ["nothing", "a forward", "load_state_dict"])
def test_backward_of_a_graph_older_than_the_weights_raises_as_in_torch(nvme_dir, between):
    """A graph made before optimizer.step() (or a load) changed the weights it saved: torch's
    backward raises ("modified by an inplace operation"). Strata rebuilt the saved weights from
    the new values and gave a gradient of neither; with no forward in between, its error was
    the runtime's "outside a step". Both raise torch's words now, and training goes on."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    st.offload(model, nvme_path=nvme_dir, device="cpu", **SMALL)
    opt = st.AdamW(model.parameters(), lr=0.1)
    x, x2 = torch.randn(4, 8), torch.randn(4, 8)
    old = model(x).pow(2).mean()
    model(x2).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    if between == "a forward":
        model(x2)
    elif between == "load_state_dict":
        model(x2)
        model.load_state_dict(model.state_dict())
    with pytest.raises(RuntimeError) as e:
        old.backward()
    assert "one of the variables needed for gradient computation has been modified" in \
        str(e.value), str(e.value)
    # Nothing is left held: the model saves and trains.
    model.state_dict()
    model(x).pow(2).mean().backward()
    opt.step()


def test_an_adamw_made_before_offload_names_its_cause(nvme_dir):
    """A strata.torch.AdamW made over plain parameters that are offloaded after (and step()
    twice with no backward between, below) were refused as "no gradient: leave them out of the
    optimizer", the wrong cause. Each names its own now."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    os.makedirs(os.path.join(nvme_dir, "own"))
    early = st.AdamW(model.parameters(), lr=1e-2, nvme_path=os.path.join(nvme_dir, "own"))
    st.offload(model, nvme_path=nvme_dir, device="cpu", **SMALL)
    model(torch.randn(2, 8)).sum().backward()
    with pytest.raises(strata.StrataError, match="offloaded .* after this strata.torch.AdamW"):
        early.step()


def test_a_second_step_without_backward_names_its_cause(nvme_dir):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    st.offload(model, nvme_path=nvme_dir, device="cpu", **SMALL)
    opt = st.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    with pytest.raises(strata.StrataError, match="used by the previous step\\(\\) and discarded"):
        opt.step()


class _StashingLinear(torch.autograd.Function):
    """Keeps the weight on ctx (ctx.w = w.detach()) instead of ctx.save_for_backward(w): legal
    in torch, which does not release the weight's memory after the forward."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.w = w.detach()
        ctx.save_for_backward(x)
        return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g @ ctx.w, g.t() @ x


class _Stashing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(256, 256) / 16)

    def forward(self, x):
        return _StashingLinear.apply(x, self.weight)


class _ReturnsItsWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(256, 256) / 16)

    def forward(self, x):
        return self.weight.t()  # a view of the parameter as the output


class _UsesItsChildsOutput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _ReturnsItsWeight()

    def forward(self, x):
        return x @ self.inner(x)


def _stacked(block):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(block(), torch.nn.Tanh())
                                 for _ in range(6)], torch.nn.Linear(256, 4))


def test_views_of_a_weight_that_outlive_its_forward_keep_their_memory(nvme_dir):
    """A weight's view kept on an autograd Function's ctx, or returned as the module's output,
    pointed at memory Strata gave back after the forward: reused, it gave wrong gradients, and
    unmapped, a segmentation fault (an independent client, 2026-12-05). An output is now a copy;
    a kept view keeps the memory until the backward ends, with a RuntimeWarning naming
    save_for_backward; where the pool cannot hold them, the forward says so at once."""
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, 256, generator=g), torch.randn(4, 4, generator=g)) for _ in range(3)]
    def loss_of(m, batch):
        return torch.nn.functional.mse_loss(m(batch[0]), batch[1])

    for block, directory in ((_Stashing, "stash"), (_UsesItsChildsOutput, "out")):
        os.makedirs(os.path.join(nvme_dir, directory))
        reference, ref_opt, ours, opt, _ = pair(
            os.path.join(nvme_dir, directory), model=_stacked(block), lr=1e-3,
            offload_args=dict(pinned_budget_bytes=64 << 20, device_budget_bytes=8 << 20))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert_close(losses_of(ours, opt, data, loss_of),
                         losses_of(reference, ref_opt, data, loss_of))
        kept = [w for w in caught if "outlives its module's forward" in str(w.message)]
        assert bool(kept) == (block is _Stashing), [str(w.message) for w in caught]
    # A pool that cannot hold the kept views: a clear error in the forward, not a crash.
    tight = _stacked(_Stashing)
    os.makedirs(os.path.join(nvme_dir, "tight"))
    st.offload(tight, nvme_path=os.path.join(nvme_dir, "tight"), device="cpu",
               pinned_budget_bytes=2 << 20, device_budget_bytes=1 << 20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(strata.StrataError) as e:
            tight(data[0][0])
    assert e.value.name == "STRATA_E_PINNED_BUDGET"
    assert "ctx.save_for_backward(w)" in e.value.message, e.value.message
