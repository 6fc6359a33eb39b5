"""pytest set-up for the Python bindings: the package and the examples on sys.path, and a scratch
directory for swap files (under $STRATA_TEST_DIR when ctest runs us, else pytest's tmp_path)."""
import os
import sys
import tempfile

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
for path in (os.path.join(ROOT, "bindings", "python"),
             os.path.join(ROOT, "bindings", "python", "examples")):
    if path not in sys.path:
        sys.path.insert(0, path)


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
    reference first); returns their losses. Tests compare Strata with plain torch this way."""
    from tiny_llama import loss_fn

    losses = []
    for model, optimizer in pairs:
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
