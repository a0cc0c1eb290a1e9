"""Config errors fail before anything starts, with one line naming key, file and the fix."""

import pytest

from rlvr.config import ConfigError, load_config

DEMO = "configs/demo.yaml"


def test_demo_config_loads_with_the_public_keys():
    cfg = load_config(DEMO)
    assert cfg.run_dir == "runs/demo"
    assert isinstance(cfg.seed, int) and isinstance(cfg.steps, int)
    assert cfg.checkpoint.every >= 0 and cfg.eval.every >= 0


def test_override_changes_a_nested_value_with_its_type():
    cfg = load_config(DEMO, ["trainer.lr=1e-5", "steps=7", 'rollout.sampling.stop=["\\n"]'])
    assert cfg.trainer.lr == 1e-5 and cfg.steps == 7 and cfg.rollout.sampling.stop == ["\n"]


def test_unknown_key_in_file_names_file_key_and_closest(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {path: m}\ndata: {train: t}\ntrainer:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: unknown key 'trainer.lrr'; did you mean trainer.lr?"


def test_unknown_key_in_override_names_the_override():
    with pytest.raises(ConfigError) as err:
        load_config(DEMO, ["trainer.lrr=3"])
    assert str(err.value) == "override 'trainer.lrr=3': unknown key 'trainer.lrr'; did you mean trainer.lr?"


def test_bad_type_names_key_and_value():
    with pytest.raises(ConfigError) as err:
        load_config(DEMO, ["trainer.lr=abc"])
    assert str(err.value) == (
        f"{DEMO}: trainer.lr: Input should be a valid number, unable to parse string as a number (got 'abc')"
    )


def test_out_of_range_value_is_rejected():
    with pytest.raises(ConfigError, match=r"trainer.ranks: Input should be greater than or equal to 1 \(got 0\)"):
        load_config(DEMO, ["trainer.ranks=0"])


def test_missing_file():
    with pytest.raises(ConfigError) as err:
        load_config("nope/missing.yaml")
    assert str(err.value) == "nope/missing.yaml: config file not found"


def test_missing_required_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: {train: t}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: model: Field required"


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  path: [unclosed\n")
    with pytest.raises(ConfigError, match=rf"^{path}:\d+: not valid YAML"):
        load_config(path)


def test_eval_k_larger_than_n_is_rejected():
    with pytest.raises(ConfigError, match=r"eval: k=16 must be between 1 and eval.n=8"):
        load_config(DEMO, ["eval.k=[1,16]"])


def test_megatron_layout_is_refused_where_it_cannot_run():
    megatron = ["trainer.backend=megatron", "trainer.ranks=4"]
    assert load_config(DEMO, [*megatron, "trainer.megatron.tensor_parallel=2"]).trainer.megatron.tensor_parallel == 2
    refusals = {
        "trainer.megatron.tensor_parallel=3": r"tensor_parallel x expert_parallel x pipeline_parallel = 3 must divide ranks=4",
        "trainer.megatron.pipeline_parallel=2": r"pipeline_parallel=2 needs GPUs \(placement.gpus_per_node\)",
        "trainer.shard_ranks=2": r"shard_ranks is FSDP2's sharding",
        "trainer.lora=null": r"backend: megatron trains a LoRA adapter \(set lora\)",
        "trainer.lora.dropout=0.1": r"lora.dropout must be 0 with backend: megatron",
    }
    for override, message in refusals.items():
        with pytest.raises(ConfigError, match=message):
            load_config(DEMO, [*megatron, override])
    with pytest.raises(ConfigError, match=r"sequence_parallel needs GPUs"):
        load_config(DEMO, [*megatron, "trainer.megatron.tensor_parallel=2", "trainer.megatron.sequence_parallel=true"])
    with pytest.raises(ConfigError, match=r"sequence_parallel splits tokens over the tensor-parallel ranks"):
        load_config(DEMO, [*megatron, "trainer.megatron.sequence_parallel=true"])
    with pytest.raises(ConfigError, match=r"read only with backend: megatron"):
        load_config(DEMO, ["trainer.megatron.tensor_parallel=2"])
    on_gpus = load_config(DEMO, [*megatron, "placement.gpus_per_node=4", "trainer.megatron.pipeline_parallel=2"])
    assert on_gpus.trainer.megatron.pipeline_parallel == 2


def test_shard_ranks_must_divide_ranks():
    with pytest.raises(ConfigError, match=r"trainer: shard_ranks=3 must divide ranks=2"):
        load_config(DEMO, ["trainer.shard_ranks=3"])
    assert load_config(DEMO, ["trainer.ranks=4", "trainer.shard_ranks=2"]).trainer.shard_ranks == 2


def test_cli_dry_run_prints_resolved_config_and_errors_exit_2():
    import subprocess
    import sys

    ok = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", DEMO, "--dry-run", "steps=3"], capture_output=True, text=True
    )
    assert ok.returncode == 0 and "steps: 3" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", DEMO, "trainer.lrr=3"], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "unknown key 'trainer.lrr'; did you mean trainer.lr?" in bad.stderr and not bad.stdout
