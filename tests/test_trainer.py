"""The trainer ranks are real processes running FSDP2 over gloo on a tiny model."""

import pytest
import torch
from _floats import assert_close_scaled
from engine_fixtures import random_train_batch, rank_spec, reference_logprobs
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlvr.models.tiny import build_tiny_model
from rlvr.quant import quantize_checkpoint, write_dequantized_checkpoint
from rlvr.training.packing import plan
from rlvr.training.trainer import Trainer, TrainerError

LORA = dict(rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(
        build_tiny_model(
            tmp_path_factory.mktemp("m") / "tiny", "qwen2", hidden_size=64, num_layers=2, intermediate_size=128
        )
    )


def test_packing_scores_each_completion_token_once_and_balances_ranks():
    seqs = [[1] * 5 + [2] * 3, [1] * 2 + [3] * 6, [1] * 4 + [4]]
    per_rank = plan(seqs, [5, 2, 4], world_size=2, token_budget=9)
    assert len(per_rank[0]) == len(per_rank[1])  # same number of forwards on every rank
    scored = sorted(t for rank in per_rank for mb in rank if not mb.is_empty for t in mb.score_targets.tolist())
    assert scored == sorted([2] * 3 + [3] * 6 + [4])
    assert all(mb.num_tokens <= 9 for rank in per_rank for mb in rank)


def test_shared_prompts_pack_one_copy_and_score_each_completion_from_its_end():
    prompt = [7, 8, 9]
    seqs = [prompt + [2, 3], [5, 6] + [4], prompt + [1, 2, 3], prompt + [6]]
    (micro_batch,) = plan(seqs, [3, 2, 3, 3], world_size=1, token_budget=64, share_prompts=True)[0]
    assert micro_batch.num_tokens == 3 + 2 + 3 + 1 + 2 + 1  # one copy of the shared prompt
    ids, positions = micro_batch.input_ids[0].tolist(), micro_batch.position_ids[0].tolist()
    for i, (start, count) in zip(micro_batch.sequences, micro_batch.spans):
        p = 2 if i == 1 else 3
        at = micro_batch.score_positions[start : start + count].tolist()
        assert micro_batch.score_targets[start : start + count].tolist() == seqs[i][p:]
        assert ids[at[0]] == seqs[i][p - 1] and positions[at[0]] == p - 1  # the prompt's last token
        assert [positions[a] for a in at] == list(range(p - 1, len(seqs[i]) - 1))
        assert [ids[a] for a in at[1:]] == seqs[i][p:-1]
    # a budget too small for the group splits it, each part with its own prompt copy
    parts = plan(seqs, [3, 2, 3, 3], world_size=1, token_budget=7, share_prompts=True)[0]
    assert sorted(i for mb in parts for i in mb.sequences) == [0, 1, 2, 3]
    assert all(mb.num_tokens <= 7 for mb in parts)


# (ranks, shard_ranks): one rank; two sharding every parameter (FSDP); two replicas of it; two
# replicas each sharded over two ranks (HSDP)
LAYOUTS = [(1, None), (2, None), (2, 1), (4, 2)]
# A packed base: HSDP both shards it (each rank holds half) and replicates it (two groups), so
# against one rank it covers what FSDP and replicas would each show (FSDP over 2 ranks trains on
# an NVFP4 base in every 2-rank run of test_day0 and test_e2e as well)
PACKED_LAYOUTS = [(1, None), (4, 2)]


def _each_layout(model_path: str, reference_model, layouts=LAYOUTS) -> dict[tuple, tuple]:
    """For each layout: (logprobs, train-step metrics, updated adapter, packed-base bytes per
    rank), after checking the logprobs against `reference_model`'s; all must train alike."""
    batch = random_train_batch()
    sequences = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids)]
    prompt_lens = [len(p) for p in batch.prompt_ids]
    expected = reference_logprobs(reference_model, sequences, prompt_lens)
    results = {}
    for ranks, shard_ranks in layouts:
        spec = rank_spec(
            model_path, lr=1e-2, lora=LORA, ranks=ranks, shard_ranks=shard_ranks, micro_batch_tokens=14
        )  # 14 splits group 1
        with Trainer(spec) as trainer:
            lp = trainer.logprobs(sequences, prompt_lens)
            metrics = trainer.train_step(batch)
            held = trainer.packed_base_bytes()
            results[ranks, shard_ranks] = (lp, metrics, trainer.adapter().tensors, held)
        assert_close_scaled(sum(lp, []), sum(expected, []))
    _, m1, a1, _ = results[layouts[0]]
    for layout in layouts[1:]:
        _, m2, a2, _ = results[layout]
        assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-5)
        assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
        assert a1.keys() == a2.keys()
        for name in a1:  # the updated adapters agree, so the gradients did
            torch.testing.assert_close(a1[name], a2[name], atol=1e-5, rtol=1e-5)
    return results


