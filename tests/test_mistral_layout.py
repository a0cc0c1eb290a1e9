"""Mistral's own layout (params.json + consolidated*.safetensors + tekken.json) read as vLLM reads
it: the config through vLLM's adapt_config_dict, names through its MistralLarge3 mapper, and the
trainer's model equal whichever layout the same weights come in."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
from mistral_fixtures import write_dense_mistral_folder
from safetensors import safe_open

from rlvr.models.folder import ModelFolderError, check_model_folder, model_config
from rlvr.models.mistral_layout import (
    PARAMS_FILE,
    WEIGHTS_FILE,
    MistralLayoutError,
    TensorNames,
    adapted_config,
    config_from_params,
    is_mistral_folder,
    params_from_config,
)
from rlvr.models.tiny import build_tiny_mistral_folder, tiny_config

META = torch.empty(0, device="meta")


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory):
    return build_tiny_mistral_folder(tmp_path_factory.mktemp("mistral") / "model")


def _trainer(path):
    from rlvr.quant.skeleton import Skeleton

    skeleton = Skeleton.from_checkpoint(path, torch.float32)
    skeleton.keep_initialized(skeleton.model)
    skeleton.fill(skeleton.model, "cpu")
    return skeleton.model.eval()


def test_mistral4_is_a_causal_lm_saved_one_linear_per_expert():
    from transformers import AutoModelForCausalLM

    from rlvr.models.hub_layout import to_disk

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_config("mistral4", vocab_size=320))
    assert type(model).__name__ == "Mistral4ForCausalLM"
    names = to_disk(model, {k: v for k, v in model.state_dict().items() if ".experts." in k and "shared" not in k})
    assert "model.layers.1.mlp.experts.7.gate_proj.weight" in names and not any(
        k.endswith("gate_up_proj") for k in names
    )


def test_config_carries_what_vllm_computes(mistral_dir):
    params = json.loads((mistral_dir / PARAMS_FILE).read_text())
    adapted = adapted_config(params, "params.json")
    config = model_config(mistral_dir)
    assert type(config).__name__ == "Mistral4Config" and adapted["architectures"] == ["MistralLarge3ForCausalLM"]
    # routing as vLLM's deepseek_v2 runs it for this config, and mistral4 computes
    assert (adapted["scoring_func"], adapted["topk_method"], adapted["norm_topk_prob"]) == ("softmax", None, True)
    assert config.norm_topk_prob is True
    for field in ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size", "routed_scaling_factor",
                  "first_k_dense_replace", "n_group", "topk_group", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                  "qk_nope_head_dim", "v_head_dim", "hidden_size", "num_hidden_layers", "vocab_size"):  # fmt: skip
        assert getattr(config, field) == adapted[field], field
    assert config.routed_scaling_factor == params["moe"]["routed_scale"] == 2.0
    # llama-4 scaling and YaRN, the rope's own numbers as vLLM's rope reads them
    rope = config.rope_parameters
    assert rope["llama_4_scaling_beta"] == adapted["llama_4_scaling"]["beta"] == 0.1
    assert (
        rope["original_max_position_embeddings"] == adapted["llama_4_scaling"]["original_max_position_embeddings"] == 16
    )
    # all but mscale_all_dim: with attention_factor 1 vLLM leaves the softmax scale alone, and
    # transformers would scale it by mscale^2 whenever the key is there
    assert rope["attention_factor"] == 1.0 and adapted["rope_parameters"]["mscale_all_dim"] == 1
    assert "mscale_all_dim" not in rope and config.rope_interleave is True
    for key, value in adapted["rope_parameters"].items():
        assert key == "mscale_all_dim" or rope[key] == value, key
    # and params.json written from the config reads back to it
    assert config_from_params(params_from_config(config), "x").to_dict() == config.to_dict()


def test_names_map_both_ways_through_vllms_mapper(mistral_dir):
    names = TensorNames(model_config(mistral_dir))
    keys = list(safe_open(mistral_dir / WEIGHTS_FILE, "pt").keys())
    hf = {k: names.to_hf(k, META)[0] for k in keys}
    assert hf["layers.1.experts.3.w1.weight"] == "model.layers.1.mlp.experts.3.gate_proj.weight"
    assert hf["layers.0.attention.wq_a.weight"] == "model.layers.0.self_attn.q_a_proj.weight"
    assert hf["output.weight"] == "lm_head.weight" and hf["layers.1.gate.weight"] == "model.layers.1.mlp.gate.weight"
    assert all(names.to_mistral(v) == k for k, v in hf.items())
    for suffix in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"):
        assert names.to_mistral(f"model.layers.1.mlp.experts.3.down_proj.{suffix}") == f"layers.1.experts.3.w2.{suffix}"
    assert names.to_hf("vision_encoder.transformer.layers.0.attention.wq.weight", META) is None  # the image encoder
    with pytest.raises(MistralLayoutError, match="does not name"):
        names.to_hf("layers.0.mystery.weight", META)


def test_a_config_vllm_refuses_is_one_line(mistral_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(mistral_dir, bad)
    params = json.loads((bad / PARAMS_FILE).read_text())
    del params["llama_4_scaling"]
    (bad / PARAMS_FILE).write_text(json.dumps(params))
    with pytest.raises(
        MistralLayoutError, match=r"params.json: vLLM cannot read it: MistralLarge3 expect llama4 scaling"
    ) as err:
        check_model_folder(bad)
    assert "\n" not in str(err.value)
    params["llama_4_scaling"] = {"original_max_position_embeddings": 32, "beta": 0.1}
    (bad / PARAMS_FILE).write_text(json.dumps(params))
    with pytest.raises(MistralLayoutError, match="differs from llama_4_scaling's 32"):
        check_model_folder(bad)
    params["quantization"] = {"qformat_weight": "fp8_e4m3"}
    params["llama_4_scaling"]["original_max_position_embeddings"] = 16
    (bad / PARAMS_FILE).write_text(json.dumps(params))
    with pytest.raises(MistralLayoutError, match="FP8 weights"):
        check_model_folder(bad)


def test_dense_params_is_mistral():
    params = {"dim": 64, "n_layers": 2, "head_dim": 16, "hidden_dim": 128, "n_heads": 4, "n_kv_heads": 2, "norm_eps": 1e-5,
              "vocab_size": 300, "rope_theta": 1e6, "max_position_embeddings": 256}  # fmt: skip
    config = config_from_params(params, "params.json")
    assert type(config).__name__ == "MistralConfig"
    assert (config.hidden_size, config.num_key_value_heads, config.head_dim, config.rope_parameters["rope_theta"]) == (
        64,
        2,
        16,
        1e6,
    )
    with pytest.raises(MistralLayoutError, match="Ministral 3"):
        config_from_params(
            {**params, "llama_4_scaling": {"original_max_position_embeddings": 16, "beta": 0.1}}, "params.json"
        )


def test_a_folder_of_neither_layout_is_one_line_exit_2(tmp_path):
    (tmp_path / "params.json").write_text("{}")
    assert not is_mistral_folder(tmp_path)
    with pytest.raises(
        ModelFolderError,
        match="not a Hugging Face model folder .no config.json. nor one in Mistral's layout .no params.json with consolidated",
    ):
        check_model_folder(tmp_path)
    done = subprocess.run([sys.executable, "-m", "rlvr.cli", "import", str(tmp_path), str(tmp_path / "out")],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert (
        len(lines) == 1
        and "nor a folder in Mistral's layout (no config.json, no params.json with consolidated" in lines[0]
    ), lines


@pytest.mark.slow
def test_trainer_logits_equal_in_every_layout_float_and_nvfp4(mistral_dir, tmp_path):
    """The Mistral folder, its HF per-expert and fused save_pretrained folders and `rlvr import`'s:
    the trainer's logits agree, and so do those of each one quantized with rlvr quantize."""
    ids = torch.randint(0, 276, (2, 40), generator=torch.Generator().manual_seed(0))  # 40 > 16: llama-4 steps
    reference = _trainer(mistral_dir)
    logits = reference(input_ids=ids).logits
    folders = {"mistral": mistral_dir, "imported": tmp_path / "imported"}
    rlvr = [sys.executable, "-m", "rlvr.cli"]
    subprocess.run([*rlvr, "import", str(mistral_dir), str(folders["imported"])], check=True, capture_output=True)
    for name, fused in (("per_expert", False), ("fused", True)):
        folders[name] = tmp_path / name
        reference.save_pretrained(folders[name], save_original_format=not fused)
        shutil.copy(mistral_dir / "tekken.json", folders[name])  # the same calibration ids in every layout
    keys = list(safe_open(folders["fused"] / "model.safetensors", "pt").keys())
    assert "model.layers.1.mlp.experts.gate_up_proj" in keys
    for name, folder in folders.items():
        assert (_trainer(folder)(input_ids=ids).logits - logits).abs().max() <= 1e-5, name

    from rlvr.quant.checkpoint import load_quantized_model

    quantized = {}
    for name, folder in folders.items():
        out = tmp_path / f"{name}-nvfp4"
        subprocess.run([*rlvr, "quantize", str(folder), str(out)], check=True, capture_output=True)
        quantized[name] = load_quantized_model(out)(input_ids=ids).logits
    assert is_mistral_folder(tmp_path / "mistral-nvfp4")
    assert (
        "model.layers.1.mlp.experts.0.gate_proj.weight_packed"
        in safe_open(tmp_path / "fused-nvfp4" / "model.safetensors", "pt").keys()
    )
    # in vLLM's (= transformers') names: vLLM's weight mapper leaves them as they are, and matches them
    assert json.loads((tmp_path / "mistral-nvfp4" / PARAMS_FILE).read_text())["quantization"]["ignore"][:2] == [
        "lm_head",
        "model.layers.1.mlp.gate",
    ]
    assert (quantized["mistral"] - logits).abs().max() > 1e-3  # 4-bit moved them
    for name, values in quantized.items():
        assert (values - quantized["mistral"]).abs().max() <= 1e-5, name


