"""LoRA adapters as PEFT folders (adapter_config.json + adapter_model.safetensors).

The same files peft's `save_pretrained` writes and `PeftModel.from_pretrained` reads, so an
adapter trained here loads anywhere peft or vLLM does.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.records import LoraAdapter

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
# A run checkpoint's adapters: the one the engine serves, and (generating one step ahead) the one
# before it, which generated the rollouts in flight
SERVED_ADAPTER, IN_FLIGHT_ADAPTER = "adapter", "rollout_adapter"


def save_adapter(adapter: LoraAdapter, folder: str | Path) -> Path:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in adapter.tensors.items()}, str(folder / WEIGHTS_FILE))
    (folder / CONFIG_FILE).write_text(json.dumps(adapter.config, indent=2, default=sorted))
    return folder


def load_adapter(folder: str | Path, version: int = 1) -> LoraAdapter:
    from safetensors.torch import load_file

    folder = Path(folder)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise ValueError(f"{folder}: not a PEFT adapter folder (missing {name})")
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{folder / CONFIG_FILE}: not valid JSON ({err.msg}, line {err.lineno})") from None
    return LoraAdapter(tensors=load_file(str(folder / WEIGHTS_FILE)), config=config, version=version)