@pytest.mark.slow
def test_rank_layouts_match_one_rank_and_transformers(tiny):
    _each_layout(tiny, AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32))


def _packed_layer_bytes(stored: dict[str, torch.Tensor], base_format: str) -> int:
    """Bytes of what the packed layers hold, read from the checkpoint: NVFP4's compressed-tensors
    keys, or NF4's bitsandbytes keys (whose quant_map and quant_state the layers do not keep)."""
    if base_format == "nvfp4":
        layers = {key.removesuffix(".weight_packed") for key in stored if key.endswith(".weight_packed")}
        return sum(t.nbytes for key, t in stored.items() if key.rsplit(".", 1)[0] in layers)
    layers = {key.removesuffix(".weight.absmax") for key in stored if key.endswith(".weight.absmax")}
    return sum(
        stored[f"{layer}.{part}"].nbytes
        for layer in layers
        for part in ("weight", "weight.absmax", "bias")
        if f"{layer}.{part}" in stored
    )


@pytest.mark.slow
@pytest.mark.parametrize("base_format", ["nvfp4", "nf4"])
def test_each_rank_holds_its_share_of_the_packed_base_and_trains_like_one(tiny, tmp_path, base_format):
    packed_dir = quantize_checkpoint(tiny, tmp_path / base_format, format=base_format)
    # transformers on the dequantized weights computes what the packed layers do
    reference = AutoModelForCausalLM.from_pretrained(write_dequantized_checkpoint(packed_dir, tmp_path / "float"))
    results = _each_layout(str(packed_dir), reference, PACKED_LAYOUTS)
    packed_bytes = _packed_layer_bytes(load_file(packed_dir / "model.safetensors"), base_format)
    for (ranks, shard_ranks), (*_, held) in results.items():
        shards = shard_ranks or ranks
        if shards == 1:  # a rank alone, or a replica: every packed tensor, each once
            assert held == [packed_bytes] * ranks
        else:  # its share; the few bytes over are FSDP2's padding and the replicated global scales
            assert all(packed_bytes / shards <= h < 1.04 * packed_bytes / shards for h in held)


@pytest.mark.slow
def test_a_checkpoint_of_replicas_resumes_on_shards(tiny, tmp_path):
    """DCP reshards: what two HSDP replicas saved, two FSDP shards load, optimizer state included
    (the step after the load matches the step after the save)."""
    batch = random_train_batch()
    after = {}
    for shard_ranks in (1, None):
        with Trainer(rank_spec(tiny, lr=1e-2, lora=LORA, ranks=2, shard_ranks=shard_ranks, total_steps=4)) as trainer:
            if shard_ranks == 1:
                trainer.train_step(batch)
                trainer.save(str(tmp_path))
            else:
                trainer.load(str(tmp_path))
            saved = trainer.adapter().tensors
            trainer.train_step(batch)
            after[shard_ranks] = (saved, trainer.adapter().tensors)
    for a, b in zip(after[1], after[None]):
        for name in a:
            torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_a_rank_error_reaches_the_controller_with_its_traceback(tmp_path):
    spec = rank_spec(build_tiny_model(tmp_path / "model", "qwen2", hidden_size=32, num_layers=1, num_heads=2))
    (spec.folder.path / "config.json").unlink()  # gone once the run has read it: the rank's own read fails
    with pytest.raises(TrainerError, match=r"trainer rank 0 failed: Unrecognized model in .*config.json"):
        Trainer(spec).wait_started()


