"""pytest set-up for the Python bindings: the package and the examples on sys.path, and a scratch
directory for swap files (under $STRATA_TEST_DIR when ctest runs us, else pytest's tmp_path)."""
import os
import sys
import tempfile

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
for path in (os.path.join(ROOT, "bindings", "python"),
             os.path.join(ROOT, "bindings", "python", "examples")):
    if path not in sys.path:
        sys.path.insert(0, path)


# Where the tests that train a model compute: the CPU (CI's machines have no GPU), or the GPU
# with STRATA_TEST_DEVICE=cuda (tests/run-gpu.sh runs them so a second time).
DEVICE = torch.device(os.environ.get("STRATA_TEST_DEVICE", "cpu"))
if DEVICE.type == "cuda" or torch.cuda.is_available():  # test_torch.py takes the GPU it finds
    # Gradients compared bit for bit need deterministic kernels: on the GPU an embedding's
    # backward adds with atomics, in whatever order its threads run, unless told otherwise.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


@pytest.fixture
def nvme_dir(tmp_path):
    base = os.environ.get("STRATA_TEST_DIR")
    if base:
        os.makedirs(base, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="py-", dir=base) as d:
            yield d
    else:
        yield str(tmp_path)


# Small tiers: enough for the test models, far below a real machine's.
SMALL = dict(nvme_capacity_bytes=256 << 20, pinned_budget_bytes=64 << 20,
             device_budget_bytes=64 << 20)


def paired_step(pairs, x, y):
    """One training step of each (model, optimizer) pair on the same batch, in order (the
    reference first), each on its model's device; returns their losses. Tests compare Strata
    with plain torch this way."""
    from tiny_llama import loss_fn

    losses = []
    for model, optimizer in pairs:
        device = next(model.parameters()).device
        loss = loss_fn(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
