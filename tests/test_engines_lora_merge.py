"""The LoRA merge the CPU vLLM engine serves adapters with (`merge_lora`), against peft's own
`merge_and_unload` on the same adapter, and its refusals."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from rlvr.engines.lora_merge import merged_weights


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(6, 8)
        self.down = nn.Linear(8, 6, bias=False)
        self.norm = nn.LayerNorm(6)


@pytest.mark.parametrize("rslora", [False, True])
def test_merge_equals_peft_merge_and_unload(rslora):
    torch.manual_seed(0)
    model = TwoLayers()
    base = {name: t.detach().clone() for name, t in model.state_dict().items()}
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["up", "down"], use_rslora=rslora))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            nn.init.normal_(p)  # peft starts B at zero: the merge would be the identity
    adapter = {
        name.replace(".default.", "."): p.detach().clone()
        for name, p in peft_model.named_parameters()
        if "lora_" in name
    }
    config = peft_model.peft_config["default"].to_dict()
    expected = peft_model.merge_and_unload().state_dict()
    merged = dict(merged_weights(base, adapter, config))
    assert set(merged) == {"up.weight", "up.bias", "down.weight"}  # the norm, untouched, stays in the engine
    for name in merged:
        torch.testing.assert_close(merged[name], expected[name])
    assert not torch.equal(merged["up.weight"], base["up.weight"])


def test_merge_reloads_whole_the_modules_whose_layers_it_adapts():
    """vLLM fuses q, k and v (and their biases) into one layer: adapting q alone must reload k and v too."""
    base = {f"model.layers.0.self_attn.{p}.{t}": torch.randn(4, 4) for p in "qkvo" for t in ("weight", "bias")}
    base |= {
        "model.layers.0.mlp.up.weight": torch.randn(4, 4),
        "model.layers.0.norm.weight": torch.ones(4),
        "model.embed.weight": torch.randn(9, 4),
    }
    adapter = {
        "base_model.model.model.layers.0.self_attn.q.lora_A.weight": torch.randn(2, 4),
        "base_model.model.model.layers.0.self_attn.q.lora_B.weight": torch.randn(4, 2),
    }
    merged = dict(merged_weights(base, adapter, {"r": 2, "lora_alpha": 2}))
    assert set(merged) == {name for name in base if ".self_attn." in name}
    a, b = adapter.values()
    torch.testing.assert_close(
        merged["model.layers.0.self_attn.q.weight"], base["model.layers.0.self_attn.q.weight"] + b @ a
    )
    assert all(merged[n] is base[n] for n in merged if ".q." not in n or n.endswith("bias"))  # the rest as it is


def test_merge_refuses_what_it_cannot_merge():
    base = {"up.weight": torch.zeros(8, 6)}
    a, b = torch.ones(4, 6), torch.ones(8, 4)
    config = {"r": 4, "lora_alpha": 8}
    with pytest.raises(ValueError, match="DoRA"):
        merged_weights(base, {}, config | {"use_dora": True})
    with pytest.raises(ValueError, match="not a LoRA A/B matrix"):
        merged_weights(base, {"base_model.model.embed.lora_embedding_A": a}, config)
    with pytest.raises(ValueError, match="not a weight of the base model"):
        merged_weights(
            base, {"base_model.model.other.lora_A.weight": a, "base_model.model.other.lora_B.weight": b}, config
        )
    with pytest.raises(ValueError, match="lacks its A or B"):
        merged_weights(base, {"base_model.model.up.lora_A.weight": a}, config)


def test_stochastic_rounding_to_bf16_keeps_what_nearest_rounding_loses():
    """An adapter's early change to a weight is a fraction of a bf16 ulp: nearest rounding gives the
    base back, stochastic rounding keeps it in expectation, landing on one of the two neighbours."""
    from rlvr.engines.lora_merge import stochastic_round

    weights = torch.randn(4096).to(torch.bfloat16).float()  # representable: the base as a bf16 engine holds it
    ulp = torch.finfo(torch.bfloat16).eps * weights.abs()  # at least the spacing below each weight
    target = weights + 0.1 * ulp * torch.sign(torch.randn(4096))
    assert torch.equal(target.to(torch.bfloat16).float(), weights)  # nearest: the change is gone
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack([stochastic_round(target, torch.bfloat16, generator).float() for _ in range(400)])
    assert ((draws - target).abs() <= 2 * ulp[None]).all()  # one of the two bf16 neighbours
    change, kept = (target - weights), (draws.mean(0) - weights)
    assert abs(float((kept * change).sum() / (change * change).sum()) - 1.0) < 0.1  # unbiased, in aggregate
    assert torch.equal(
        stochastic_round(target, torch.float16, generator), target.to(torch.float16)
    )  # nearest elsewhere


def test_a_bf16_merge_is_drawn_from_the_adapters_own_bytes():
    """The same adapter merges to the same weights (a resumed run, `rlvr eval --run`); another draws anew."""
    base = {"up.weight": torch.randn(8, 6)}
    # a change of a few bf16 ulps (~0.008 at 1): each weight's rounding is a real draw
    adapter = {
        "base_model.model.up.lora_A.weight": 0.05 * torch.randn(4, 6),
        "base_model.model.up.lora_B.weight": 0.05 * torch.randn(8, 4),
    }
    moved = adapter | {"base_model.model.up.lora_A.weight": adapter["base_model.model.up.lora_A.weight"] * (1 + 1e-6)}
    config = {"r": 4, "lora_alpha": 8}
    first, again, other = (
        dict(merged_weights(base, a, config, torch.bfloat16))["up.weight"] for a in (adapter, dict(adapter), moved)
    )
    assert first.dtype == torch.bfloat16 and torch.equal(first, again) and not torch.equal(first, other)