@pytest.mark.slow
def test_import_round_trips_to_the_same_tensors(mistral_dir, tmp_path):
    """Float: every tensor, the experts fused as transformers' Mistral4ForCausalLM holds them
    (tests/test_mistral_import.py loads them with transformers alone). NVFP4: as stored, experts
    one Linear each, and the import says transformers cannot load those."""
    from rlvr.models.checkpoint_files import CheckpointFiles
    from rlvr.quant.checkpoint import quantize_checkpoint

    rlvr = [sys.executable, "-m", "rlvr.cli"]
    for source in (mistral_dir, quantize_checkpoint(mistral_dir, tmp_path / "nvfp4")):
        out = tmp_path / f"{source.name}-hf"
        done = subprocess.run([*rlvr, "import", str(source), str(out)], check=True, capture_output=True, text=True)
        config = json.loads((out / "config.json").read_text())
        assert config["model_type"] == "mistral4" and not is_mistral_folder(out)
        assert {"tekken.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}
        mistral, imported = CheckpointFiles(source), CheckpointFiles(out)
        if "quantization_config" in config:
            assert f"note: {out}: the NVFP4 experts are stored one Linear per expert" in done.stdout
            assert config["quantization_config"]["ignore"][:2] == ["lm_head", "model.layers.1.mlp.gate"]
            assert "model.layers.1.mlp.experts.0.gate_proj.weight_packed" in imported.keys()
            assert sorted(mistral.keys()) == sorted(imported.keys())
            for key in mistral.keys():
                assert torch.equal(mistral.read(key), imported.read(key)), key
            continue
        assert "note:" not in done.stdout
        per_expert = re.compile(r"(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")
        assert not any(per_expert.fullmatch(k) for k in imported.keys())
        for key in mistral.keys():
            tensor, piece = mistral.read(key), per_expert.fullmatch(key)
            if piece is None:
                assert torch.equal(tensor, imported.read(key)), key
                continue
            prefix, expert, projection = piece[1], int(piece[2]), piece[3]
            fused = imported.read(f"{prefix}.{'down_proj' if projection == 'down' else 'gate_up_proj'}")[expert]
            rows = len(tensor)
            expected = {"gate": fused[:rows], "up": fused[rows:], "down": fused}[projection]
            assert torch.equal(tensor, expected), key


def test_a_dense_mistral_folder_reads_as_the_hf_model(tmp_path):
    from transformers import AutoModelForCausalLM

    from rlvr.models.tiny import build_tiny_model

    hf_dir = build_tiny_model(tmp_path / "hf", "mistral", hidden_size=64, num_layers=2, intermediate_size=128)
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    folder = write_dense_mistral_folder(hf, tmp_path / "mistral")
    assert "layers.0.attention.wq.weight" in safe_open(folder / WEIGHTS_FILE, "pt").keys() and is_mistral_folder(folder)
    ids = torch.randint(0, hf.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    assert (_trainer(folder)(input_ids=ids).logits - hf(input_ids=ids).logits).abs().max() <= 1e-5


def test_the_image_encoder_is_left_out(mistral_dir, tmp_path):
    from safetensors.torch import save_file

    folder = tmp_path / "multimodal"
    shutil.copytree(mistral_dir, folder)
    params = json.loads((folder / PARAMS_FILE).read_text())
    (folder / PARAMS_FILE).write_text(
        json.dumps({**params, "vision_encoder": {"hidden_size": 32, "image_token_id": 10}})
    )
    save_file({"vision_encoder.patch_conv.weight": torch.ones(32, 3, 4, 4), "patch_merger.merging_layer.weight": torch.ones(32, 128)},
              folder / "consolidated-vision.safetensors")  # fmt: skip
    ids = torch.arange(3, 43).view(1, -1)
    assert torch.equal(_trainer(folder)(input_ids=ids).logits, _trainer(mistral_dir)(input_ids=ids).logits)
