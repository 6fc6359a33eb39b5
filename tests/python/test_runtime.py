"""The strata package over the C API: tensors, zero-copy views, StrataError."""
import time

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


def test_config_refuses_integers_its_c_field_would_wrap_and_names_the_layout(nvme_dir):
    """ctypes would store 2**32 + 32 in a uint32 as 32, -1 as 4294967295: refused instead."""
    for field, value in (("queue_depth", 2**32 + 32), ("queue_depth", -1),
                         ("block_size", 2**32 + 4096), ("numa_node", 2**32 - 1),
                         ("stream_chunk_bytes", -1), ("pinned_budget_bytes", 2**64)):
        with pytest.raises(strata.StrataError) as e:
            strata.Config(**{field: value})
        assert e.value.name == "STRATA_E_INVALID" and field in e.value.message, (field, value)
    c = strata.Config(stream_chunk_bytes=strata._lib.STREAMING_OFF, numa_node=-1,
                      nvme_layout="file-per-tensor")
    assert c.stream_chunk_bytes == (1 << 64) - 1
    assert strata.Config().nvme_layout == "extents"
    with pytest.raises(strata.StrataError):
        strata.Config(nvme_layout=1)  # a name, as every enum


def test_a_host_budget_is_refused_since_nothing_would_enforce_it(nvme_dir):
    with pytest.raises(strata.StrataError) as e:
        strata.Runtime(nvme_path=nvme_dir, host_budget_bytes=1, **SMALL)
    assert e.value.name == "STRATA_E_UNSUPPORTED" and "pinned" in e.value.message


def test_reads_and_writes_never_reinterpret_or_drop_bytes(rt):
    t = rt.register("w", 16, dtype="f32")
    with pytest.raises(strata.StrataError) as e:
        t.write(np.array([1.0, 2.0]))  # float64: its bytes would read back as other floats
    assert e.value.name == "STRATA_E_INVALID" and "float64" in e.value.message
    t.write(np.arange(4, dtype=np.float32))
    for kwargs in ({"nbytes": 6}, {"offset": 2}):
        with pytest.raises(strata.StrataError) as e:
            t.read(**kwargs)  # not whole elements: fewer bytes than asked, before
        assert e.value.name == "STRATA_E_INVALID"
    raw = np.empty(6, dtype=np.uint8)
    t.read(out=raw, offset=2)
    assert raw.tobytes() == np.arange(4, dtype=np.float32).tobytes()[2:8]
    with pytest.raises(strata.StrataError):
        t.read(out=np.empty(2, dtype=np.float64))
    odd = rt.register("odd", 4002, dtype="f32")
    odd.write(np.zeros(4002, dtype=np.uint8))  # raw bytes: accepted
    with pytest.raises(strata.StrataError):
        odd.read()


def test_stats_count_the_tiers(rt):
    t = rt.register("w", 1 << 20)
    t.write(np.zeros(1 << 18, dtype=np.float32))
    rt.sync()
    s = rt.stats()
    assert s["nvme_bytes_written"] >= 1 << 20
    assert s["pinned"]["peak_in_use_bytes"] >= 1 << 20


def _two_that_fit_one_at_a_time(rt):
    """Two written tensors of 1.5 MiB beside a 2 MiB pinned pool: either fits, not both."""
    held, wanted = (rt.register(name, 1536 << 10) for name in ("held", "wanted"))
    for t in (held, wanted):
        t.write(np.full(1536 << 8, 3.0, dtype=np.float32))
    rt.sync()
    return held, wanted


