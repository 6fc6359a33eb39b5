"""The strata package over the C API: tensors, zero-copy views, StrataError."""
import numpy as np
import pytest

import strata
from conftest import SMALL


@pytest.fixture
def rt(nvme_dir):
    with strata.Runtime(nvme_path=nvme_dir, **SMALL) as runtime:
        yield runtime


def test_write_then_read_returns_the_bytes(rt):
    t = rt.register("w", 1000 * 4, dtype="f32")
    data = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    t.write(data)
    assert np.array_equal(t.read(), data)


@pytest.mark.parametrize("tier", ["pinned", "device"])
def test_numpy_view_is_zero_copy_and_dirty_release_keeps_the_change(rt, tier):
    t = rt.register("w", 256 * 4)
    t.write(np.zeros(256, dtype=np.float32))
    with t.acquire(tier) as a:
        view = a.numpy()
        assert view.ctypes.data == a.data  # the same memory, not a copy
        view[:] = 7.0
        a.mark_dirty()
    rt.sync()
    assert np.all(t.read() == 7.0)


def test_errors_carry_the_code_and_the_library_message(rt):
    t = rt.register("w", 64)
    with pytest.raises(strata.StrataError) as e:
        t.release()
    assert e.value.code == -3 and e.value.name == "STRATA_E_STATE"
    assert "not acquired" in e.value.message and "'w'" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        t.read()  # never written
    assert e.value.code == -3 and "no contents" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        t.write(np.zeros(32, dtype=np.float32))  # 128 bytes into a 64-byte tensor
    assert e.value.name == "STRATA_E_INVALID" and "outside tensor" in e.value.message
    with pytest.raises(strata.StrataError) as e:
        rt.register("big", 1 << 62)
    assert e.value.code == -1


def test_a_failed_creation_raises_with_the_reason(tmp_path):
    with pytest.raises(strata.StrataError) as e:
        strata.Runtime(nvme_path=str(tmp_path / "does-not-exist"))
    assert e.value.code == -1 and "does-not-exist" in e.value.message


def test_a_closed_runtime_refuses_calls(nvme_dir):
    rt = strata.Runtime(nvme_path=nvme_dir, **SMALL)
    t = rt.register("w", 64)
    rt.close()
    with pytest.raises(strata.StrataError) as e:
        t.write(np.zeros(16, dtype=np.float32))
    assert e.value.name == "STRATA_E_BAD_HANDLE"


def test_config_refuses_unknown_fields_and_names():
    with pytest.raises(strata.StrataError) as e:
        strata.Config(pinned_budget=1)
    assert "pinned_budget_bytes" in e.value.message  # the suggestion
    with pytest.raises(strata.StrataError):
        strata.Config(io_engine="aio")


def test_stats_count_the_tiers(rt):
    t = rt.register("w", 1 << 20)
    t.write(np.zeros(1 << 18, dtype=np.float32))
    rt.sync()
    s = rt.stats()
    assert s["nvme_bytes_written"] >= 1 << 20
    assert s["pinned"]["peak_in_use_bytes"] >= 1 << 20
