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


def test_deepspeeds_own_defaults_and_spellings_are_read_as_deepspeed_reads_them():
    """Found by an independent client (docs/reliability.md, finding 49): each of these gave
    another number than DeepSpeed's, or refused what DeepSpeed accepts."""
    # An optimizer section without weight_decay: DeepSpeed's optimizers default it to 0
    # (DeepSpeedCPUAdam, FusedAdam), not torch.optim.AdamW's 1e-2.
    m = from_deepspeed({"optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}, warn=False)
    assert m.optimizer["weight_decay"] == 0.0
    # fp16 alone means dynamic loss scaling in DeepSpeed (loss_scale 0): said, not dropped.
    m = from_deepspeed({"fp16": {"enabled": True}}, warn=False)
    assert any("loss" in n and "fp16" in n for n in m.notes), m.notes
    # max_in_cpu is parameter elements kept in CPU memory under NVMe offload.
    nvme = {"device": "nvme", "nvme_path": NVME, "max_in_cpu": 10**6}
    m = from_deepspeed({"zero_optimization": {"stage": 3, "offload_param": nvme}}, warn=False)
    assert m.config.pinned_budget_bytes == 10**6 * 4
    cpu = {"device": "cpu", "max_in_cpu": 10**6}
    m = from_deepspeed({"zero_optimization": {"stage": 3, "offload_param": cpu}}, warn=False)
    assert m.config.pinned_budget_bytes == 0
    assert any("max_in_cpu" in n and "'nvme'" in n for n in m.notes)
    # A generated config's null path, one directory spelt with a trailing slash, a 1 for true.
    m = from_deepspeed({"zero_optimization": {
        "stage": 3, "offload_param": {"device": "nvme", "nvme_path": NVME + "/"},
        "offload_optimizer": {"device": "nvme", "nvme_path": NVME}}}, warn=False)
    assert m.config.nvme_path == NVME
    from_deepspeed({"zero_optimization": {"stage": 3, "offload_param": {
        "device": "cpu", "nvme_path": None}}}, nvme_path=NVME, warn=False)
    from_deepspeed({"optimizer": {"type": "Adam", "params": {"bias_correction": 1}}}, warn=False)
    # The Hugging Face template's "auto" is refused once, for what it is, not as "both true".
    with pytest.raises(DeepSpeedConfigError) as e:
        from_deepspeed({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}, warn=False)
    assert not any("both true" in p for p in e.value.problems), e.value.problems


def test_deepspeeds_deprecated_and_alias_keys_are_read_as_deepspeed_reads_them():
    """cpu_offload_param is offload_param {device: cpu}; cpu_offload is offload_optimizer {device:
    cpu}, refused like it; the names DeepSpeed reads beside their stage3_ aliases are known."""
    m = from_deepspeed({"zero_optimization": {"stage": 3, "cpu_offload_param": True}},
                       nvme_path=NVME, warn=False)
    assert m.param_home == "pinned"
    with pytest.raises(DeepSpeedConfigError) as e:
        from_deepspeed({"zero_optimization": {"stage": 3, "cpu_offload": True}}, warn=False)
    assert any("offload_optimizer" in p for p in e.value.problems)
    with pytest.raises(DeepSpeedConfigError):  # not a DeepSpeed key
        from_deepspeed({"zero_optimization": {"stage": 3, "cpu_offload_params": True}},
                       warn=False)
    m = from_deepspeed({"zero_optimization": {"stage": 3, "max_live_parameters": 10**9,
                                              "prefetch_bucket_size": 5 * 10**7},
                        "dataloader_drop_last": True, "amp": {"enabled": False}}, warn=False)
    assert any("max_live_parameters" in n for n in m.notes)
    with pytest.raises(DeepSpeedConfigError):
        from_deepspeed({"amp": {"enabled": True}}, warn=False)
