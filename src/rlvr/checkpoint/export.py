"""`rlvr export RUN_DIR OUT`: a run's trained policy as a plain Hugging Face model folder.

The base named in the run's config is loaded in float (an NVFP4 base is dequantized to the
values the trainer computed with); a LoRA run's adapter is merged into it with peft's
`merge_and_unload`, a full fine-tuning run's weights are read from the checkpoint's
torch.distributed.checkpoint shards. The result has no quantization_config and no adapter:
transformers and vLLM load it as any other model.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from rlvr.checkpoint.peft_files import SERVED_ADAPTER
from rlvr.checkpoint.store import CheckpointStore, verify
from rlvr.config import load_config
from rlvr.models.tokenizer import load_tokenizer
from rlvr.models.transformers_classes import causal_lm_from_pretrained
from rlvr.quant.checkpoint import write_dequantized_checkpoint
from rlvr.quant.formats import is_quantized_checkpoint


def resolve_checkpoint(run_dir: str | Path, checkpoint: str | Path | None = None) -> Path:
    """The run's newest intact checkpoint, or the one named (a folder or `step_N` under the run)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ValueError(f"{run_dir}: not a run folder (no config.yaml)")
    if checkpoint is None:
        folder = CheckpointStore(run_dir).latest()
        if folder is None:
            raise ValueError(f"{run_dir / 'checkpoints'}: no intact checkpoint")
        return folder
    folder = Path(checkpoint)
    if not folder.is_dir():
        folder = run_dir / "checkpoints" / str(checkpoint)
    problem = verify(folder) if folder.is_dir() else "no such folder"
    if problem:
        raise ValueError(f"{folder}: {problem}")
    return folder


def open_run(run_dir: str | Path, checkpoint: str | Path | None = None):
    """The run's config, its checkpoint folder, and that checkpoint's adapter (None: full fine-tuning)."""

    folder = resolve_checkpoint(run_dir, checkpoint)
    adapter = folder / SERVED_ADAPTER
    return load_config(Path(run_dir) / "config.yaml"), folder, adapter if adapter.is_dir() else None


def export_run(run_dir: str | Path, out_dir: str | Path, checkpoint: str | Path | None = None) -> Path:
    import torch

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    cfg, folder, adapter = open_run(run_dir, checkpoint)
    # float32 unless the run named a dtype: the merge W + scale * B @ A is exact there, where bf16 would
    # round away every change under half an ulp of its weight (rlvr.engines.lora_merge); a server casts
    # the folder to what it computes in
    dtype = torch.float32 if cfg.model.dtype == "auto" else getattr(torch, cfg.model.dtype)
    with tempfile.TemporaryDirectory(prefix="rlvr-export-") as scratch:
        base = cfg.model.path
        if is_quantized_checkpoint(base):
            base = str(write_dequantized_checkpoint(base, Path(scratch) / "base", dtype))
        model = causal_lm_from_pretrained(base, dtype=dtype)
        if adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        else:
            _load_full_weights(model, folder / "trainer" / "dcp", Path(scratch) / "state.pt")
        staging = out_dir.with_name(f".{out_dir.name}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging)
        load_tokenizer(cfg.model.path).save_pretrained(staging)
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)
    return out_dir


def _load_full_weights(model, dcp_dir: Path, scratch_file: Path) -> None:
    """A full fine-tuning checkpoint's weights (trainer naming `lm.<hf name>`) into `model`."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(dcp_dir, scratch_file)
    saved = torch.load(scratch_file, weights_only=False)["model"]
    state = {name.removeprefix("lm."): tensor for name, tensor in saved.items()}
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"{dcp_dir}: tensor {result.unexpected_keys[0]} belongs to no module of the base model")
    missing = [name for name in result.missing_keys if name not in _tied_names(model)]
    if missing:
        raise ValueError(f"{dcp_dir}: no tensor for {missing[0]} ({len(missing)} missing)")


def _tied_names(model) -> set[str]:
    tied = getattr(model, "_tied_weights_keys", None) or []
    return set(tied if isinstance(tied, (list, tuple, set)) else tied.keys())
