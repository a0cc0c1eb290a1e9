"""The HF folder converted into megatron-core's GPTModel (rlvr.training.megatron): its logits
equal transformers' within 1e-5 of their scale in float32, one rank or split by tensor parallel
over two, for each dense family, a packed row of two sequences scored as each alone; and with a
PEFT adapter on some of the targets a fused Megatron layer holds, equal to peft's."""

from __future__ import annotations

import pytest
import torch
from megatron_fixtures import dense_folder, run_ranks
from transformers import AutoModelForCausalLM

from rlvr.training.attention import PackedLayout, Segment

RANK, ALPHA = 4, 8.0
SEQUENCES = [[5, 17, 33, 90, 41, 7, 66], [12, 3, 88, 45, 9]]


def _megatron_logits(rank: int, world_size: int, path: str, adapter: dict | None = None) -> torch.Tensor:
    from rlvr.config import MegatronConfig
    from rlvr.models.folder import read_model_folder
    from rlvr.training.megatron.lora import attach_lora
    from rlvr.training.megatron.parallel import start_model_parallel, stop_model_parallel
    from rlvr.training.megatron.policy import MegatronPolicy

    start_model_parallel(MegatronConfig(tensor_parallel=world_size), use_cuda=False)
    try:
        policy = MegatronPolicy(read_model_folder(path), torch.float32, logits_chunk_mb=64)
        if adapter is not None:
            attach_lora(policy.gpt, adapter, policy.shape, scaling=ALPHA / RANK)
        ids = torch.tensor([sum(SEQUENCES, [])])
        positions = torch.tensor([[p for s in SEQUENCES for p in range(len(s))]])
        layout = PackedLayout.build([Segment(0, len(SEQUENCES[0])), Segment(len(SEQUENCES[0]), len(SEQUENCES[1]))])
        with torch.no_grad():
            return policy.logits(policy.hidden(ids, positions, layout))
    finally:
        stop_model_parallel()


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "tied"), [("qwen2", True), ("llama", False), ("mistral", True)])
def test_converted_logits_equal_transformers(tmp_path, arch, tied):
    path = dense_folder(tmp_path / arch, arch, tied=tied)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        want = torch.cat([hf(torch.tensor([s])).logits[0] for s in SEQUENCES])
    scale = want.abs().max()
    for ranks in (1, 2):
        for rank, got in run_ranks(_megatron_logits, ranks, str(path)).items():
            error = (got - want).abs().max() / scale
            assert error < 1e-5, (arch, ranks, rank, float(error))


@pytest.mark.slow
def test_a_peft_adapter_on_megatron_layers_gives_peft_logits(tmp_path):
    """q and v of the fused q/k/v (k left as is), up of the fused gate/up, and the row-parallel
    down projection: each factor lands on its rows or columns of the split layer."""
    from peft import LoraConfig, get_peft_model

    path = dense_folder(tmp_path / "qwen2", "qwen2")
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"])
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), config)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in peft.parameters():
            if param.requires_grad:  # B too: an adapter that changes the output
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
        want = torch.cat([peft(torch.tensor([s])).logits[0] for s in SEQUENCES])
    adapter = {n.replace(".default.", "."): p.detach() for n, p in peft.named_parameters() if p.requires_grad}
    for ranks in (1, 2):
        for rank, got in run_ranks(_megatron_logits, ranks, str(path), adapter).items():
            error = (got - want).abs().max() / want.abs().max()
            assert error < 1e-5, (ranks, rank, float(error))
