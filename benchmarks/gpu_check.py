"""rlvr's GPU paths on one CUDA device, each checked and timed: the body of benchmarks/gpu_check.sh.

    PYTHONPATH=src python benchmarks/gpu_check.py --out runs/gpu_check/gpu_check.json
    PYTHONPATH=src python benchmarks/gpu_check.py --out /tmp/gpu_check.json --tiny   # the same code, tiny shapes, any device

Four parts, each recorded (figures, or the error and its traceback) whether or not the others pass:
1. environment: torch, CUDA, the device, transformers and peft versions;
2. packed attention on CUDA: rlvr's packed attention (shared prompts, uneven lengths: several
   padded batches) against transformers' sdpa on a prompt copy per sample, logprobs and
   gradients; then forward+backward tokens/s of a packed micro-batch, packed vs sdpa;
3. the NVFP4 trainer: a random model of Qwen2.5-0.5B's shape (24 layers, hidden 896, vocab
   151936, tied), quantized to NVFP4, one FSDP2 rank over NCCL (`Trainer`), LoRA r16 on every
   linear layer, train steps on 16 prompts x 8 samples of 64-512 tokens: step time and tokens/s;
   then the same steps with the model's float weights as the base, for what packing costs;
   The NVFP4 part also records that the packed base went through this torch's FSDP2 (its packed
   parameters DTensors, none an integer tensor: torch 2.11 refused those, and no rank may hold
   the whole base), and sets the measured step against the plan's estimate of the same step at
   the device's nominal peak (rlvr.planning.step_time's train compute, from the mean prompt
   and completion lengths): the achieved TFLOP/s and their share of the peak;
4. RL steps: `rlvr train` on that NVFP4 model, the transformers engine on the same GPU (vLLM is
   not carried), LoRA, a reward that varies between samples of an untrained model: step time,
   its stages and tokens/s;
5. a profile of one NVFP4 train step (torch.profiler): the 15 CUDA kernels that took the most
   time, with their share, for raising the trainer's FLOP/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
from pathlib import Path

import torch

# Qwen2.5-0.5B's shape (its config.json), random weights: no model hub on the GPU machine.
SHAPE_05B = dict(
    hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864, vocab_size=151936
)
SHAPE_TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=512)
# A random model of a 151936-token vocabulary mostly samples ids that rlvr's character tokenizer
# decodes to nothing: how much text a sample holds is what differs between samples, so the
# advantages are not all zero and the steps train.
TEXT_LENGTH = """
def text_length(response, answer):
    return min(1.0, len(response) / 16)
