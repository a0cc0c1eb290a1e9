"""One base model's engine and trainer ranks, shared by every LoRA adapter trained on it.

    host = BaseHost(HostKey(path, rank=16, seed=0), sections, folder, max_loras=4)   # folder: path's ModelFolder
    host.use("s1:train:0")                # the ranks switch to that model's adapter state ...
    host.trainer.forward_backward(...)    # ... and train it
    adapter = host.publish("s1:train:0")  # the engine serves it, checked by the sync probe
    rollouts = host.sample_many([(adapter, prompt, n, sampling), (None, prompt, n, sampling)])

Two clients on the same base hold it once: the ranks keep each adapter's weights, gradient,
optimizer state and RNG apart (rlvr.training.adapter_slots) and switch them per request; the
engine serves the adapter a sampling call names: on GPU from one of its LoRA slots, so that the calls
of several adapters share a batch; on CPU merged into the base, one adapter after another.
Adapters share a host when their base, LoRA rank and seed agree: the ranks' tensors have one
shape, and a new adapter starts from the factors the host's seed drew, as it would alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.config import AlgorithmConfig
from rlvr.engines import make_engine
from rlvr.hardware import compute_dtype, local_device
from rlvr.models.folder import ModelFolder
from rlvr.models.multimodal import text_config
from rlvr.planning.sections import PlanSections
from rlvr.records import LoraAdapter, Request, Rollout, Sampling
from rlvr.sync.check import SyncCheck
from rlvr.sync.weights import WeightSync
from rlvr.tracking.timing import StepTimer
from rlvr.training.trainer import Trainer
from rlvr.training.worker import RankSpec

# The version the bare base is served under: an adapter of zeros (B @ A = 0 leaves every weight
# as it was, merged or in a LoRA slot); published snapshots count from 1.
_BASE_VERSION = 0

# The sync check's probe: short exchanges the model reads and answers in its own tokens. Plausible
# tokens, and dozens of them: bf16's rounding moves an unlikely token's logprob most, and the mean
# gap over a handful of arbitrary ids swung past the bf16 threshold on a correctly synced 0.5B.
_PROBE_TEXTS = [
    ("Question: What is 17 + 25?\nAnswer:", " 17 + 25 = 42. The answer is 42."),
    (
        "Question: A box holds 6 rows of 8 eggs. How many eggs are in the box?\nAnswer:",
        " 6 rows of 8 eggs make 6 * 8 = 48 eggs. The answer is 48.",
    ),
    ("def add(a, b):\n", "    return a + b\n"),
]


def sync_probe(model_path: str, max_model_len: int | None) -> list[tuple[list[int], list[int]]]:
    """The probe in the tokens of the model at `model_path`, each exchange cut to `max_model_len`
    (None: the model's own limit, which these few tokens never reach)."""
    from rlvr.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    probe = []
    for prompt, completion in _PROBE_TEXTS:
        prompt_ids, completion_ids = (
            tokenizer(prompt).input_ids,
            tokenizer(completion, add_special_tokens=False).input_ids,
        )
        if max_model_len is not None:
            prompt_ids = prompt_ids[: max_model_len // 2]
            completion_ids = completion_ids[: max_model_len - len(prompt_ids) - 1]  # room for the one token sampled
        probe.append((prompt_ids, completion_ids))
    return probe


@dataclass(frozen=True)
class HostKey:
    """What adapters must agree on to share a host."""

    folder: str
    rank: int
    seed: int


class BaseHost:
    def __init__(self, key: HostKey, sections: PlanSections, folder: ModelFolder, max_loras: int = 1):
        """The engine and ranks of `sections` (rlvr.serve.model.served_sections) on `folder`, the model
        folder at key.folder as the server read it; up to `max_loras` adapters sampled in one batch
        where the engine has LoRA slots."""
        self.key = key
        self.vocab_size = int(text_config(folder.config_dict)["vocab_size"])
        # the schedule is the client's: each optim_step brings its learning rate
        self.trainer = Trainer(
            RankSpec(
                folder=folder,
                dtype=sections.model.dtype,
                trainer=sections.trainer,
                algorithm=AlgorithmConfig(),
                seed=key.seed,
                total_steps=1,
            )
        )
        try:
            self.engine = make_engine(
                folder,
                sections.engine,
                dtype=sections.model.dtype,
                seed=key.seed,
                lora_rank=key.rank,
                max_loras=max_loras,
            )
        except BaseException:
            self.trainer.close()
            raise
        self.sync = WeightSync(
            self.engine,
            self.trainer,
            sync_probe(sections.model.path, sections.engine.max_model_len),
            SyncCheck(sections.engine.sync_threshold(compute_dtype(sections.model.dtype, local_device()).name)),
            StepTimer(),
            lora=True,
        )
        self.adapters: set[str] = set()  # the models trained here
        self._training: str | None = None  # the adapter the ranks hold
        self._published = 0  # versions count over all adapters: the engine tells snapshots apart by them
        self._bare: LoraAdapter | None = None

    def use(self, model_id: str) -> Trainer:
        """The ranks, switched to `model_id`'s adapter."""
        if model_id != self._training:
            self.trainer.use_adapter(model_id)
            self._training = model_id
        return self.trainer

    def forget(self, model_id: str) -> bool:
        """Free a closed model's adapter state; True if no model is left on the host."""
        self.adapters.discard(model_id)
        self.trainer.forget_adapter(model_id)
        if model_id == self._training:
            self._training = None
        return not self.adapters

    def publish(self, model_id: str) -> LoraAdapter:
        """Serve the model's current adapter on the engine; the sync probe checks it arrived."""
        self.use(model_id)
        self._published += 1
        self.sync.push(self._published, used_unchecked=True)
        assert self.sync.serving is not None  # a LoRA push always serves its adapter
        return self.sync.serving

    def sample_many(self, calls: list[tuple[LoraAdapter | None, list[int], int, Sampling]]) -> list[list[Rollout]]:
        """Each call's `n` samples of its prompt from the base with its adapter (a snapshot publish()
        returned; None: the base); each call draws as it would alone (its sampling's seed, the j-th
        sample with seed + j). One engine batch takes the calls of as many adapters as the engine has
        LoRA slots; where it serves one adapter at a time (merged), those of one adapter."""
        drawn: dict[int, list[Rollout]] = {}
        by_adapter: dict[int, list[int]] = {}
        for index, (adapter, *_) in enumerate(calls):
            by_adapter.setdefault(id(adapter), []).append(index)
        groups, width = list(by_adapter.values()), max(1, self.engine.lora_slots)
        for start in range(0, len(groups), width):
            requests = []
            for indices in groups[start : start + width]:
                adapter = self._sampled_by(calls[indices[0]][0])
                requests += [Request(index, *calls[index][1:], adapter=adapter) for index in indices]
            self.engine.submit(requests)
            while not drawn.keys() >= {request.key for request in requests}:
                drawn.update(self.engine.poll())
        return [drawn[index] for index in range(len(calls))]

    def _sampled_by(self, adapter: LoraAdapter | None) -> int | None:
        """What a request names to sample with `adapter` (None: the bare base): its version, held in
        one of the engine's LoRA slots; where the engine has none, None, the policy, switched to it."""
        if not self.engine.lora_slots:
            self.serve(adapter)
            return None
        if adapter is None:
            if self.sync.serving is None:  # nothing published yet: the policy is the bare base
                return None
            adapter = self._bare_base(self.sync.serving)
        self.engine.add_lora(adapter)
        return adapter.version

    def prompt_logprobs(self, adapter: LoraAdapter | None, prompt: list[int]) -> list[float]:
        """The engine's logprob of each prompt token after the first (temperature 1)."""
        self.serve(adapter)
        return self.engine.score([prompt], [1])[0]

    def serve(self, adapter: LoraAdapter | None) -> None:
        """Put `adapter` (None: the bare base) on the engine, if it is not there already."""
        if adapter is None:
            if self.sync.serving is None:  # nothing published yet: the engine holds the base
                return
            adapter = self._bare_base(self.sync.serving)
        if self.engine.lora_slots:
            self.engine.add_lora(adapter)  # back in a slot, if other adapters took the one it had
        if adapter is not self.sync.serving:
            self.sync.serve(adapter)  # a snapshot: checked by the probe when it was published

    def _bare_base(self, like: LoraAdapter) -> LoraAdapter:
        if self._bare is None:
            zeros = {name: torch.zeros_like(tensor) for name, tensor in like.tensors.items()}
            self._bare = LoraAdapter(tensors=zeros, config=like.config, version=_BASE_VERSION)
        return self._bare

    def close(self) -> None:
        self.engine.close()
        self.trainer.close()
