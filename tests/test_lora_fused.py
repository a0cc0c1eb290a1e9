"""rlvr's LoRA layer on float Linears (one addmm) against peft's own, on the same weights."""

import copy

import torch
from _floats import assert_close_scaled
from peft import LoraConfig, get_peft_model
from torch import nn

from rlvr.quant import prepare_lora_config
from rlvr.quant.linear import FusedLoraLinear


def _models():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(24, 40), nn.SiLU(), nn.Linear(40, 24, bias=False))
    config = dict(r=4, lora_alpha=8, target_modules=["0", "2"])
    ours = get_peft_model(copy.deepcopy(base), prepare_lora_config(LoraConfig(**config), base))
    theirs = get_peft_model(copy.deepcopy(base), LoraConfig(**config))
    for model in (ours, theirs):  # the same A and B on both (B starts at zero: give it something to add)
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.data = torch.randn(p.shape, generator=torch.Generator().manual_seed(sum(map(ord, name))))
    return ours, theirs


def test_outputs_and_lora_gradients_equal_pefts():
    ours, theirs = _models()
    assert sum(isinstance(m, FusedLoraLinear) for m in ours.modules()) == 2
    x = torch.randn(3, 7, 24)
    out_ours, out_theirs = ours(x), theirs(x)
    # one addmm against peft's separate ops; outputs reach ~1e3 and gradients ~1e7: allowances relative to those
    assert_close_scaled(out_ours, out_theirs)
    out_ours.square().sum().backward()
    out_theirs.square().sum().backward()
    grads = {n: p.grad for n, p in theirs.named_parameters() if p.requires_grad}
    assert len(grads) == 4
    for name, p in ours.named_parameters():
        if p.requires_grad:
            assert_close_scaled(p.grad, grads[name], msg=name)
    assert ours.state_dict().keys() == theirs.state_dict().keys()  # the same adapter files


def test_disabled_adapter_and_merge_take_pefts_paths():
    ours, theirs = _models()
    x = torch.randn(5, 24)
    with ours.disable_adapter(), theirs.disable_adapter():
        torch.testing.assert_close(ours(x), theirs(x))
    torch.testing.assert_close(ours.merge_and_unload()(x), theirs.merge_and_unload()(x))


def test_an_output_in_another_dtype_than_loras_is_summed_as_peft_does():
    ours, theirs = _models()
    for model in (ours, theirs):
        for name, module in model.named_modules():
            if name.endswith("base_layer"):
                module.to(torch.bfloat16)
    x = torch.randn(2, 24, dtype=torch.bfloat16)
    layer = ours.base_model.model[0]
    torch.testing.assert_close(layer(x), theirs.base_model.model[0](x))
