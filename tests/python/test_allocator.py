"""strata.torch.use_strata_allocator: refuses cleanly where torch cannot take it; installs it where
it can (torch >= 2.0 with a GPU), checked in a fresh process since it must precede CUDA use."""
import os
import subprocess
import sys

import pytest
import torch

import strata
import strata.torch as st
from conftest import ROOT

REASON = st.allocator_support()


@pytest.mark.skipif(REASON is None, reason="this torch supports the pluggable allocator")
def test_refuses_with_strata_error_where_unsupported():
    with pytest.raises(strata.StrataError) as e:
        st.use_strata_allocator()
    assert e.value.name == "STRATA_E_UNSUPPORTED"
    assert REASON in e.value.message
    # Nothing changed: torch still works as before.
    assert torch.ones(2).sum().item() == 2.0


@pytest.mark.skipif(REASON is not None, reason=f"unsupported here: {REASON}")
def test_torch_cuda_tensors_come_from_strata(nvme_dir):
    script = f"""
import torch, strata, strata.torch as st
rt = strata.Runtime(nvme_path={nvme_dir!r}, device_backend="cuda", nvme_capacity_bytes=64 << 20,
                    device_budget_bytes=256 << 20)
st.use_strata_allocator()
x = torch.ones(1 << 20, device="cuda")
before = rt.stats()["device"]["in_use_bytes"]
y = (x * 2).sum()
assert y.item() == 2 * (1 << 20)
assert before >= 4 << 20, before
del x
print("ok", before)
"""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "bindings", "python"))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ok" in out.stdout
