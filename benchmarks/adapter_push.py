"""Pushing a ~1 GB LoRA adapter to the engine through the path a GPU run takes, on this CPU:
placement `ray` (the engine in a Ray actor), `engine.merge_lora: false` (vLLM's LoRA layers) and
vLLM's engine core in a process of its own (`engine.in_process: false`, the GPU default).

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/adapter_push.py --out runs/adapter_push.json
    ... --in-process   (the engine core inside the actor, the CPU default)

The model has Qwen2-0.5B's blocks (24 x 896 wide, MLP 4864, 14 heads / 2 KV heads; a tiny
vocabulary) and the adapter rank 512 on all seven linear targets: 1.13 GB of float32, which the
engine really loads (vLLM's largest max_lora_rank is 512). The adapter starts where
`Trainer.adapter()` leaves it, a `LoraAdapter` in the driver, and goes as `WeightSync.push` sends
it: `RayEngine.update_lora` -> Ray (serialisation, the object store) -> `VLLMEngine.update_lora`
in the actor -> `collective_rpc` -> `WeightSyncExtension.rlvr_add_lora` in the worker -> vLLM's
LoRA manager; then one generated token, whose step activates it (vLLM copies it into its LoRA
slots). Two pushes (versions 1 and 2, the second replacing the first as every later sync does).

Written: per push, the wall time of each stage (spans of those functions in each process,
benchmarks/_call_trace.py) and each process's peak memory above its level just before the push
(`private`: resident minus shared pages, i.e. its own copies; `rss`: resident, which also counts
the object store's shared pages a process maps), sampled every 5 ms with psutil.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import _call_trace
from _ledger import append_line, provenance, write_result

MODEL = dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864)
RANK = 512
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TRACED = {
    "rlvr.orchestration.ray_placement": ["RayEngine.update_lora"],
    "ray._private.serialization": ["SerializationContext.serialize", "SerializationContext.deserialize_objects"],
    "rlvr.engines.vllm_engine": ["VLLMEngine.update_lora"],
    "vllm.entrypoints.llm": ["LLM.collective_rpc"],
    "vllm.v1.serial_utils": ["MsgpackEncoder.encode", "MsgpackDecoder.decode"],
    "rlvr.engines.vllm_worker": ["WeightSyncExtension.rlvr_add_lora"],
    "vllm.lora.lora_model": ["LoRAModel.from_lora_tensors"],
    "vllm.lora.model_manager": ["LoRAModelManager._add_adapter", "LoRAModelManager.activate_adapter"],
}
ROLES = {"driver": None, "engine actor": "EngineActor", "engine core": "VLLM::EngineCore", "worker": "VLLM::Worker"}


def build_model(folder: Path) -> Path:
    from rlvr.models.tiny import build_tiny_model

    if not (folder / "config.json").exists():
        build_tiny_model(folder, "qwen2", **MODEL)
    return folder


def random_adapter(model_dir: Path | str, version: int, rank: int = RANK):
    """A rank-`rank` adapter on every target of the model, in PEFT naming, float32."""
    import torch
    from peft import LoraConfig
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    generator = torch.Generator().manual_seed(version)
    tensors = {}
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in TARGETS:
            out_features, in_features = module.weight.shape
            prefix = f"base_model.model.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator) * 0.01
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS).to_dict()
    config["target_modules"] = sorted(config["target_modules"])
    from rlvr.records import LoraAdapter

    return LoraAdapter(tensors=tensors, config=config, version=version)


class MemoryWatch:
    """Samples each role's process every 5 ms; peaks above the levels at `start`."""

    def __init__(self):
        import psutil

        self.processes = {}
        for process in [psutil.Process()] + psutil.Process().children(recursive=True):
            try:
                command = " ".join(process.cmdline())
            except psutil.Error:
                continue
            for role, marker in ROLES.items():
                if (marker is None and process.pid == os.getpid()) or (marker and marker in command):
                    self.processes[role] = process
        missing = set(ROLES) - set(self.processes) - ({"engine core", "worker"} if self.in_process else set())
        if missing:
            raise RuntimeError(f"processes not found: {sorted(missing)}")

    in_process = False

    @staticmethod
    def _levels(process) -> tuple[int, int]:
        info = process.memory_info()
        return info.rss, info.rss - info.shared

    def start(self):
        self.base = {role: self._levels(p) for role, p in self.processes.items()}
        self.peak = dict(self.base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            for role, process in self.processes.items():
                rss, private = self._levels(process)
                peak = self.peak[role]
                self.peak[role] = (max(peak[0], rss), max(peak[1], private))
            time.sleep(0.005)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return {
            role: {
                "rss_gb": round((self.peak[role][0] - base[0]) / 1e9, 3),
                "private_gb": round((self.peak[role][1] - base[1]) / 1e9, 3),
            }
            for role, base in self.base.items()
        }


def stage_times(trace_dir: str, start: float, end: float, roles: dict[int, str]) -> dict:
    """Seconds in each traced function per process within [start, end] (calls under 1 ms left out)."""
    totals: dict[str, float] = {}
    for span in _call_trace.spans(trace_dir):
        seconds = span["end"] - span["start"]
        if span["start"] >= start and span["end"] <= end and seconds >= 1e-3:
            key = f"{roles.get(span['pid'], 'pid ' + str(span['pid']))}: {span['name'].rpartition('.')[0].rpartition('.')[2]}.{span['name'].rpartition('.')[2]}"
            totals[key] = round(totals.get(key, 0.0) + seconds, 3)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rlvr_adapter_push")
    parser.add_argument("--in-process", action="store_true", help="the engine core inside the actor (CPU default)")
    parser.add_argument("--note", default="", help="what this run measures (the code state), for the ledger")
    args = parser.parse_args()

    trace_dir = tempfile.mkdtemp(prefix="adapter_push_trace_")
    _call_trace.install(TRACED, trace_dir)
    site = _call_trace.sitecustomize_dir(Path(trace_dir) / "site")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(site), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    )

    import torch

    from rlvr.config import EngineConfig, ModelConfig, PlacementConfig
    from rlvr.engines import make_engine
    from rlvr.models.folder import read_model_folder
    from rlvr.orchestration.ray_placement import RayCluster
    from rlvr.records import Sampling

    model_dir = build_model(args.work / "model")
    cluster = RayCluster.shared(PlacementConfig(backend="ray"), ranks=1)
    engine_config = EngineConfig(
        backend="vllm", merge_lora=False, in_process=args.in_process, max_model_len=64, kv_cache_gb=0.25
    )
    pushes = []
    model = ModelConfig(path=str(model_dir))
    with make_engine(
        read_model_folder(model.path), engine_config, dtype=model.dtype, seed=0, lora_rank=RANK, placement=cluster
    ) as engine:
        MemoryWatch.in_process = args.in_process
        watch = MemoryWatch()
        roles = {p.pid: role for role, p in watch.processes.items()}
        adapter_bytes = 0
        for version in (1, 2):
            adapter = random_adapter(model_dir, version)
            adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.tensors.values())
            watch.start()
            start = time.time()
            engine.update_lora(adapter)
            pushed = time.time()
            engine.generate([[5, 6, 7]], 1, Sampling(temperature=0.0, max_tokens=1))
            end = time.time()
            memory = watch.stop()
            pushes.append(
                {
                    "version": version,
                    "update_lora_s": round(pushed - start, 3),
                    "first_generate_s": round(end - pushed, 3),
                    "stages_s": stage_times(trace_dir, start, end, roles),
                    "peak_above_start_gb": memory,
                }
            )
            del adapter
    result = {
        "what": "one push of a LoRA adapter, driver to vLLM's LoRA slots, placement ray, merge_lora false",
        "note": args.note,
        "engine_core": "in the actor's process" if args.in_process else "its own process (the GPU default)",
        "model": {**MODEL, "shapes_of": "Qwen2-0.5B's blocks"},
        "adapter": {
            "rank": RANK,
            "targets": TARGETS,
            "dtype": "float32",
            "bytes": adapter_bytes,
            "tensors": 2 * len(TARGETS) * MODEL["num_layers"],
        },
        "pushes": pushes,
        "torch_threads": torch.get_num_threads(),
        **provenance(),
    }
    write_result(args.out, result)
    last = pushes[-1]
    memory = ", ".join(f"{role} {m['private_gb']:.2f} GB" for role, m in last["peak_above_start_gb"].items())
    append_line(
        f"adapter push ({args.note or 'this code'}), {adapter_bytes / 1e9:.2f} GB float32 LoRA (rank {RANK}, "
        f"Qwen2-0.5B blocks), placement ray, merge_lora false, engine core {result['engine_core']}: second push "
        f"**update_lora {last['update_lora_s']:.2f} s** + first generate {last['first_generate_s']:.2f} s; "
        f"peak private memory above start: {memory}",
        result,
    )


if __name__ == "__main__":
    sys.exit(main())