_PAGE_FAULTS_PER_STEP = """
import ctypes, resource, sys, torch
from rlvr.training.rank_host import _M_MMAP_THRESHOLD, keep_freed_memory
# glibc's own start, blocks over 128 KiB mmapped, pinned (its adaptive threshold varies run to
# run), so that without keep_freed_memory every step faults and with it none does
ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, 128 << 10)
if sys.argv[1] == "keep":
    keep_freed_memory()
def step():  # a training step's pattern: activations of a few MiB each, all freed at its end
    activations = [torch.ones(1 << 20) for _ in range(8)]
    return sum(float(a[-1]) for a in activations)
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 10)
"""


def test_a_cpu_rank_keeps_freed_activations_for_the_next_step():
    """keep_freed_memory (every CPU rank calls it first): the pages one step freed serve the
    next step's activations. With glibc's defaults they went back to the OS and faulted in
    again: 12-20k page faults a step on a demo rank, ~8% of its step time."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("keep_freed_memory tunes glibc's allocator; this libc is another")

    def faults_per_step(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _PAGE_FAULTS_PER_STEP, mode], capture_output=True, text=True, check=True
        )
        return int(out.stdout.split()[-1])

    assert faults_per_step("glibc") > 8000  # every one of the 8 x 4 MiB = 8192 pages, every step
    assert faults_per_step("keep") < 8


_RETAINED_AFTER_FREE = """
import torch
from rlvr.training.rank_host import keep_freed_memory
keep_freed_memory()
def private():
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("RssAnon:"))
before = private()
blocks = [torch.ones(4 << 20) for _ in range(8)]  # 16 MiB each: a 0.5B's activation (3,840 tokens x 896 floats is 13.8 MB)
held = private() - before
del blocks
print(held, private() - before)
"""


def test_a_cpu_rank_gives_freed_large_blocks_back():
    """keep_freed_memory keeps small blocks only: 8 blocks of 16 MiB (a real model's activations,
    its dequantized weights) go back to the system when freed: kept in a never-trimmed heap, a
    rank would hold its step's peak between steps."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("keep_freed_memory tunes glibc's allocator; this libc is another")
    out = subprocess.run([sys.executable, "-c", _RETAINED_AFTER_FREE], capture_output=True, text=True, check=True)
    held, retained = (int(n) for n in out.stdout.split()[-2:])
    assert held > 120 << 20 and retained < 4 << 20, (held, retained)


def _rss(pid: int, field: str) -> int:
    """A /proc/PID/status memory field, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(f"{field}:"))


@pytest.mark.slow
def test_a_lora_step_over_a_real_vocabulary_holds_one_logits_chunk(tmp_path):
    """Qwen2.5's 151,936-token vocabulary on two tiny blocks: the LM head is most of a step's
    memory. Over a forward_backward scoring 2,048 tokens a rank's peak grows by about the plan's
    logits row (one chunk of trainer.logits_chunk_mb) and the root FSDP2 gathers, not by the
    micro-batch's logits: 1.2 GB in float32 at once (1024-token chunks held 2.5 GB with their copies)."""
    from rlvr.training.logits_memory import working_bytes

    vocab, budget_mb = 151936, 128
    path = build_tiny_model(
        tmp_path / "m", "qwen2", vocab_size=vocab, hidden_size=64, num_layers=2, intermediate_size=128
    )
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randint(4, 250, (64,), generator=g).tolist() for _ in range(32)]
    targets = [x[1:] + [5] for x in inputs]
    weights = [{"weights": torch.ones(64)} for _ in inputs]
    with Trainer(rank_spec(path, lora=LORA, logits_chunk_mb=budget_mb)) as trainer:
        pid = trainer._ranks[0]._process.pid
        trainer.forward_backward(inputs, targets, "cross_entropy", weights, (0.8, 1.2))  # first-step allocations
        before = _rss(pid, "VmRSS")
        with open(f"/proc/{pid}/clear_refs", "w") as clear:
            clear.write("5")  # VmHWM, the peak resident set, restarts from now
        trainer.forward_backward(inputs, targets, "cross_entropy", weights, (0.8, 1.2))
        grown = _rss(pid, "VmHWM") - before
    logits = working_bytes(2048, budget_mb * 1e6, vocab, 4)
    root = vocab * 64 * 4  # the tied embedding, gathered for the step
    assert logits <= budget_mb * 1e6 and grown < 1.5 * (logits + root), (grown, logits, root)
