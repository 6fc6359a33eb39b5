"""Activation offload (issue 22, point 3): the tensors autograd saves go into Strata (pinned,
spilled to NVMe under pressure) and come back byte for byte, so losses and gradients are
exactly those without it, and nothing is left behind once backward has used them."""
import copy
import gc
import time
import weakref

import pytest
import torch

import strata
import strata.torch as st
from conftest import DEVICE, paired_step
from tiny_llama import PRESETS, Llama, batches, corpus_bytes, loss_fn


def llama(seed=0, hidden=128, layers=2, preset="tinyllama-1.1b"):
    torch.manual_seed(seed)
    c = PRESETS[preset].scaled(hidden, layers, vocab_size=256, max_positions=128)
    return Llama(c)


def run(model, handle, opt, data):
    losses, grads = [], []
    for x, y in data:
        loss = loss_fn(model(x.to(DEVICE)), y.to(DEVICE))
        loss.backward()
        grads.append({n: handle.gradient(p) for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, grads


@pytest.mark.parametrize("home,preset", [("pinned", "tinyllama-1.1b"), ("nvme", "tinyllama-1.1b"),
                                         ("pinned", "mixtral-8x7b")])
def test_gradients_with_activations_offloaded_are_exactly_those_without(nvme_dir, home, preset):
    reference = llama(seed=7, preset=preset)
    ours = copy.deepcopy(reference)
    data = batches(corpus_bytes(), 3, batch=2, seq=96, seed=4)
    budgets = dict(nvme_capacity_bytes=256 << 20, pinned_budget_bytes=16 << 20)
    plain = st.offload(reference, nvme_path=nvme_dir, device=DEVICE, **budgets)
    offloaded = st.offload(ours, nvme_path=nvme_dir, device=DEVICE, activations=home, **budgets)
    expected = run(reference, plain, st.AdamW(reference.parameters(), lr=1e-3), data)
    got = run(ours, offloaded, st.AdamW(ours.parameters(), lr=1e-3), data)
    assert got[0] == expected[0]  # bit for bit
    for step, (g, e) in enumerate(zip(got[1], expected[1])):
        for name in e:
            assert torch.equal(g[name], e[name]), f"step {step}: gradient of {name}"
    acts = offloaded.activations
    assert acts.packed_bytes > 0 and acts.held_bytes == 0  # everything saved came back and went
    assert acts.shared_bytes > 0  # q, k and v saved one input: packed once
    stats = offloaded.runtime.stats()
    assert stats["pinned"]["kinds"]["activation_checkpoint"] == 0
    assert stats["nvme"]["kinds"]["activation_checkpoint"] == 0
    if home == "pinned":
        assert stats["nvme_bytes_written_by_kind"]["activation_checkpoint"] == 0


def test_activations_spill_to_nvme_under_a_small_pinned_budget_and_stay_exact(nvme_dir):
    reference = llama(seed=3, hidden=128, layers=3)
    ours = copy.deepcopy(reference)
    reference.to(DEVICE)
    data = batches(corpus_bytes(), 2, batch=4, seq=128, seed=1)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    handle = st.offload(ours, nvme_path=nvme_dir, device=DEVICE, activations="nvme",
                        nvme_capacity_bytes=512 << 20, pinned_budget_bytes=12 << 20)
    opt = st.AdamW(ours.parameters(), lr=1e-3)

    def moved():
        stats = handle.runtime.stats()
        return (stats["nvme_bytes_written_by_kind"]["activation_checkpoint"],
                stats["nvme_bytes_read_by_kind"]["activation_checkpoint"])

    per_step = []
    for x, y in data:
        before = moved()
        losses = paired_step(((reference, ref_opt), (ours, opt)), x, y)
        assert abs(losses[1] - losses[0]) <= 1e-5 * abs(losses[0])
        after = moved()
        per_step.append((after[0] - before[0], after[1] - before[1]))
    acts = handle.activations
    assert acts.peak_held_bytes > 12 << 20  # more saved than the pinned budget could hold
    written, read = moved()
    assert written > 0 and read > 0
    # The chunks unpack hints ahead keep the room their reads took until they are acquired:
    # before, they ranked first to go (tensors the recorded schedule never names) and were read
    # twice, 58 MB read back for 35 MB written. The first step, with no learned order of unpacks,
    # still hints chunks autograd unpacks after another (docs/scheduling.md), within this bound.
    assert read <= written + acts.shared_bytes, (read, written, acts.shared_bytes)
    # The second step hints by the first's order: no chunk read twice.
    assert acts.learned_hints > 0
    step_written, step_read = per_step[1]
    assert step_read <= step_written, per_step
    assert acts.reused_bytes == acts.shared_bytes  # each shared save from the kept copy
    assert acts.held_bytes == 0


@pytest.mark.parametrize("budget_kib", [1280, 2048, 2816, 3072])
def test_activations_kept_in_a_pinned_budget_too_small_fail_at_once(nvme_dir, budget_kib):
    """Kept in pinned memory, the saved activations stay in the pool until backward, beside the
    layer's parameters in use (computing in host memory): a pack, or the next layer's parameter,
    with no room left would wait for a release only its own layer can make, until the acquire's
    300 s timeout. Either fails at once instead, saying what to raise (1.25 and 2.75 MiB: the
    parameter's acquire, 2 and 3 MiB: the pack)."""
    budget = budget_kib << 10
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(3)
                                  for m in (torch.nn.Linear(256, 256), torch.nn.GELU())])
    handle = st.offload(model, nvme_path=nvme_dir, device="cpu", activations="pinned",
                        pinned_budget_bytes=budget)
    start = time.monotonic()
    with pytest.raises((strata.StrataError, RuntimeError),
                       match="activations='pinned'.*raise pinned_budget_bytes"):
        model(torch.randn(512, 256)).pow(2).sum().backward()
    assert time.monotonic() - start < 60
    handle.close()


