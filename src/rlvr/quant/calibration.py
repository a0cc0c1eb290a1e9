"""The calibration forward of `quantize_checkpoint`: the inputs it runs, and what it shows of each
layer's inputs (their ranges, and which layers read the very same tensor)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from rlvr.models.mistral_layout import TOKENIZER_FILE
from rlvr.models.moe import expert_projections
from rlvr.models.tokenizer import load_tokenizer
from rlvr.quant.experts import expert_hidden

# Tokens per calibration sequence drawn from the vocabulary when the folder has no tokenizer.
CALIBRATION_TOKENS = 64
# Short, varied text for the activation ranges; they only set per-layer input global scales.
DEFAULT_CALIBRATION_TEXTS = (
    "Solve for x: 3x + 7 = 22. First subtract 7 from both sides, then divide by 3, so x = 5.",
    "The quick brown fox jumps over the lazy dog while 1234567890 counts the seconds.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Question: what is the sum of the first 100 positive integers? Answer: \\boxed{5050}",
)


def calibration_inputs(model_dir: Path, vocab_size: int, texts: Sequence[str]) -> tuple[list[torch.Tensor], str]:
    """Token ids `[1, n]` for the calibration forward, and where they came from.

    The folder's tokenizer encodes `texts`. A folder saved with `save_pretrained` alone has no
    tokenizer (transformers then fails, or builds an empty one that encodes nothing): the ids
    are then drawn from the model's own vocabulary, one sequence per text. They only set the
    activation ranges (`input_global_scale`) and show which layers read the same input; the
    weights' own scales need no data.
    """
    try:
        if (model_dir / TOKENIZER_FILE).is_file():  # Mistral's tokenizer, in either layout: the same ids
            from mistral_common.tokens.tokenizers.tekken import Tekkenizer

            tekken = Tekkenizer.from_file(model_dir / TOKENIZER_FILE)
            ids = [tekken.encode(text, bos=True, eos=False) for text in texts]
        else:
            tokenizer = load_tokenizer(model_dir)
            ids = [tokenizer(text).input_ids for text in texts]
    except (OSError, ValueError) as err:
        ids, reason = [], f"no tokenizer ({str(err).splitlines()[0]})"
    else:
        reason = "its tokenizer encodes nothing"
    if ids and all(ids):
        return [torch.tensor([x]) for x in ids], "tokenizer"
    if not vocab_size:
        raise ValueError(
            f"{model_dir}: cannot calibrate NVFP4 activation scales: {reason} and config.json has no vocab_size"
        )
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randint(0, vocab_size, (1, CALIBRATION_TOKENS), generator=generator) for _ in texts
    ], f"vocabulary ({reason})"


def calibrate(
    model: nn.Module, linears: dict[str, nn.Linear], experts: dict[str, nn.Module], inputs: Sequence[torch.Tensor]
):
    """Run `inputs` through `model`. Returns the input amax of each Linear, the groups of Linears
    that read the very same input tensor, and each experts module's input amax per projection
    `[E]`.

    The inputs of one forward are kept alive until it ends, so that `id()` identifies a tensor.
    Experts are calibrated on every token, not only on the tokens routed to them (llm-compressor's
    `calibrate_all_experts`): a short calibration set reaches few experts through the router, and
    an expert left uncalibrated would get an activation scale unrelated to its inputs.
    """
    input_amax: dict[str, torch.Tensor] = {}
    expert_amax: dict[tuple[str, str], torch.Tensor] = {}
    readers_of_first_forward: dict[int, list[str]] = {}
    alive: list[torch.Tensor] = []
    first_forward = True

    def watch(name):
        def hook(_module, args):
            amax = args[0].detach().abs().amax().float()
            input_amax[name] = torch.maximum(input_amax.get(name, amax), amax)
            if first_forward:
                alive.append(args[0])
                readers_of_first_forward.setdefault(id(args[0]), []).append(name)

        return hook

    def watch_experts(name):
        def hook(module, args):
            x = args[0].detach()
            gate_up, down = expert_projections(module)
            seen = {
                gate_up: x.abs().amax().float().expand(module.num_experts),
                down: torch.stack(
                    [expert_hidden(module, e, x).abs().amax().float() for e in range(module.num_experts)]
                ),
            }
            for projection, amax in seen.items():
                key = (name, projection)
                expert_amax[key] = torch.maximum(expert_amax.get(key, amax), amax)

        return hook

    handles = [module.register_forward_pre_hook(watch(name)) for name, module in linears.items()]
    handles += [module.register_forward_pre_hook(watch_experts(name)) for name, module in experts.items()]
    try:
        with torch.no_grad():
            for ids in inputs:
                model(input_ids=ids)
                first_forward = False
                alive.clear()
    finally:
        for handle in handles:
            handle.remove()
    shared_groups = [names for names in readers_of_first_forward.values() if len(names) > 1]
    return input_amax, shared_groups, expert_amax