"""


def environment() -> dict:
    import peft
    import transformers

    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {
            "device": props.name,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "devices": torch.cuda.device_count(),
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        }
    return info


def packed_attention(device: torch.device, shape: dict) -> dict:
    """Exactness on the device, then forward+backward throughput of one packed micro-batch."""
    from transformers import AutoModelForCausalLM

    from rlvr.config import TrainerConfig
    from rlvr.models.tiny import tiny_config
    from rlvr.training.attention import use_packed_attention
    from rlvr.training.packing import plan, unpack
    from rlvr.training.policy import TokenLogprobs

    def logprobs_and_grads(model, mb):
        """Logprobs in sequence order (packings order sequences differently) and the gradients."""
        model.zero_grad()
        policy = TokenLogprobs(model, TrainerConfig().logits_chunk_mb)
        lp, _ = policy(
            *(t.to(device) for t in (mb.input_ids, mb.position_ids, mb.score_positions, mb.score_targets)),
            layout=mb.layout.to(device),
        )
        parts = dict(zip(mb.sequences, unpack(lp, mb)))
        sum((p * torch.linspace(-1, 1, len(p), device=device)).sum() for p in parts.values()).backward()
        ordered = torch.cat([parts[i] for i in sorted(parts)]).detach()
        return ordered, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    def batch(vocab, prompt_lens, samples, lengths, seed):
        g = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in prompt_lens]
        sequences = [
            prompts[i // samples] + torch.randint(3, vocab, (n,), generator=g).tolist() for i, n in enumerate(lengths)
        ]
        return sequences, [len(prompts[i // samples]) for i in range(len(lengths))]

    small = tiny_config("qwen2", vocab_size=64, hidden_size=64, num_layers=2, intermediate_size=128)
    torch.manual_seed(0)
    sdpa = AutoModelForCausalLM.from_config(small, attn_implementation="sdpa").to(device)
    packed = AutoModelForCausalLM.from_config(small, attn_implementation="sdpa").to(device)
    packed.load_state_dict(sdpa.state_dict())
    if not use_packed_attention(packed):
        raise RuntimeError("transformers refused rlvr's packed attention")
    sequences, prompt_lens = batch(64, [6, 9], 3, [120, 12, 5, 8, 100, 3], seed=0)
    (shared,) = plan(sequences, prompt_lens, 1, 1024, share_prompts=True)[0]
    (copies,) = plan(sequences, prompt_lens, 1, 1024)[0]
    (lp, grads), (want_lp, want_grads) = logprobs_and_grads(packed, shared), logprobs_and_grads(sdpa, copies)
    result = {
        "padded_batches": len(shared.layout.batches),
        "logprob_max_diff": (lp - want_lp).abs().max().item(),
        "grad_max_rel_diff": max(
            ((g - w).abs().max() / w.abs().max().clamp_min(1e-12)).item() for g, w in zip(grads, want_grads)
        ),
    }
    if result["logprob_max_diff"] > 1e-4 or result["grad_max_rel_diff"] > 1e-4:
        raise RuntimeError(f"packed attention differs from sdpa on {device}: {result}")

    # throughput: 16 prompts x 8 samples of 64-512 tokens, on a 2-layer slice of the checked shape
    config = tiny_config(
        "qwen2",
        vocab_size=shape["vocab_size"],
        hidden_size=shape["hidden_size"],
        num_layers=2,
        num_heads=shape["num_heads"],
        num_kv_heads=shape["num_kv_heads"],
        intermediate_size=shape["intermediate_size"],
    )
    g = torch.Generator().manual_seed(1)
    lengths = [int(64 * 8 ** torch.rand(1, generator=g).item()) for _ in range(128)]
    sequences, prompt_lens = batch(shape["vocab_size"], [128] * 16, 8, lengths, seed=1)
    for name, share in (("sdpa", False), ("packed", True)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16).to(device)
        if share:
            use_packed_attention(model)
        micro_batches = plan(sequences, prompt_lens, 1, 8192, share_prompts=share)[0]
        seconds = []
        for _ in range(3):
            _sync(device)
            started = time.perf_counter()
            for mb in micro_batches:
                logprobs_and_grads(model, mb)
            _sync(device)
            seconds.append(time.perf_counter() - started)
        tokens = sum(mb.num_tokens for mb in micro_batches)
        result[f"{name}_step_s"] = min(seconds[1:])
        result[f"{name}_tokens"] = tokens
        result[f"{name}_tokens_per_s"] = tokens / result[f"{name}_step_s"]
        del model
    result["packed_speedup"] = result["sdpa_step_s"] / result["packed_step_s"]
    return result


def build_nvfp4_model(root: Path, shape: dict) -> Path:
    """A random model of `shape` with rlvr's character tokenizer, saved float, then quantized to NVFP4."""
    from transformers import AutoModelForCausalLM

    from rlvr.models.tiny import build_char_tokenizer, tiny_config
    from rlvr.quant import quantize_checkpoint

    float_dir, nvfp4_dir = root / "model_float", root / "model_nvfp4"
    if (nvfp4_dir / "config.json").is_file():
        return nvfp4_dir
    tokenizer = build_char_tokenizer()
    sizes = {k: v for k, v in shape.items() if k != "vocab_size"}
    config = tiny_config(
        "qwen2",
        vocab_size=shape["vocab_size"],
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        max_position_embeddings=2048,
        **sizes,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(float_dir)
    tokenizer.save_pretrained(float_dir)
    quantize_checkpoint(float_dir, nvfp4_dir, format="nvfp4")
    return nvfp4_dir


def train_batch():
    """16 prompts x 8 samples of 64-512 tokens (the same every call)."""
    from rlvr.records import TrainBatch

    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, 300, (int(n),), generator=g).tolist() for n in torch.randint(64, 192, (16,), generator=g)
    ]
    completions = [
        torch.randint(3, 300, (int(64 * 8 ** torch.rand(1, generator=g).item()),), generator=g).tolist()
        for _ in range(128)
    ]
    return TrainBatch(
        [prompts[i // 8] for i in range(128)],
        completions,
        [[-1.0] * len(c) for c in completions],
        torch.randn(128, generator=g),
        torch.arange(128) // 8,
    )


def trainer_spec(model_dir: Path, dtype: str, steps: int):
    from rlvr.config import AlgorithmConfig, LoraConfig, TrainerConfig
    from rlvr.models.folder import read_model_folder
    from rlvr.training.worker import RankSpec

    return RankSpec(
        folder=read_model_folder(model_dir),
        dtype=dtype,
        trainer=TrainerConfig(
            ranks=1, lr=1e-4, micro_batch_tokens=8192, lora=LoraConfig(rank=16, alpha=32, target_modules="all-linear")
        ),
        algorithm=AlgorithmConfig(),
        seed=0,
        total_steps=steps,
    )


def gpu_kind() -> str | None:
    """This device's entry in rlvr.planning.accelerators, from its name (None: not there)."""
    from rlvr.planning.accelerators import ACCELERATORS

    name = torch.cuda.get_device_name().lower().replace(" ", "") if torch.cuda.is_available() else ""
    return next((k for k in ACCELERATORS if k in name), None)


def planned_train_seconds(model_dir: Path, dtype: str, batch, kind: str) -> tuple[float, float]:
    """The plan's train compute for this batch on a `kind` GPU (mean lengths), and its peak FLOP/s."""
    from rlvr.config import load_config
    from rlvr.planning.accelerators import ACCELERATORS
    from rlvr.planning.architecture import read_architecture
    from rlvr.planning.sections import PlanSections
    from rlvr.planning.step_time import step_time

    prompt = round(statistics.mean(len(p) for p in batch.prompt_ids))
    completion = round(statistics.mean(len(c) for c in batch.completion_ids))
    cfg = PlanSections.of(
        load_config(
            "configs/demo.yaml",
            [
                f"model.path={model_dir}",
                f"model.dtype={dtype}",
                f"placement.gpu={kind}",
                "trainer.ranks=1",
                "trainer.micro_batch_tokens=8192",
                "trainer.lora.rank=16",
                "trainer.lora.target_modules=all-linear",
                "rollout.prompts_per_step=16",
                "rollout.samples_per_prompt=8",
                f"data.max_prompt_tokens={prompt}",
                f"rollout.sampling.max_tokens={completion}",
                "trainer.mini_batches=1",
                "trainer.epochs=1",
                "trainer.gradient_checkpointing=false",
                "algorithm.kl_coef=0",
            ],
        )
    )
    return step_time(cfg, read_architecture(cfg)).train_compute, ACCELERATORS[kind].matmul_flops


class InProcessRank:
    """The one trainer rank in this process, so that the profiler sees its kernels; the
    `Trainer` speaks to it as to a rank process (commands in order, one reply each)."""

    def __init__(self, world_size: int, spec):
        from rlvr.training.rank_host import join_group
        from rlvr.training.trainer import free_port

        self.worker = join_group(0, world_size, "127.0.0.1", free_port(), spec)
        self.reply = ("ok", self.worker.info())

    def send(self, command) -> None:
        from rlvr.training.commands import Close
        from rlvr.training.rank_host import answer

        self.reply = ("ok", None) if isinstance(command, Close) else answer(self.worker, command)

    def receive(self, timeout_s):
        return self.reply

    def stop(self) -> None:
        from rlvr.training.rank_host import leave_group

        leave_group()

    def wait_stopped(self) -> None:
        pass


def trainer_profile(model_dir: Path, dtype: str) -> dict:
    """One NVFP4 train step under torch.profiler, after a warm-up step: where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    from rlvr.training.trainer import Trainer

    batch = train_batch()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with Trainer(trainer_spec(model_dir, dtype, 2), launch=lambda n, spec: [InProcessRank(n, spec)]) as trainer:
        trainer.train_step(batch)
        with profile(activities=activities) as prof:
            trainer.train_step(batch)
        packed = [p for n, p in trainer._ranks[0].worker.policy.named_parameters() if "weight_packed" in n]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    events = [e for e in prof.key_averages() if getattr(e, f"self_{device}_time_total", 0) > 0]
    total = sum(getattr(e, f"self_{device}_time_total") for e in events)
    top = sorted(events, key=lambda e: getattr(e, f"self_{device}_time_total"), reverse=True)[:15]
    from torch.distributed.tensor import DTensor

    return {
        "packed_params": len(packed),
        "packed_all_fsdp2_sharded": bool(packed) and all(isinstance(p, DTensor) for p in packed),
        "packed_dtypes": sorted({str(p.dtype) for p in packed}),
        "device_time_ms": total / 1e3,
        "top": [
            {
                "name": e.key[:120],
                "ms": getattr(e, f"self_{device}_time_total") / 1e3,
                "calls": e.count,
                "share": round(getattr(e, f"self_{device}_time_total") / total, 4),
            }
            for e in top
        ],
    }


def trainer_steps(model_dir: Path, dtype: str, steps: int, base_format: str) -> dict:
    from rlvr.training.trainer import Trainer

    batch = train_batch()
    started = time.perf_counter()
    with Trainer(trainer_spec(model_dir, dtype, steps)) as trainer:
        start_s = time.perf_counter() - started
        report = trainer.wait_started()
        if report.base_format != base_format:
            raise RuntimeError(f"the trainer loaded a {report.base_format} base, not {base_format}")
        seconds, metrics = [], {}
        for _ in range(steps):
            t = time.perf_counter()
            metrics = trainer.train_step(batch)
            seconds.append(time.perf_counter() - t)
        base_bytes = trainer.packed_base_bytes()[0]
    prompts, completions = batch.prompt_ids[::8], batch.completion_ids
    tokens = sum(len(c) for c in completions) + sum(len(p) for p in prompts)
    step_s = statistics.median(seconds[1:])
    out = {
        "start_s": start_s,
        "step_s": step_s,
        "steps_s": seconds,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / step_s,
        "completion_tokens": sum(len(c) for c in completions),
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "packed_base_bytes": base_bytes,
        "trainable_params": report.trainable_params,
        "torch": torch.__version__,
        "finite": all(map(lambda v: v == v and abs(v) != float("inf"), (metrics["loss"], metrics["grad_norm"]))),
    }
    if gpu_kind() is not None:
        seconds_at_peak, peak = planned_train_seconds(model_dir, dtype, batch, gpu_kind())
        out.update(
            planned_train_s=seconds_at_peak,
            achieved_tflops=seconds_at_peak * peak / step_s / 1e12,
            share_of_peak=seconds_at_peak / step_s,
        )
    return out


def rl_steps(root: Path, model_dir: Path, dtype: str, steps: int) -> dict:
    """`rlvr train` for `steps` steps on the NVFP4 model, transformers engine, LoRA, one rank."""
    from rlvr.config import load_config
    from rlvr.data.synthetic import arithmetic_problems, write_jsonl
    from rlvr.orchestration.loop import train

    train_file = root / "task" / "train.jsonl"
    problems, _ = arithmetic_problems(seed=0, operations=["+"], min_digits=1, max_digits=2, train_size=256, test_size=1)
    write_jsonl(problems, train_file)
    (root / "reward.py").write_text(TEXT_LENGTH)
    run_dir = root / "rl_run"
    cfg = load_config(
        "configs/demo.yaml",
        [
            f"run_dir={run_dir}",
            f"steps={steps}",
            f"model.path={model_dir}",
            f"model.dtype={dtype}",
            f"data.train={train_file}",
            "data.test=null",
            "engine.backend=hf",
            "engine.hf_batch_size=64",
            "rollout.prompts_per_step=8",
            "rollout.samples_per_prompt=8",
            "rollout.sampling.max_tokens=64",
            f"reward.verifier={root / 'reward.py'}:text_length",
            "trainer.ranks=1",
            "trainer.lr=1e-4",
            "checkpoint.every=0",
            "tracking.progress=false",
            "engine.sync_check_every=1",  # a check: the probe at every push, not only where no step gap covers it
        ],
    )
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    metrics: list[dict] = []
    train(cfg, progress=lambda step, m: metrics.append(m), log=print)
    timed = metrics[1:] or metrics
    out = {
        k: statistics.median(m[k] for m in timed)
        for k in ("time/step", "time/generate", "time/train", "time/sync", "throughput/tokens_per_s")
    }
    return out | {
        "steps": len(metrics),
        "sync_logprob_gap_max": max(m["sync/logprob_gap"] for m in metrics),
        "reward_mean": [m["reward/mean"] for m in metrics],
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("runs/gpu_check/work"), help="models and runs built here")
    parser.add_argument(
        "--tiny", action="store_true", help="tiny shapes on whatever device there is: a smoke test of this script"
    )
    parser.add_argument("--train-steps", type=int, default=4)
    parser.add_argument("--rl-steps", type=int, default=3)
    args = parser.parse_args()
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check is for a GPU machine (--tiny runs it small anywhere)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = SHAPE_TINY if args.tiny else SHAPE_05B
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    args.work.mkdir(parents=True, exist_ok=True)
    result: dict = {"shape": shape, "dtype": dtype}
    started = time.perf_counter()

    def part(name, fn, *fn_args):
        t = time.perf_counter()
        try:
            result[name] = {"ok": True} | fn(*fn_args)
        except Exception as error:  # the other parts still run and report
            result[name] = {
                "ok": False,
                "error": f"{type(error).__name__}: {error}",
                "traceback": traceback.format_exc(),
                "rank_traceback": getattr(error, "details", None),
            }  # a trainer rank's own (TrainerError)
        result[name]["seconds"] = round(time.perf_counter() - t, 1)
        print(
            f"[gpu_check] {name}: {json.dumps({k: v for k, v in result[name].items() if k != 'traceback'})}", flush=True
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))  # after each part: a timeout still leaves what ran

    part("environment", environment)
    part("packed_attention", packed_attention, device, shape)
    model_dir = None

    def build():
        nonlocal model_dir
        model_dir = build_nvfp4_model(args.work, shape)
        return {"model": str(model_dir)}

    part("nvfp4_model", build)
    if model_dir is not None:
        part("nvfp4_trainer", trainer_steps, model_dir, dtype, args.train_steps, "nvfp4")
        # the same model, its float weights as the base: what the packed base costs in speed
        part("float_trainer", trainer_steps, model_dir.parent / "model_float", dtype, args.train_steps, "hf")
        part("rl_steps", rl_steps, args.work, model_dir, dtype, args.rl_steps)
        part("trainer_profile", trainer_profile, model_dir, dtype)
    result["ok"] = all(v.get("ok", True) for v in result.values() if isinstance(v, dict) and "ok" in v)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(result, indent=2))
    summary = {
        f"{k} {f}": result[k].get(f)
        for k, f in (
            ("packed_attention", "packed_tokens_per_s"),
            ("nvfp4_trainer", "tokens_per_s"),
            ("nvfp4_trainer", "step_s"),
            ("nvfp4_trainer", "achieved_tflops"),
            ("nvfp4_trainer", "share_of_peak"),
            ("float_trainer", "tokens_per_s"),
            ("rl_steps", "throughput/tokens_per_s"),
            ("rl_steps", "time/step"),
        )
        if k in result
    }
    print(
        f"[gpu_check] ok={result['ok']} wall {result['wall_s']} s; {json.dumps(summary)}; wrote {args.out}", flush=True
    )


if __name__ == "__main__":
    main()
