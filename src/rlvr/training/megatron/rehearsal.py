"""What a trainer rank of trainer.backend=megatron would hold, measured on megatron-core's own
module tree at the run's real size with no GPU and no weights: `rlvr rehearse`'s Megatron half
(rlvr.training.sharding_rehearsal is FSDP2's).

For each rank asked, megatron-core's process groups are started over torch's fake process group
at the config's world size and layout (trainer.megatron), and the rank's part of the model is
built as its rank builds it (`build_rank_model`: dense, or MLA + MoE with its routed experts split
by expert parallel; the PEFT factors drawn on the skeleton, `attach_lora`)
on the meta device: megatron-core itself decides each rank's share of every tensor. Then, in bytes:

- base_shard: the rank's part of every frozen parameter, at the compute dtype (a 4-bit base is
  read dequantized: rlvr.training.megatron.rank);
- trainable: the rank's part of the LoRA factors, value and gradient;
- optimizer: AdamW's state for those, created by AdamW itself (exp_avg, exp_avg_sq).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from rlvr.config import RunConfig
from rlvr.hardware import compute_dtype, local_device
from rlvr.models.estimate import estimate_config
from rlvr.models.folder import config_file, model_config
from rlvr.training.megatron.gpt import DENSE
from rlvr.training.megatron.lora import attach_lora, peft_factors
from rlvr.training.megatron.mla import LATENT, LatentShape
from rlvr.training.megatron.parallel import start_model_parallel, stop_model_parallel
from rlvr.training.megatron.policy import build_rank_model
from rlvr.training.sharding_rehearsal import held_bytes, rehearsal_skeleton


def measure_megatron_ranks(cfg: RunConfig, ranks: list[int]) -> list[dict[str, int]]:
    """Each rank's bytes (see the module doc-string), in the order of `ranks`."""
    return [_measure(cfg, rank) for rank in ranks]


def unbuilt(cfg: RunConfig) -> str | None:
    """Why a Megatron rank would not build this run's model, so nothing can be measured (or None)."""
    if cfg.trainer.megatron.pipeline_parallel > 1:
        return "the Megatron rank builds no pipeline stages (trainer.megatron.pipeline_parallel)"
    path = Path(cfg.model.path)
    if config_file(path).is_file():
        config = model_config(path)
    elif cfg.model.estimate is not None:
        config = estimate_config(cfg.model.estimate)
    else:
        return None  # the measurement says what is missing
    if config.model_type in LATENT:
        try:  # what the rank refuses of an MLA + MoE model, or of its split
            LatentShape.of(config).check_split(
                cfg.trainer.megatron.tensor_parallel, cfg.trainer.megatron.expert_parallel
            )
        except ValueError as refusal:
            return str(refusal)
    elif config.model_type not in DENSE:
        return f"the Megatron rank converts {', '.join(DENSE + LATENT)} models, not {config.model_type}"
    return None


def _measure(cfg: RunConfig, rank: int) -> dict[str, int]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    trainer = cfg.trainer
    assert trainer.lora is not None  # TrainerConfig requires it with backend megatron
    dtype = compute_dtype(cfg.model.dtype, local_device(cfg.placement.gpus_per_node)).torch
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=trainer.ranks)
    try:
        start_model_parallel(trainer.megatron, use_cuda=False)
        skeleton = rehearsal_skeleton(cfg, dtype)
        names = {name for name, _ in skeleton.model.named_parameters()}
        _, factors = peft_factors(skeleton.model, trainer.lora, shapes_only=True)
        with torch.device("meta"):
            shape, gpt = build_rank_model(skeleton.model.config, "model.layers.0.self_attn.q_proj.bias" in names, dtype)
            for p in gpt.parameters():
                p.requires_grad_(False)
            attach_lora(gpt, factors, shape, scaling=trainer.lora.alpha / trainer.lora.rank)
        return held_bytes(list(gpt.parameters()))
    finally:
        stop_model_parallel()
        dist.destroy_process_group()
