"""The controller's handle on the trainer ranks: start them, feed them, read them, stop them.

    with Trainer(spec, ranks=2) as trainer:
        metrics = trainer.train_step(batch, temperature=1.0)
        adapter = trainer.adapter()

The user never calls torchrun: the ranks are processes this class spawns. A rank that dies
or raises stops the run with its traceback; the others are torn down with it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from dataclasses import replace

import torch

from rlvr.records import LoraAdapter, TrainBatch
from rlvr.training.packing import plan
from rlvr.training.worker import RankSpec, StepInput, run_rank


class TrainerError(RuntimeError):
    pass


class Trainer:
    def __init__(self, spec: RankSpec, ranks: int = 1, micro_batch_tokens: int = 4096, start_timeout_s: float = 600):
        self.spec, self.world_size, self.micro_batch_tokens = spec, ranks, micro_batch_tokens
        self._adapter_version = 0
        self._training = False
        threads = spec.threads or max(1, (os.cpu_count() or 1) // ranks)
        spec = replace(spec, threads=threads)
        ctx = mp.get_context("spawn")
        port = _free_port()
        self._conns, self._procs = [], []
        for rank in range(ranks):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=run_rank, args=(rank, ranks, port, spec, child), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        info = self._gather(timeout_s=start_timeout_s)
        self.trainable_params = info[0]["trainable_params"]
        self.total_params = info[0]["total_params"]
        self.base_format = info[0]["base_format"]  # what the ranks loaded: "nvfp4" or "hf"

    # ------------------------------------------------------------------ commands

    def train_step(self, batch: TrainBatch, temperature: float = 1.0) -> dict[str, float]:
        self.start_train_step(batch, temperature)
        return self.finish_train_step()

    def start_train_step(self, batch: TrainBatch, temperature: float = 1.0) -> None:
        """Hand the step to the ranks and return while they compute (the controller generates
        the next batch meanwhile); finish_train_step() waits for them. No other command may
        come in between: the ranks answer in order."""
        sequences = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids)]
        prompt_lens = [len(p) for p in batch.prompt_ids]
        per_rank = plan(sequences, prompt_lens, self.world_size, self.micro_batch_tokens)
        num_tokens = sum(len(c) for c in batch.completion_ids)
        advantages = batch.advantages.tolist()
        inputs = []
        for micro_batches in per_rank:
            members = [i for mb in micro_batches for i in mb.sequences]
            inputs.append(
                StepInput(
                    micro_batches=micro_batches,
                    advantages={i: advantages[i] for i in members},
                    sampler_logprobs={i: batch.sampler_logprobs[i] for i in members},
                    num_tokens=num_tokens,
                    num_sequences=len(sequences),
                    max_len=max(len(c) for c in batch.completion_ids),
                    temperature=temperature,
                )
            )
        self._send_each("train", inputs)
        self._training = True

    def finish_train_step(self) -> dict[str, float]:
        """The step's metrics, once every rank has finished it; `time/train` is the slowest
        rank's own compute time."""
        self._training = False
        results = self._gather()
        total = {k: sum(r.get(k, 0.0) for r in results) for k in results[0]}
        tokens = max(total.pop("tokens", 0.0), 1.0)
        metrics = {
            "loss": total["loss"],
            "grad_norm": results[0]["grad_norm"],
            "lr": results[0]["lr"],
            "skipped": results[0]["skipped"],
            "policy/entropy": total["entropy_sum"] / tokens,
            "sync/sampler_trainer_gap": total["sampler_gap_sum"] / tokens,
            "time/train": max(r["seconds"] for r in results),
        }
        for key in ("clip_fraction", "approx_kl", "ratio_mean", "kl", "is_weight"):
            if f"{key}_sum" in total:
                metrics[f"policy/{key}"] = total[f"{key}_sum"] / tokens
        return metrics

    def logprobs(self, sequences: list[list[int]], prompt_lens: list[int], temperature: float = 1.0) -> list[list[float]]:
        """The trainer's logprob of every token after each prompt (no gradient)."""
        per_rank = plan(sequences, prompt_lens, self.world_size, self.micro_batch_tokens)
        merged: dict[int, list[float]] = {}
        for part in self._call_each("logprobs", [(mbs, temperature) for mbs in per_rank]):
            merged.update(part)
        return [merged[i] for i in range(len(sequences))]

    def adapter(self) -> LoraAdapter:
        if not self.spec.lora:
            raise TrainerError("adapter(): this trainer runs full fine-tuning; use weights()")
        tensors = self._call_all("adapter")[0]
        config = self._call_all("lora_config")[0]
        self._adapter_version += 1
        return LoraAdapter(tensors=tensors, config=config, version=self._adapter_version)

    def weights(self) -> dict[str, torch.Tensor]:
        return self._call_all("weights")[0]

    def save(self, folder: str) -> None:
        """Every rank writes its shard of the trainable state into `folder` (which must exist)."""
        self._call_all("save", str(folder))

    def load(self, folder: str) -> None:
        self._call_all("load", str(folder))

    def close(self) -> None:
        for conn, proc in zip(self._conns, self._procs):
            if proc.is_alive():
                try:
                    conn.send(("close", None))
                except (BrokenPipeError, OSError):
                    pass
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        self._procs = []

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _call_all(self, command: str, payload=None) -> list:
        return self._call_each(command, [payload] * self.world_size)

    def _call_each(self, command: str, payloads: list) -> list:
        self._send_each(command, payloads)
        return self._gather()

    def _send_each(self, command: str, payloads: list) -> None:
        if self._training:
            raise TrainerError(f"{command}: a train step is in flight; call finish_train_step() first")
        for conn, payload in zip(self._conns, payloads):
            conn.send((command, payload))

    def _gather(self, timeout_s: float | None = None) -> list:
        results = []
        for rank, (conn, proc) in enumerate(zip(self._conns, self._procs)):
            while not conn.poll(1.0 if timeout_s is None else min(1.0, timeout_s)):
                if not proc.is_alive():
                    self.close()
                    raise TrainerError(f"trainer rank {rank} died (exit code {proc.exitcode}); the run stops")
                if timeout_s is not None:
                    timeout_s -= 1.0
                    if timeout_s <= 0:
                        self.close()
                        raise TrainerError(f"trainer rank {rank} did not answer in time")
            status, value = conn.recv()
            if status == "error":
                self.close()
                raise TrainerError(f"trainer rank {rank} failed:\n{value}")
            results.append(value)
        return results


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