def test_a_bad_activations_home_is_refused(nvme_dir):
    with pytest.raises(strata.StrataError, match="activations"):
        st.offload(llama(hidden=64, layers=1), nvme_path=nvme_dir, device=DEVICE,
                   activations="disk")


def test_a_permuted_tensor_comes_back_in_its_own_strides_and_a_sliced_one_stays(nvme_dir):
    handle = st.offload(llama(hidden=64, layers=1), nvme_path=nvme_dir, device=DEVICE,
                        activations="pinned", nvme_capacity_bytes=64 << 20,
                        pinned_budget_bytes=16 << 20)
    acts = handle.activations
    permuted = torch.randn(4, 64, 128, device=DEVICE).transpose(1, 2)  # q or k in attention
    assert not permuted.is_contiguous() and acts.wanted(permuted)
    back = acts.unpack(acts.pack(permuted))
    assert back.stride() == permuted.stride() and torch.equal(back, permuted)
    assert not acts.wanted(torch.randn(64, 256, device=DEVICE)[:, :128])  # gaps: its bytes are not its values
    assert not acts.wanted(torch.randn(1, 256, device=DEVICE).expand(512, 256))  # overlapping


def test_a_saved_tensor_larger_than_the_pinned_budget_moves_in_chunks(nvme_dir):
    handle = st.offload(llama(hidden=64, layers=1), nvme_path=nvme_dir, device=DEVICE,
                        activations="nvme", nvme_capacity_bytes=128 << 20,
                        pinned_budget_bytes=16 << 20)
    acts = handle.activations
    scores = torch.randn(4, 1024, 1536, device=DEVICE)  # 24 MiB, an attention score matrix
    saved = acts.pack(scores)
    assert len(saved.chunks) == -(-scores.numel() * 4 // acts.chunk_bytes) > 1
    assert max(c.nbytes for c in saved.chunks) <= 2 << 20  # an eighth of the budget
    assert torch.equal(acts.unpack(saved), scores)
    del saved
    assert handle.runtime.stats()["nvme"]["kinds"]["activation_checkpoint"] == 0


def test_an_unpack_hints_the_tensor_packed_before_only_as_far_as_the_pool_has_room(nvme_dir):
    """Unpacking a tensor hints the one packed before it, its first chunks up to an eighth of the
    pool: hinting a whole large tensor read chunks the pool could not keep beside the ones being
    unpacked, and they were evicted and read again (a 16 MiB budget read 1.5-1.7x what it wrote)."""
    handle = st.offload(llama(hidden=64, layers=1), nvme_path=nvme_dir, device=DEVICE,
                        activations="nvme", nvme_capacity_bytes=256 << 20,
                        pinned_budget_bytes=16 << 20)
    acts = handle.activations
    big = torch.randn(6 << 20, device=DEVICE)  # 24 MiB: 12 chunks, more than the pool holds
    small = torch.randn(1 << 18, device=DEVICE)  # 1 MiB
    saved_big, saved_small = acts.pack(big), acts.pack(small)
    handle.runtime.sync()

    def activation_reads():
        return handle.runtime.stats()["nvme_bytes_read_by_kind"]["activation_checkpoint"]

    before = activation_reads()
    assert torch.equal(acts.unpack(saved_small), small)  # hints big's first chunks
    deadline, last = time.monotonic() + 5, -1
    while time.monotonic() < deadline:  # until the hinted reads have landed
        time.sleep(0.2)
        now = activation_reads()
        if now == last:
            break
        last = now
    room = max(acts.pinned_pool_bytes // 8, acts.chunk_bytes)
    assert 0 < last - before <= room + small.numel() * 4, (last - before, room)
    assert torch.equal(acts.unpack(saved_big), big)
    del saved_big, saved_small
    handle.close()


def test_an_unpack_hints_the_tensor_the_last_pass_unpacked_next(nvme_dir, monkeypatch):
    """Autograd unpacks a layer's saves in an order of its own (several pairs come back
    swapped), so the tensor packed before is not always the next: a pass of as many packs
    as the last one hints by that pass's order; a pass of other shapes by packing order."""
    handle = st.offload(llama(hidden=64, layers=1), nvme_path=nvme_dir, device=DEVICE,
                        activations="nvme", nvme_capacity_bytes=256 << 20,
                        pinned_budget_bytes=16 << 20)
    acts = handle.activations
    hinted = []
    monkeypatch.setattr(strata.Tensor, "prefetch",
                        lambda tensor, tier="device": hinted.append(tensor.name))

    def one_pass(count, order):
        values = [torch.full((1 << 16,), float(k), device=DEVICE) for k in range(count)]
        saved = [acts.pack(v) for v in values]
        first = saved[0].saved_bytes.index
        hints = []
        for k in order:
            hinted.clear()
            assert torch.equal(acts.unpack(saved[k]), values[k])
            hints.append(sorted({int(name.split(".")[1]) - first for name in hinted}))
        return hints

    # The first pass: packing order (each hints the one packed before it).
    assert one_pass(4, [3, 1, 2, 0]) == [[2], [0], [1], []]
    assert acts.learned_hints == 0
    # The same shapes: the last pass's order, several tensors ahead within the hint room.
    assert one_pass(4, [3, 1, 2, 0]) == [[0, 1, 2], [0, 2], [0], []]
    assert acts.learned_hints == 4
    # Other shapes (5 packs, not 4): packing order again.
    assert one_pass(5, [4, 3, 2, 1, 0]) == [[3], [2], [1], [0], []]
    assert acts.learned_hints == 4
    handle.close()


@pytest.mark.parametrize("home", ["nvme", "pinned", None])
def test_a_graph_dropped_without_backward_frees_what_it_saved(nvme_dir, home):
    """An evaluation forward with grad on, a forward that raises half-way and a graph kept by
    retain_graph then dropped: their saved tensors go with the graph. The hook once handed
    small tensors back to torch as they were, which ties an operation's saved output to its own
    grad_fn in a cycle the garbage collector cannot free: every such graph stayed, with what
    Strata held for it, until the pinned budget or the NVMe space ran out."""
    model = llama(seed=5, hidden=128, layers=2)
    handle = st.offload(model, nvme_path=nvme_dir, device=DEVICE, activations=home,
                        nvme_capacity_bytes=256 << 20, pinned_budget_bytes=64 << 20)
    x, y = batches(corpus_bytes(), 1, batch=4, seq=128, seed=2)[0]
    x, y = x.to(DEVICE), y.to(DEVICE)
    probe = {}

    def keep_one(module, inputs, output):  # a tensor of the graph, to see whether it is freed
        probe["ref"] = weakref.ref(output)
        if probe.get("raise"):
            raise KeyError("half-way")

    model.layers[0].mlp.gate_proj.register_forward_hook(keep_one)

    def evaluate():
        loss_fn(model(x), y).item()

    def raise_half_way():
        probe["raise"] = True
        try:
            with pytest.raises(KeyError):
                model(x)
        finally:
            probe["raise"] = False

    def retain_then_drop():
        loss_fn(model(x), y).backward(retain_graph=True)

    for habit in (evaluate, raise_half_way, retain_then_drop):
        habit()
        gc.collect()
        assert probe["ref"]() is None, habit.__name__
        if home is not None:
            assert handle.activations.held_bytes == 0, habit.__name__
            assert handle.runtime.stats()["pinned"]["kinds"]["activation_checkpoint"] == 0
    loss_fn(model(x), y).backward()  # and training goes on
    handle.close()


@pytest.mark.parametrize("home", ["nvme", None])
def test_a_saved_tensor_written_in_place_before_backward_raises_as_in_torch(nvme_dir, home):
    """Torch skips its check of saved tensors' versions for whatever a saved-tensors hook packs;
    strata.torch's hook makes it: a write in place to a tensor saved for backward raises
    torch's RuntimeError at backward instead of giving a gradient of other values."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    handle = st.offload(model, nvme_path=nvme_dir, device=DEVICE, activations=home,
                        nvme_capacity_bytes=64 << 20, pinned_budget_bytes=16 << 20)
    kept = {}

    def write_after_save(module, inputs, output):
        kept["input"] = inputs[0]  # alive until backward, as a user's tensor would be
        with torch.no_grad():
            inputs[0].mul_(2)  # the second Linear saved it as its input

    hook = model[1].register_forward_hook(write_after_save)
    x = torch.randn(512, 256, device=DEVICE)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        model(x).pow(2).sum().backward()
    hook.remove()
    kept.clear()
    gc.collect()
    model(x).pow(2).sum().backward()  # without the write: no error
    handle.close()


def test_a_tensor_saved_again_shares_the_bytes_packed_the_first_time(nvme_dir):
    handle = st.offload(llama(hidden=64, layers=1), nvme_path=nvme_dir, device=DEVICE,
                        activations="pinned", nvme_capacity_bytes=64 << 20,
                        pinned_budget_bytes=16 << 20)
    acts = handle.activations
    x = torch.randn(2, 128, 256, device=DEVICE)  # the input of q, k and v's projections
    nbytes = x.numel() * 4
    first, second = acts.pack(x), acts.pack(x)
    flat = acts.pack(x.view(256, 256))  # the 2-D view matmul saves: the same bytes
    assert acts.packed_bytes == nbytes and acts.shared_bytes == 2 * nbytes
    assert acts.held_bytes == nbytes and acts.saves == 3
    a, b, c = acts.unpack(first), acts.unpack(second), acts.unpack(flat)
    assert torch.equal(a, x) and torch.equal(b, x) and torch.equal(c, x.view(256, 256))
    # Read once: the first unpack's copy serves the two saves still to unpack, then goes.
    assert acts.reused_bytes == 2 * nbytes
    assert first.saved_bytes.device_copy is None
    x.add_(1)  # an in-place write between saves: the next save is new values
    after = acts.pack(x)
    assert acts.packed_bytes == 2 * nbytes
    assert torch.equal(acts.unpack(after), x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        acts.unpack(first)  # as torch: what the first save holds was written over since
    del first, second, flat, a, b, c
    assert acts.held_bytes == nbytes  # the first values went with their last save
    del after
    assert acts.held_bytes == 0
    assert handle.runtime.stats()["pinned"]["kinds"]["activation_checkpoint"] == 0


def test_the_same_address_in_a_new_storage_is_not_taken_for_the_old_values(nvme_dir):
    np = pytest.importorskip("numpy")
    if DEVICE.type != "cpu":
        pytest.skip("numpy memory is host memory")
    handle = st.offload(llama(hidden=64, layers=1), nvme_path=nvme_dir, device=DEVICE,
                        activations="pinned", nvme_capacity_bytes=64 << 20,
                        pinned_budget_bytes=16 << 20)
    acts = handle.activations
    memory = np.zeros(1 << 16, dtype=np.float32)
    old = torch.from_numpy(memory)  # version 0, as a fresh tensor at a reused address is
    saved_old = acts.pack(old)
    del old  # its storage goes; the address now holds other values
    memory[:] = 5
    new = torch.from_numpy(memory)
    saved_new = acts.pack(new)
    assert acts.shared_bytes == 0 and acts.packed_bytes == 2 * new.numel() * 4
    assert torch.equal(acts.unpack(saved_new), new)
    assert not acts.unpack(saved_old).any()


def test_a_step_saves_each_attention_score_once_and_every_layer_alike(nvme_dir):
    # docs/planner.md, "Activations measured": softmax and the product with v save one tensor,
    # which offload then holds once (4 bytes per score in fp32), whatever the sequence.
    if DEVICE.type != "cpu":
        pytest.skip("the measurement runs on the CPU")
    import argparse

    import lora_offload

    args = argparse.Namespace(hidden=128, layers=2, rank=4, seq=64, batch=1, method="full",
                              dtype="fp32", pinned_mib=64, nvme=nvme_dir, nvme_capacity_mib=256)
    heads = lora_offload.model_config(args).num_attention_heads
    short, long = (lora_offload.saved_bytes_of_one_step(args, s) for s in (64, 128))
    assert len(short) == 2 and short[0] == short[1] and long[0] == long[1]
    # bytes(s) = c + a*s + 4*heads*s^2: twice the sequence doubles a*s and quadruples the scores;
    # c is a few 0-dim tensors (the 1/sqrt(d) divisor: 8 bytes a layer under torch 1.13)
    scores_grown = long[0] - 2 * short[0]
    assert abs(scores_grown - 4 * heads * (128 * 128 - 2 * 64 * 64)) <= 64