CTRL_C_SCRIPT = r"""
import sys, time
import numpy as np
import strata
from test_runtime import _two_that_fit_one_at_a_time
operation = sys.argv[2]
with strata.Runtime(nvme_path=sys.argv[1], nvme_capacity_bytes=64 << 20,
                    pinned_budget_bytes=2 << 20, device_budget_bytes=1 << 20) as rt:
    held, wanted = _two_that_fit_one_at_a_time(rt)
    holding = held.acquire("pinned")
    if operation == "sync":  # the write-back of a new `held` is stalled (STRATA_FAULTS)
        holding.release()
        held.write(np.full(1536 << 8, 4.0, dtype=np.float32))
    print("waiting", flush=True)
    start = time.monotonic()
    try:
        # Only this thread's release could end the wait (a stalled write-back, for sync).
        if operation == "acquire":
            wanted.acquire("pinned")
        elif operation == "write":
            wanted.write(np.full(1536 << 8, 5.0, dtype=np.float32))
        elif operation == "read":
            wanted.read()
        else:
            rt.sync()
    except KeyboardInterrupt:
        waited = time.monotonic() - start
        if operation == "acquire":
            try:
                wanted.release()
            except strata.StrataError as e:
                print("not acquired", e.name, flush=True)
        if operation != "sync":
            holding.release()
        with wanted.acquire("pinned") as a:
            print("then acquired", float(a.numpy()[0]), flush=True)
        print(f"interrupted after {waited:.2f} s", flush=True)
"""


@pytest.mark.parametrize("operation", ["acquire", "write", "read", "sync"])
def test_ctrl_c_interrupts_a_call_that_waits_for_the_callers_own_release(nvme_dir, operation):
    """Python hears SIGINT only between C calls: one 300 s strata_acquire (or tensor write or
    read, which pass through the same pinned room) waiting for a release that only its own
    thread could make left Ctrl-C unheard for 300 s, as did a sync waiting on a stalled
    write-back. The binding waits in slices (the calls' _timeout forms): KeyboardInterrupt comes
    within a slice, nothing acquired or copied (the tensor still holds 3.0, not the write's
    5.0), and the runtime goes on."""
    import os
    import signal
    import subprocess
    import sys
    from conftest import ROOT
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, "bindings", "python"), os.path.dirname(__file__),
         os.environ.get("PYTHONPATH", "")]))
    if operation == "sync":
        env["STRATA_FAULTS"] = "write:stall:ms=4000"
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT, nvme_dir, operation], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    if operation == "acquire":
        assert lines.pop(0) == "not acquired STRATA_E_STATE", out
    assert lines[0] == "then acquired 3.0", out
    # Heard within a slice, not at the end of the wait (300 s; the stall's 4 s for sync).
    assert float(lines[1].split()[2]) < (2.0 if operation == "sync" else 5.0), out


def test_an_acquire_that_waits_out_its_bound_names_the_whole_wait(nvme_dir, monkeypatch):
    from strata import runtime
    monkeypatch.setattr(runtime, "WAIT_TIMEOUT_S", 0.35)
    with strata.Runtime(nvme_path=nvme_dir, nvme_capacity_bytes=64 << 20,
                        pinned_budget_bytes=2 << 20, device_budget_bytes=1 << 20) as rt:
        held, wanted = _two_that_fit_one_at_a_time(rt)
        with held.acquire("pinned"):
            start = time.monotonic()
            with pytest.raises(strata.StrataError) as e:
                wanted.acquire("pinned")
            assert time.monotonic() - start >= 0.35
        assert e.value.name == "STRATA_E_TIMEOUT"
        assert "'wanted'" in e.value.message and e.value.message.endswith(
            "did not finish in 0.35 s"), e.value.message
        with wanted.acquire("pinned") as a:  # released: now it fits
            assert a.numpy()[0] == 3.0


def test_a_write_that_waits_out_its_bound_names_the_whole_wait_and_writes_nothing(
        nvme_dir, monkeypatch):
    from strata import runtime
    monkeypatch.setattr(runtime, "WAIT_TIMEOUT_S", 0.35)
    with strata.Runtime(nvme_path=nvme_dir, nvme_capacity_bytes=64 << 20,
                        pinned_budget_bytes=2 << 20, device_budget_bytes=1 << 20) as rt:
        held, wanted = _two_that_fit_one_at_a_time(rt)
        with held.acquire("pinned"):
            with pytest.raises(strata.StrataError) as e:
                wanted.write(np.full(1536 << 8, 5.0, dtype=np.float32))
        assert e.value.name == "STRATA_E_TIMEOUT"
        assert "'wanted'" in e.value.message and e.value.message.endswith(
            "did not finish in 0.35 s"), e.value.message
        assert (wanted.read() == 3.0).all()
