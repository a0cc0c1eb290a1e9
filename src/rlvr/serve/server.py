"""The server's state and the operations its routes share: a catalog of base models, the tenants,
a model registry, the futures store, the work line and the sample batcher.

    server = TinkerServer(cfg)        # reads the keys and checks the catalog's folders, loads nothing
    app = build_app(server)           # rlvr.serve.app: the routes over it

A base model is a name from the catalog (`serve.models`), never a path a client chooses.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from tinker import types

from rlvr.config import ServeConfig
from rlvr.errors import UserError
from rlvr.models.folder import check_model_folder
from rlvr.serve.base_host import HostKey
from rlvr.serve.fair_queue import Say
from rlvr.serve.futures import FutureStore
from rlvr.serve.model import ServedModel, served_sections
from rlvr.serve.refusals import BadRequest, NotFound
from rlvr.serve.registry import ModelRegistry, SamplerSession
from rlvr.serve.sample_batcher import SampleBatcher
from rlvr.serve.saved_states import SavedStates, json_file
from rlvr.serve.tenants import Tenant, Tenants
from rlvr.serve.work_line import WorkLine


def memory_budget(cfg: ServeConfig) -> float:
    """memory_gb, else the GPUs' memory, else the RAM this machine has available now: on a machine
    shared with other processes, its total would admit a model the others leave no room for."""
    if cfg.memory_gb is not None:
        return cfg.memory_gb * 1e9
    import psutil
    import torch

    if torch.cuda.is_available():
        return float(sum(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())))
    return float(psutil.virtual_memory().available)


class TinkerServer:
    def __init__(self, cfg: ServeConfig, say: Say = print, tenants: Tenants | None = None):
        """`tenants`: cfg's, where the caller has read them already (their key files are read once)."""
        if not cfg.models:
            raise UserError("serve: models: no model to serve; map a name to a model folder (models: {NAME: FOLDER})")
        # read once: each base's engine and ranks start from its record
        self.folders = {name: check_model_folder(folder, key=f"models.{name}") for name, folder in cfg.models.items()}
        self.cfg, self.say = cfg, say
        self.tenants = Tenants(cfg) if tenants is None else tenants
        self.futures = FutureStore()
        self.work = WorkLine(self.futures, say)
        self.registry = ModelRegistry(cfg, memory_budget(cfg), self.work, say)  # the budget before any model loads
        self.batcher = SampleBatcher(self.work, self._served)
        self.states = SavedStates(cfg.checkpoint_dir)
        self._counter = 0

    def catalog_folder(self, base_model: str) -> str:
        """The folder of a catalog name; a name outside the catalog is refused with the catalog."""
        if base_model not in self.cfg.models:
            raise BadRequest(
                f"base_model {base_model!r} is not served here; choose one of: {', '.join(self.cfg.models)}"
            )
        return self.cfg.models[base_model]

    def _catalog_name(self, recorded: str) -> str:
        """The catalog name of a base an adapter recorded: its name, or the folder the catalog maps a name to."""
        if recorded in self.cfg.models:
            return recorded
        for name, folder in self.cfg.models.items():
            if Path(folder).resolve() == Path(recorded).resolve():
                return name
        return self.catalog_folder(recorded)  # refused, naming the catalog

    def _served(self, model_id: str) -> ServedModel:
        if model_id not in self.registry.models:
            raise NotFound(f"model {model_id} was closed")
        return self.registry.models[model_id]

    def _next_name(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}-{self._counter}"

    def start_model(
        self,
        tenant: Tenant,
        session_id: str,
        model_seq_id: int,
        base_model: str,
        lora_rank: int,
        seed: int,
        then: Callable[[str], dict],
    ) -> dict:
        """Claim the model's memory now (a request meanwhile counts it as held) and queue its build,
        whose future answers with `then(model_id)` once it is built."""
        folder = self.catalog_folder(base_model)
        sections = served_sections(self.folders[base_model], lora_rank, self.cfg)
        model_id = f"{session_id}:train:{model_seq_id}"
        key = HostKey(folder, lora_rank, seed)
        self.registry.claim(tenant, model_id, sections, key)

        def build() -> dict:
            try:
                model = ServedModel(
                    model_id, base_model, self.registry.host(key, sections, self.folders[base_model], model_id)
                )
            except BaseException:
                self.registry.claimed.pop(model_id, None)
                raise
            if not self.registry.built(model_id, model):
                raise BadRequest(f"session {session_id} ended before its model was built")
            return then(model_id)

        try:
            return self.work.submit(tenant, build, model_id=model_id)
        except BadRequest:
            self.registry.claimed.pop(model_id, None)
            raise

    def save_for_sampler(self, tenant: Tenant, request: types.SaveWeightsForSamplerRequest) -> dict:
        model = self.registry.model(request.model_id, tenant)
        adapter = model.publish()
        if request.path is not None:
            self.states.folder(tenant, request.model_id, request.path)  # the same rule for names as saved states
            path = f"tinker://{request.model_id}/sampler_weights/{request.path}"
            self.registry.named[path] = (request.model_id, adapter)
            return {"path": path, "type": "save_weights_for_sampler"}
        sampler_id = f"{request.model_id}:sample:{request.sampling_session_seq_id}"
        self.registry.samplers[sampler_id] = SamplerSession(model.base_model, request.model_id, adapter)
        return {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}

    def save_state(self, tenant: Tenant, request: types.SaveWeightsRequest) -> dict:
        model = self.registry.model(request.model_id, tenant)
        name = request.path or self._next_name("state")
        folder = self.states.folder(tenant, request.model_id, name)
        if folder.exists():
            if not request.overwrite:
                raise BadRequest(f"checkpoint {name!r} exists; save with overwrite=True to replace it")
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        model.save_state(folder)
        return {"path": self.states.path(request.model_id, name), "type": "save_weights"}

    def load_state(self, tenant: Tenant, request: types.LoadWeightsRequest) -> dict:
        model = self.registry.model(request.model_id, tenant)
        model.load_state(self.states.find(request.path, tenant), optimizer=request.optimizer)
        return {"path": request.path, "model_id": request.model_id, "type": "load_weights"}

    def create_from_state(self, tenant: Tenant, request: types.LoadWeightsRequest) -> dict:
        """create_training_client_from_state(_with_optimizer): a new model on the checkpoint's base
        with its LoRA rank (its adapter_config.json says both), then the checkpoint loaded into it."""
        if request.session_id is None or request.model_seq_id is None:
            raise BadRequest(
                "load_weights: give model_id, or session_id and model_seq_id to create a model from the state"
            )
        self.registry.session(request.session_id, tenant)
        adam_only(request.optimizer_config)
        folder = self.states.find(request.path, tenant)
        adapter = json_file(folder / "adapter" / "adapter_config.json")
        recorded = request.base_model or adapter.get("base_model_name_or_path")
        if not isinstance(recorded, str) or not isinstance(adapter.get("r"), int):
            raise BadRequest("adapter_config.json: no base_model_name_or_path or r to build the model on")
        return self.start_model(
            tenant,
            request.session_id,
            request.model_seq_id,
            self._catalog_name(recorded),
            adapter["r"],
            self.cfg.seed,
            lambda model_id: self.load_state(tenant, request.model_copy(update={"model_id": model_id})),
        )

    def sampler_for(self, tenant: Tenant, request: types.CreateSamplingSessionRequest) -> SamplerSession:
        """What a new sampling session samples: a named snapshot, or a base (sampled by one of the
        tenant's models on it)."""
        if request.model_path is not None:
            model_id, adapter = self.registry.named_path(request.model_path, tenant)
            return SamplerSession(self.registry.models[model_id].base_model, model_id, adapter, request.model_path)
        if request.base_model is not None:
            self.catalog_folder(request.base_model)
            mine = [
                model_id
                for model_id, model in self.registry.models.items()
                if model.base_model == request.base_model and self._owns(tenant, model_id)
            ]
            return SamplerSession(request.base_model, mine[0] if mine else None, None)
        raise BadRequest("create_sampling_session: give base_model or model_path")

    def _owns(self, tenant: Tenant, model_id: str) -> bool:
        try:
            self.registry.model(model_id, tenant)
        except NotFound:
            return False
        return True

    def close(self) -> None:
        self.work.close()
        self.registry.close()


def adam_only(optimizer: object) -> None:
    if optimizer is not None and not isinstance(optimizer, types.AdamOptimizerConfig):
        raise BadRequest(f"optimizer_config: only Adam is served, not {type(optimizer).__name__}")
