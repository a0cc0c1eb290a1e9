"""Day-0 matrix: tiny random models of eight transformers architectures, each through 2 RL steps
of the real stack (vLLM engine, 2 FSDP2 ranks, LoRA synced to the engine after every step).

No architecture has code of its own in rlvr; what differs is only what the model files say.
Dense models train LoRA on an NVFP4 base written by `rlvr quantize`; the MoE models on their
float weights, since transformers 5 stores their experts fused (one 3-D parameter per layer),
which rlvr's packed NVFP4 loader does not rebuild (it says so, see test_quant_nvfp4).

A random model never writes a correct boxed answer, so the math verifier would give every
rollout 0, every advantage 0 and a LoRA that never moves, and the sync check would compare the
base with itself. The reward here is the share of digits in the response instead: it varies
between samples, so the adapter trains and the engine must serve the trained one.
"""

import json
import subprocess
import sys

import pytest
import yaml
from safetensors.torch import load_file

DENSE = ["llama", "qwen2", "qwen3", "mistral", "gemma", "phi3"]
MOE = ["mixtral", "qwen3_moe"]

DIGIT_SHARE = '''
def digit_share(response, answer):
    return sum(c.isdigit() for c in response) / max(1, len(response))
'''


@pytest.mark.slow
@pytest.mark.parametrize("arch", DENSE + MOE)
def test_two_rl_steps_through_vllm_and_two_fsdp2_ranks_with_lora(tmp_path, arch):
    base_format = "hf" if arch in MOE else "nvfp4"
    (tmp_path / "reward.py").write_text(DIGIT_SHARE)
    cfg = yaml.safe_load(open("configs/demo.yaml"))
    cfg.update(run_dir=str(tmp_path / "run"), steps=2)
    cfg["model"]["path"] = str(tmp_path / "model")
    cfg["data"].update(train=str(tmp_path / "task/train.jsonl"), test=str(tmp_path / "task/test.jsonl"))
    cfg["rollout"].update(prompts_per_step=4, samples_per_prompt=4)
    cfg["reward"]["verifier"] = f"{tmp_path / 'reward.py'}:digit_share"
    cfg["eval"].update(n=2, k=[1, 2], max_problems=2)
    cfg["demo"].update(base_format=base_format)
    cfg["demo"]["model"].update(arch=arch, num_layers=2, intermediate_size=256)
    cfg["demo"]["warm_start"].update(steps=0)
    cfg["demo"]["task"].update(train_size=32, test_size=4)
    cfg["tracking"] = {"progress": False}
    path = tmp_path / "day0.yaml"
    path.write_text(yaml.safe_dump(cfg))

    done = subprocess.run([sys.executable, "-m", "rlvr.cli", "demo", "--config", str(path)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["engine"], summary["trainer_ranks"], summary["lora_rank"], summary["base_format"]) == (
        "vllm", 2, 16, base_format)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["model_type"] == arch
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in steps if "reward/mean" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        assert line["reward/std"] > 0 and line["grad_norm"] > 0  # the adapter gets a real update
        assert line["sync/sampler_trainer_gap"] <= 1e-3  # the rollouts' own logprobs, before the step
        assert line["sync/logprob_gap"] <= 1e-3  # the probe, after the adapter reached the engine

    adapter = load_file(next(run.glob("checkpoints/*/adapter/adapter_model.safetensors")))
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert lora_b and max(float(t.abs().max()) for t in lora_b) > 0  # B starts at zero: it trained
