"""Property test of the DeepSpeed-style config parser (issue 8), in the manner of a fuzzer.

strata.deepspeed.from_deepspeed takes whatever dict a user's JSON file held. For thousands of
random dicts - valid configs with one or more keys mutated, and dicts built from random keys and
values of every JSON type (and a few that JSON cannot hold) - it must either return a mapping
whose config strata.Config accepts, or raise DeepSpeedConfigError (a StrataError with code
STRATA_E_INVALID). Any other exception (TypeError, KeyError, ...) is a failure, reported with the
dict that caused it. The generator is seeded: a failure reproduces exactly.

libFuzzer cannot drive Python, so this is the DeepSpeed side of tests/fuzz (docs/reliability.md).
"""
import copy
import random
import warnings

import pytest

from strata.deepspeed import DeepSpeedConfigError, from_deepspeed
from strata.errors import StrataError

ITERATIONS = 4000
NVME = "/mnt/nvme"

VALID = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                              "weight_decay": 0.1}},
    "zero_optimization": {
        "stage": 3, "sub_group_size": 1e8, "overlap_comm": True,
        "offload_param": {"device": "nvme", "nvme_path": NVME, "pin_memory": True,
                          "buffer_count": 4, "buffer_size": 1e7, "max_in_cpu": 1e9},
        "offload_optimizer": {"device": "nvme", "nvme_path": NVME, "buffer_count": 2,
                              "pin_memory": True, "fast_init": False, "ratio": 1,
                              "pipeline_read": True},
    },
    "aio": {"block_size": 262144, "queue_depth": 16, "thread_count": 2,
            "intra_op_parallelism": 2, "single_submit": False, "overlap_events": True,
            "use_gds": False},
    "strata": {"device_backend": "emulated", "verify_checksums": 1},
}

# Every key the parser knows, so that random dicts hit real branches, plus near misses.
KEYS = sorted({
    "zero_optimization", "aio", "optimizer", "gradient_clipping", "fp16", "bf16", "strata",
    "stage", "offload_param", "offload_optimizer", "sub_group_size", "device", "nvme_path",
    "pin_memory", "buffer_count", "buffer_size", "max_in_cpu", "fast_init", "ratio", "pipeline",
    "pipeline_read", "pipeline_write", "block_size", "queue_depth", "thread_count",
    "intra_op_parallelism", "single_submit", "overlap_events", "use_gds", "type", "params", "lr",
    "betas", "eps", "weight_decay", "adam_w_mode", "bias_correction", "torch_adam", "amsgrad",
    "enabled", "train_batch_size", "overlap_comm", "pinned_budget_bytes", "io_engine",
    "device_backend", "policy", "queue_depht", "offload_parm", "", "stage3",
})


def random_scalar(rng):
    return rng.choice([
        0, 1, -1, 3, 4096, 262144, 2**40, 2**64, -2**63, 1e8, 0.5, -0.0, 1e308, float("inf"),
        float("nan"), True, False, None, "", "nvme", "cpu", "none", "AdamW", "adam", "sgd",
        "uring", "emulated", "1e8", "4096", NVME, "/other", "é\u0000x", b"bytes",
    ])


def random_value(rng, depth=0):
    kind = rng.random()
    if depth < 3 and kind < 0.25:
        return random_dict(rng, depth + 1)
    if depth < 3 and kind < 0.35:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind < 0.38:
        return (random_scalar(rng), random_scalar(rng))  # not JSON, but a caller's dict may hold it
    if kind < 0.40:
        return {random_scalar(rng), "x"} if rng.random() < 0.5 else object()
    return random_scalar(rng)


def random_key(rng):
    r = rng.random()
    if r < 0.85:
        return rng.choice(KEYS)
    if r < 0.95:
        return rng.choice(KEYS) + rng.choice(["_", "s", "X"])
    return rng.choice([0, 1.5, None, True, ("t",)])  # non-string keys


def random_dict(rng, depth=0):
    return {random_key(rng): random_value(rng, depth) for _ in range(rng.randrange(6))}


def mutate(rng, config):
    """A copy of config with 1-3 random edits somewhere inside it."""
    out = copy.deepcopy(config)
    for _ in range(rng.randrange(1, 4)):
        node = out
        while isinstance(node, dict) and node and rng.random() < 0.6:
            key = rng.choice(list(node))
            if not isinstance(node[key], dict):
                break
            node = node[key]
        if not isinstance(node, dict):
            continue
        action = rng.random()
        if action < 0.5 and node:
            node[rng.choice(list(node))] = random_value(rng, 2)
        elif action < 0.7 and node:
            del node[rng.choice(list(node))]
        else:
            node[random_key(rng)] = random_value(rng, 2)
    return out


def check_one(ds):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mapped = from_deepspeed(ds)
    except DeepSpeedConfigError as e:
        assert isinstance(e, StrataError) and e.problems, ds
        assert all(isinstance(p, str) and p for p in e.problems), ds
        return False
    except Exception as e:  # noqa: BLE001 - the property under test: nothing else escapes
        pytest.fail(f"from_deepspeed raised {type(e).__name__}: {e}\n  for {ds!r}")
    # An accepted config is one strata.Config holds: every field set, the struct buildable.
    mapped.config.to_struct()
    assert mapped.param_home in ("nvme", "pinned", "device")
    if mapped.config.block_size % 4096:
        pytest.fail(f"accepted block_size {mapped.config.block_size} for {ds!r}")
    return True


def test_the_valid_config_is_accepted():
    assert check_one(copy.deepcopy(VALID))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_mutations_of_a_valid_config_map_or_raise_a_clean_error(seed):
    rng = random.Random(seed)
    accepted = sum(check_one(mutate(rng, VALID)) for _ in range(ITERATIONS // 4))
    # Both outcomes must occur, or the generator is not exercising the parser.
    assert 0 < accepted < ITERATIONS // 4


@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_random_dicts_map_or_raise_a_clean_error(seed):
    rng = random.Random(seed)
    for _ in range(ITERATIONS // 4):
        check_one(random_dict(rng))


def test_non_dicts_raise_a_clean_error():
    for value in (None, [], "zero_optimization", 3, ("a",), {1, 2}):
        assert check_one(value) is False
