"""`rlvr import MISTRAL_DIR OUT` writes the layout transformers' own class loads: in a process that
never imports rlvr (so none of its registrations), transformers loads every tensor of OUT, builds
none at random, computes the logits rlvr computes from the Mistral folder, and reads OUT's
tokenizer as mistral-common reads tekken.json."""

import json
import subprocess
import sys

import pytest
import torch
from mistral_common.tokens.tokenizers.tekken import Tekkenizer
from mistral_fixtures import write_dense_mistral_folder
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.models.mistral_layout import TOKENIZER_FILE, write_byte_tekken
from rlvr.models.tiny import build_tiny_mistral_folder, build_tiny_model
from rlvr.models.transformers_classes import causal_lm_from_pretrained
from rlvr.quant.skeleton import Skeleton

SIZES = dict(hidden_size=64, num_heads=2, num_layers=2, intermediate_size=128)
TEXT = "Hello, world! 123\nünïcode"

# Run in a fresh interpreter: transformers alone. It loads OUT with the class config.json names,
# and with AutoModelForCausalLM where transformers maps the model type to a causal LM (5.19 lists
# mistral4 under image-text-to-text only; rlvr's registration, which adds it, is absent here).
PLAIN_TRANSFORMERS = """
import json, sys
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

out, ids = sys.argv[1], torch.tensor(json.loads(sys.argv[2]))
config = json.load(open(f"{out}/config.json"))
classes = [getattr(transformers, config["architectures"][0])]
if config["model_type"] in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
    classes.append(AutoModelForCausalLM)
report = {"rlvr_imported": "rlvr" in sys.modules, "classes": [], "tokens": AutoTokenizer.from_pretrained(out).encode(
    sys.argv[3], add_special_tokens=False)}
for cls in classes:
    model, info = cls.from_pretrained(out, output_loading_info=True)
    report["classes"].append({"class": type(model).__name__, "info": {k: sorted(map(str, v)) for k, v in info.items()},
                              "logits": model.eval()(input_ids=ids).logits.tolist()})
print(json.dumps(report))
"""


def _mistral_folder(kind: str, root):
    """Mistral Large 3's shape (mistral4, experts fused in transformers) or a dense Mistral."""
    if kind == "mla":
        return build_tiny_mistral_folder(root / "mistral", **SIZES)
    hf = causal_lm_from_pretrained(build_tiny_model(root / "hf", "mistral", **SIZES))
    folder = write_dense_mistral_folder(hf, root / "mistral")
    write_byte_tekken(folder / TOKENIZER_FILE)
    return folder


@pytest.mark.parametrize("kind, classes", [("mla", ["Mistral4ForCausalLM"]), ("dense", ["MistralForCausalLM"] * 2)])
def test_transformers_alone_loads_the_imported_folder_as_rlvr_reads_the_mistral_one(tmp_path, kind, classes):
    mistral = _mistral_folder(kind, tmp_path)
    out = tmp_path / "out"
    done = CliRunner().invoke(app, ["import", str(mistral), str(out)])
    assert done.exit_code == 0, done.output
    assert "note:" not in done.output  # a float folder: nothing transformers cannot load
    ids = torch.randint(0, 276, (1, 24), generator=torch.Generator().manual_seed(0))  # 24 > 16: llama-4 steps

    plain = subprocess.run([sys.executable, "-c", PLAIN_TRANSFORMERS, str(out), json.dumps(ids.tolist()), TEXT],
                           capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert plain.returncode == 0, plain.stderr[-3000:]
    report = json.loads(plain.stdout.strip().splitlines()[-1])
    assert report["rlvr_imported"] is False
    assert [c["class"] for c in report["classes"]] == classes  # dense: also through AutoModelForCausalLM
    skeleton = Skeleton.from_checkpoint(mistral, torch.float32)
    skeleton.keep_initialized(skeleton.model)
    skeleton.fill(skeleton.model, "cpu")
    expected = skeleton.model.eval()(input_ids=ids).logits
    for loaded in report["classes"]:
        info = loaded["info"]
        assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
        assert (torch.tensor(loaded["logits"]) - expected).abs().max() <= 1e-5, loaded["class"]
    assert report["tokens"] == Tekkenizer.from_file(mistral / TOKENIZER_FILE).encode(TEXT, bos=False, eos=False)
