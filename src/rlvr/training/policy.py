"""The trained policy: any HF causal LM (optionally LoRA via peft), sharded with FSDP2.

No model-specific code: decoder blocks are found from the model's own `_no_split_modules`
(what HF already lists as the unit not to split), with the largest ModuleList as fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from unittest.mock import patch

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlvr.algorithms import logprobs_and_entropy
from rlvr.quant import QuantizedLinear, peft_targets_as_given, prepare_lora_config
from rlvr.quant.experts import add_experts_lora, is_packed_experts, use_rlvr_experts
from rlvr.training.attention import NAME as PACKED
from rlvr.training.attention import PackedLayout
from rlvr.training.logits_memory import chunk_tokens

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel


class TokenLogprobs(nn.Module):
    """Wraps a causal LM so that forward returns the logprob of each scored token.

    The LM head runs only on the positions that score a token, a chunk of them at a time under
    activation checkpointing, so the `[tokens, vocab]` logits exist for one chunk at a time, in
    forward and in backward. A chunk is as many tokens as `logits_chunk_mb` holds with the
    copies they are read with (rlvr.training.logits_memory): ~280 tokens of a 152k vocabulary
    in float32 for 512 MB. Logits are divided by the sampling temperature so the trainer scores
    tokens under the distribution the sampler drew them from.
    """

    def __init__(self, lm: PreTrainedModel | PeftModel, logits_chunk_mb: float):
        super().__init__()
        self.lm = lm
        self.logits_chunk_bytes = logits_chunk_mb * 1e6
        self.softcap = getattr(lm.config, "final_logit_softcapping", None)

    def chunk_tokens(self, dtype: torch.dtype) -> int:
        """Scored tokens per LM-head chunk for logits of `dtype`."""
        vocab = self.lm.get_output_embeddings().weight.shape[0]
        return chunk_tokens(self.logits_chunk_bytes, vocab, dtype.itemsize, softcapped=bool(self.softcap))

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        score_positions: torch.Tensor,
        score_targets: torch.Tensor,
        temperature: float = 1.0,
        layout: PackedLayout | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logprobs [T], entropy [T]) of a packed row `[1, L]`: token score_targets[t] scored at
        the hidden state of position score_positions[t]. `layout` says which tokens each token
        attends to (rlvr's packed attention); without it, sequences are told apart by position_ids
        restarting at 0."""
        packed = {}
        if self.lm.config._attn_implementation == PACKED and layout is not None:
            packed["rlvr_layout"] = layout
        elif layout is not None and layout.has_prefix:
            raise ValueError("shared prompts need rlvr's packed attention (trainer.attention: packed)")
        hidden = self.lm.get_decoder()(input_ids=input_ids, position_ids=position_ids, use_cache=False, **packed)
        hidden = hidden.last_hidden_state[0].index_select(0, score_positions)
        return score_in_chunks(
            self.lm.get_output_embeddings(),
            hidden,
            score_targets,
            self.chunk_tokens(hidden.dtype),
            temperature,
            self.softcap,
        )


def score_in_chunks(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    chunk: int,
    temperature: float,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs [T], entropy [T], detached) of `targets` under `head`'s logits `[T, vocab]` of the
    hidden states `[T, hidden]`, `chunk` tokens at a time, each chunk's logits recomputed in backward."""
    logprobs, entropies = [], []
    for h, t in zip(hidden.split(chunk), targets.split(chunk)):
        lp, ent = checkpoint(_score_chunk, head, h, t, temperature, softcap, use_reentrant=False)
        logprobs.append(lp)
        entropies.append(ent.detach())
    return torch.cat(logprobs), torch.cat(entropies)


def _score_chunk(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, softcap: float | None):
    logits = head(hidden)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logprobs_and_entropy(logits, targets, temperature=temperature, chunk_size=len(targets))


def decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of any HF model, found without model-specific code."""
    names = {name for m in model.modules() for name in (getattr(m, "_no_split_modules", None) or [])}
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if blocks:
        return blocks
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError(f"{type(model).__name__}: found no decoder blocks to shard")
    longest = max(lists, key=len)
    return list(longest)


def apply_lora(
    model: nn.Module,
    rank: int,
    alpha: float,
    dropout: float,
    target_modules,
    target_experts: bool = False,
    shapes_only: bool = False,
) -> PeftModel:
    """peft LoRA on the frozen base (packed NVFP4 layers included); only the adapter trains.

    `target_experts` adds one rank-`rank` pair per routed expert and projection of every MoE
    layer (rlvr.quant.experts.ExpertsLora, peft's `target_parameters` layout), computed inside
    rlvr's experts implementation, packed or float. `shapes_only`: the factors stay on the meta
    device, never drawn (peft's low_cpu_mem_usage), for measuring a model, not training it.
    """
    from peft import LoraConfig, get_peft_model

    if target_experts and dropout:
        raise ValueError(
            "lora.target_experts needs lora.dropout: 0 (an expert's LoRA input is its routed tokens, as in peft)"
        )
    if target_experts and not use_rlvr_experts(model):
        raise ValueError(f"lora.target_experts: {type(model).__name__} has no MoE experts to target")
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]  # peft annotates it int; it scales by alpha / r, a float
        lora_dropout=dropout,
        target_modules=target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with peft_targets_as_given(), _adapters_built_off_meta():
        peft_model = get_peft_model(model, prepare_lora_config(config, model), low_cpu_mem_usage=shapes_only)
        if target_experts:
            add_experts_lora(peft_model, shapes_only=shapes_only)
    return peft_model


@contextmanager
def _adapters_built_off_meta() -> Iterator[None]:
    """While active, peft keeps the adapters it builds on a meta-device base (the sharded
    load's skeleton) on the CPU, where it drew their initial values, instead of moving them to
    the base's device, which would throw those values away: the sharded trainer starts from
    the very factors a whole load gave it (rlvr.quant.skeleton keeps and shards them). peft
    moves them in two places: after building a layer's adapter, and after putting the layer in.
    Enter it inside `peft_targets_as_given`, whose lock keeps other threads' patching out."""
    from peft.tuners.lora import LoraModel
    from peft.tuners.tuners_utils import BaseTunerLayer

    device_and_dtype, replace_module = BaseTunerLayer._get_base_layer_device_and_dtype, LoraModel._replace_module

    def off_meta(self, base_layer):
        device, dtype = device_and_dtype(self, base_layer)
        return (torch.device("cpu") if device is not None and device.type == "meta" else device), dtype

    def replace_keeping_values(self, parent, child_name, new_module, child):
        built = {
            (m, name): p
            for m in new_module.modules()
            for name, p in m._parameters.items()
            if p is not None and not p.is_meta
        }
        replace_module(self, parent, child_name, new_module, child)
        for (module, name), parameter in built.items():
            module._parameters[name] = parameter

    with (
        patch.object(BaseTunerLayer, "_get_base_layer_device_and_dtype", off_meta),
        patch.object(LoraModel, "_replace_module", replace_keeping_values),
    ):
        yield


def shard(module: nn.Module, mesh, param_dtype: torch.dtype, reduce_dtype: torch.dtype) -> None:
    """FSDP2: each decoder block is its own unit, the rest (embeddings, norm, head) the root.

    Each packed layer (NVFP4, NF4 Linears, NVFP4 experts modules) is a unit of its own, under a
    policy that casts nothing: the block's policy would turn its FP8 group scales or float32
    block absmax into `param_dtype` (FSDP2 casts every floating-point parameter, FP8 included, and
    the packed bytes' float16 view, rlvr.quant.packed_bytes). Its mixed-dtype tensors are then
    all-gathered as bytes, one collective per layer, and freed again after the layer ran. Packed
    experts are sharded along their first dimension, the experts: each of N ranks holds E/N
    experts' bytes between steps (on a 2-D mesh, trainer.shard_ranks' HSDP, N is the shard
    dimension: each replica holds all E). No parameter is an integer tensor, so every supported
    torch's FSDP2 shards the whole base; none is ever replicated.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    integer = next(
        (name for name, p in module.named_parameters() if not (p.is_floating_point() or p.is_complex())), None
    )
    if integer is not None:
        raise ValueError(f"{integer} is an integer tensor, which torch {torch.__version__}'s FSDP2 may refuse to shard")
    for layer in module.modules():
        if isinstance(layer, QuantizedLinear) or is_packed_experts(layer):
            fully_shard(layer, mesh=mesh, mp_policy=MixedPrecisionPolicy())
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in decoder_blocks(module):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)


def shard_and_load(policy: nn.Module, skeleton, mesh, param_dtype: torch.dtype, device: torch.device | str) -> None:
    """FSDP2 on the meta-device policy, then each rank reads only the rows it holds
    (rlvr.quant.skeleton): torchtitan's meta init, parallelise, load what each rank owns."""
    skeleton.keep_initialized(policy)  # LoRA's initial factors, rotary buffers: built, not read
    shard(policy, mesh, param_dtype=param_dtype, reduce_dtype=torch.float32)
    skeleton.fill(policy, device)
