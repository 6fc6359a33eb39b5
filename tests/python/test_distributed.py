"""Two ranks under torch.distributed (gloo, CPU): each rank runs its own runtime with its own
swap file over its own shard of the batch; gradients are averaged by torch.distributed (Strata
has no collectives). After a few steps both ranks hold the same weights, equal to one process
training on the whole batch."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import strata.torch as st
from conftest import SMALL
from tiny_llama import PRESETS, Llama, batches, corpus_bytes, loss_fn

STEPS = 3
WORLD = 2


def model():
    torch.manual_seed(0)
    m = Llama(PRESETS["tinyllama-1.1b"].scaled(32, 1, vocab_size=256, max_positions=32))
    m.lm_head.weight = m.embed_tokens.weight  # tied, as in test_torch_habits.py
    return m


def data():
    return batches(corpus_bytes(), STEPS, batch=4, seq=16, seed=2)


def rank_main(rank, port, nvme_template, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        m = model()
        offloaded = st.offload(m, nvme_path=nvme_template, device="cpu", **SMALL)
        swap_files = [f for f in os.listdir(nvme_template.format(rank=rank))
                      if f.endswith(".swap")]
        opt = st.AdamW(m.parameters(), lr=3e-3)
        for x, y in data():
            shard = slice(rank * 2, rank * 2 + 2)
            loss_fn(m(x[shard]), y[shard]).backward()
            opt.step()
            opt.zero_grad()
        torch.save({"weights": offloaded.state_dict(), "swap_files": swap_files,
                    "pid": os.getpid()}, os.path.join(out_dir, f"rank{rank}.pt"))
        offloaded.close()
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is unavailable")
def test_two_gloo_ranks_train_like_one_process(nvme_dir, tmp_path):
    for r in range(WORLD):
        os.makedirs(os.path.join(nvme_dir, f"rank{r}"))
    template = os.path.join(nvme_dir, "rank{rank}")
    mp.spawn(rank_main, args=(free_port(), template, str(tmp_path)), nprocs=WORLD, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for r in results:
        assert len(r["swap_files"]) == 1  # each rank: its own runtime, its own swap file
    assert results[0]["pid"] != results[1]["pid"]

    reference = model()
    opt = torch.optim.AdamW(reference.parameters(), lr=3e-3)
    for x, y in data():
        loss_fn(reference(x), y).backward()
        opt.step()
        opt.zero_grad()
    expected = reference.state_dict()
    for r in results:
        for name, value in r["weights"].items():
            torch.testing.assert_close(value, expected[name], rtol=1e-4, atol=1e-6)
    for name in expected:
        assert torch.equal(results[0]["weights"][name], results[1]["weights"][name])
