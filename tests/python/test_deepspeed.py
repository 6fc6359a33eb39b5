"""DeepSpeed-style configs: mapped onto strata.Config, every key accounted for."""
import warnings

import pytest

import strata
from strata.deepspeed import DeepSpeedConfigError, from_deepspeed

NVME = "/mnt/nvme"


def test_offload_sections_and_aio_map_onto_the_config():
    m = from_deepspeed({
        "train_micro_batch_size_per_gpu": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95],
                                                  "eps": 1e-8, "weight_decay": 0.1}},
        "zero_optimization": {
            "stage": 3, "sub_group_size": 1e8,
            "offload_param": {"device": "nvme", "nvme_path": NVME, "pin_memory": True,
                              "buffer_count": 4, "buffer_size": 1e7},
            "offload_optimizer": {"device": "nvme", "nvme_path": NVME, "buffer_count": 2},
        },
        "aio": {"block_size": 262144, "queue_depth": 16, "thread_count": 2,
                "single_submit": False, "overlap_events": True},
    }, warn=False)
    assert m.config.nvme_path == NVME
    assert m.config.block_size == 262144 and m.config.queue_depth == 16
    assert m.config.worker_threads == 2
    assert m.config.pinned_budget_bytes == 4 * 10**7 * 4 + 2 * 10**8 * 4
    assert m.param_home == "nvme"
    assert m.optimizer == {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
                           "decoupled_weight_decay": True}
    assert m.optimizer_options == {"max_grad_norm": 1.0, "sub_group_bytes": 4 * 10**8}
    assert any("train_micro_batch_size_per_gpu" in n for n in m.notes)


def test_cpu_param_offload_rests_in_pinned_memory():
    m = from_deepspeed({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}},
                       nvme_path=NVME, warn=False)
    assert m.param_home == "pinned"


def test_unknown_keys_are_errors_with_a_suggestion():
    with pytest.raises(DeepSpeedConfigError) as e:
        from_deepspeed({"zero_optimization": {"offload_param": {"device": "nvme",
                                                                "nvme_path": NVME,
                                                                "bufer_size": 1e8}}})
    assert "bufer_size" in str(e.value) and "buffer_size" in str(e.value)
    assert isinstance(e.value, strata.StrataError) and e.value.code == -1


def test_contradictions_are_all_reported():
    with pytest.raises(DeepSpeedConfigError) as e:
        from_deepspeed({
            "zero_optimization": {
                "stage": 2,
                "offload_param": {"device": "nvme", "nvme_path": "/a"},
                "offload_optimizer": {"device": "nvme", "nvme_path": "/b", "ratio": 0.5},
            },
            "aio": {"block_size": 1000, "use_gds": True},
            "fp16": {"enabled": True}, "bf16": {"enabled": True},
        })
    text = str(e.value)
    for part in ("stage 3", "differ", "ratio", "4096", "GPUDirect", "both true"):
        assert part in text, part


def test_cpu_optimizer_offload_is_refused_not_ignored():
    with pytest.raises(DeepSpeedConfigError) as e:
        from_deepspeed({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})
    assert "NVMe" in str(e.value)


def test_settings_without_effect_are_warned_about():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_deepspeed({"zero_optimization": {"stage": 3, "overlap_comm": True,
                                              "offload_param": {"device": "nvme",
                                                                "nvme_path": NVME,
                                                                "pin_memory": False}}})
    text = " ".join(str(w.message) for w in caught)
    assert "overlap_comm" in text and "pin_memory" in text


def test_precision_sections_take_deepspeeds_keys_and_a_real_boolean():
    """DeepSpeed's DeepSpeedFP16Config / DeepSpeedBF16Config refuse other keys; "auto" is the
    Hugging Face Trainer's placeholder, filled in before DeepSpeed reads the config."""
    for ds, word in (({"fp16": {"enabeld": True}}, "enabled"),
                     ({"bf16": {"enabled": False, "bogus": 1}}, "bogus"),
                     ({"fp16": {"enabled": "auto"}}, "auto")):
        with pytest.raises(DeepSpeedConfigError) as e:
            from_deepspeed(ds, warn=False)
        assert word in str(e.value), ds
    m = from_deepspeed({"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16},
                        "bf16": {"enabled": False, "immediate_grad_update": True}}, warn=False)
    assert m.param_dtype == "float16"


def test_stage_and_parameter_home_default_as_in_deepspeed():
    """No stage is stage 0, where DeepSpeed offloads no parameters; no offload_param keeps them
    on the device, as an offload_param with device none does."""
    with pytest.raises(DeepSpeedConfigError) as e:
        from_deepspeed({"zero_optimization": {"offload_param": {"device": "nvme",
                                                                "nvme_path": NVME}}}, warn=False)
    assert "stage 3" in str(e.value) and "it is 0" in str(e.value)
    with pytest.raises(DeepSpeedConfigError):
        from_deepspeed({"zero_optimization": {"stage": True}}, warn=False)
    for ds in ({}, {"zero_optimization": {"stage": 3}},
               {"zero_optimization": {"stage": 3, "offload_param": {"device": "none"}}}):
        m = from_deepspeed(ds, warn=False)
        assert m.param_home == "device", ds
    assert any("offload_param" in note for note in from_deepspeed({}, warn=False).notes)


def test_bfloat16_is_read_as_deepspeed_reads_its_older_name_for_bf16():
    assert from_deepspeed({"bfloat16": {"enabled": True}}, warn=False).param_dtype == "bfloat16"
    m = from_deepspeed({"bf16": {"enabled": False}, "bfloat16": {"enabled": True}}, warn=False)
    assert m.param_dtype is None and any("bfloat16" in note for note in m.notes)
