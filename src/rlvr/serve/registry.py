"""The sessions, models and sampling sessions the server holds, each owned by one tenant.

    registry.open_session(tenant)                    # -> session id
    registry.claim(tenant, model_id, sections, key)  # the model's memory and the tenant's models limit, or refused
    registry.host(key, sections, folder, model_id)   # the base's shared host (built on the worker thread)
    registry.model(model_id, tenant)                 # NotFound for another tenant's, as for none at all
    registry.end_session(session_id, why)            # closes what it made, once its queued work has run

Everything is looked up through the asking tenant: a session id names its tenant, and a model,
sampling session or named sampler path names its session. Memory is claimed when a model is asked
for, not when it is built, so that requests meanwhile count it as held: a model on a base some
other claim already holds (the same host key) claims its adapter's bytes alone.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from rlvr.config import ServeConfig
from rlvr.models.folder import ModelFolder
from rlvr.planning.sections import PlanSections
from rlvr.records import LoraAdapter
from rlvr.serve.base_host import BaseHost, HostKey
from rlvr.serve.fair_queue import Say
from rlvr.serve.model import ServedModel, planned_bytes
from rlvr.serve.refusals import BadRequest, Gone, NotFound, OverLimit
from rlvr.serve.tenants import Tenant
from rlvr.serve.work_line import WorkLine, session_of
from rlvr.training.trainer import TrainerError

# Ended sessions remembered (to answer 410, which stops the SDK's heartbeat), the oldest forgotten first.
_ENDED_KEPT = 10_000


@dataclass
class Session:
    tenant: str
    seen: float  # time.monotonic() when last heard from


@dataclass
class SamplerSession:
    base_model: str
    model_id: str | None  # the training model whose engine samples it (None: a base-model session)
    adapter: LoraAdapter | None  # the snapshot it samples (None: the base)
    model_path: str | None = None


@dataclass
class Claim:
    tenant: str
    host: HostKey
    adapter_bytes: float
    base_bytes: float  # held once for all the claims on one host


@dataclass
class ModelRegistry:
    cfg: ServeConfig
    memory_budget: float  # what the served models may hold together
    work: WorkLine
    say: Say = print  # a line for the server's terminal
    sessions: dict[str, Session] = field(default_factory=dict)
    models: dict[str, ServedModel] = field(default_factory=dict)
    claimed: dict[str, Claim] = field(default_factory=dict)  # models created or being built
    hosts: dict[HostKey, BaseHost] = field(default_factory=dict)  # touched on the worker thread only
    samplers: dict[str, SamplerSession] = field(default_factory=dict)
    named: dict[str, tuple[str, LoraAdapter]] = field(default_factory=dict)  # tinker:// path -> (model id, adapter)
    ended: OrderedDict[str, str] = field(default_factory=OrderedDict)  # ended session id -> its tenant

    def open_session(self, session_id: str, tenant: Tenant) -> None:
        self.sessions[session_id] = Session(tenant.name, time.monotonic())

    def session(self, session_id: str, tenant: Tenant) -> Session:
        """The tenant's live session (heard from now); Gone if it ended, NotFound if it is not the tenant's."""
        session = self.sessions.get(session_id)
        if session is None or session.tenant != tenant.name:
            if self.ended.get(session_id) == tenant.name:
                raise Gone(f"session {session_id} has ended")
            raise NotFound(f"unknown session_id {session_id!r}")
        session.seen = time.monotonic()
        return session

    def claim(self, tenant: Tenant, model_id: str, sections: PlanSections, host: HostKey) -> None:
        """Count the model's planned memory as held, or refuse it if the tenant's models limit or the
        machine's memory leaves no room for it."""
        if model_id in self.claimed:
            raise BadRequest(f"model {model_id} exists (its model_seq_id was used)")
        mine = sum(1 for claim in self.claimed.values() if claim.tenant == tenant.name)
        if mine >= tenant.limits.models:
            raise OverLimit(
                f"limits.models: tenant {tenant.name} has {mine} models (limit {tenant.limits.models}); "
                "end a session to close its models"
            )
        planned = planned_bytes(sections)
        shared = any(claim.host == host for claim in self.claimed.values())
        need = planned.adapter + (0.0 if shared else planned.base)
        held = self.held_bytes()
        if held + need > self.memory_budget:
            others = f", and the {len(self.claimed)} model(s) served hold ~{held / 1e9:.2f} GB" if self.claimed else ""
            what = "its adapter (the base is loaded already)" if shared else planned.parts
            raise BadRequest(
                f"create_model: {sections.model.path} with LoRA rank {sections.trainer.lora.rank} needs "
                f"~{need / 1e9:.2f} GB ({what}){others}, over this server's {self.memory_budget / 1e9:.2f} GB (memory_gb); nothing was loaded"
            )
        self.claimed[model_id] = Claim(tenant.name, host, planned.adapter, planned.base)

    def held_bytes(self) -> float:
        """What the claimed models hold: each its adapter, each host its base once."""
        bases = {claim.host: claim.base_bytes for claim in self.claimed.values()}
        return sum(claim.adapter_bytes for claim in self.claimed.values()) + sum(bases.values())

    def host(self, key: HostKey, sections: PlanSections, folder: ModelFolder, model_id: str) -> BaseHost:
        """The base's host with `model_id`'s adapter on it; the host is built if no model holds one
        (on the worker thread: builds run there)."""
        host = self.hosts.get(key)
        if host is None:
            host = self.hosts[key] = BaseHost(key, sections, folder, self.cfg.max_loras)
            self.say(f"rlvr serve: loaded {key.folder} (LoRA rank {key.rank}, seed {key.seed}) for {model_id}")
        else:
            self.say(f"rlvr serve: {model_id} shares the loaded {key.folder} with {len(host.adapters)} adapter(s)")
        host.adapters.add(model_id)
        return host

    def built(self, model_id: str, model: ServedModel) -> bool:
        """Hold a model built for a claim; False (and the model closed) if its session ended meanwhile."""
        if model_id not in self.claimed:
            self.release(model)
            return False
        self.models[model_id] = model
        return True

    def release(self, model: ServedModel) -> None:
        """Free a closed model's adapter, and its host with the last one (on the worker thread)."""
        host = model.host
        try:
            last = host.forget(model.model_id)
        except TrainerError:  # its ranks are gone: nothing is left to share
            last = True
        if last:
            self.hosts.pop(host.key, None)
            host.close()
            self.say(f"rlvr serve: closed {host.key.folder} (LoRA rank {host.key.rank}, seed {host.key.seed})")

    def model(self, model_id: str, tenant: Tenant) -> ServedModel:
        """The tenant's model; a call on it is as good as its session's heartbeat."""
        session = self.sessions.get(session_of(model_id))
        if model_id not in self.models or session is None or session.tenant != tenant.name:
            raise NotFound(f"unknown model_id {model_id!r}")
        session.seen = time.monotonic()
        return self.models[model_id]

    def sampler(self, sampler_id: str, tenant: Tenant) -> SamplerSession:
        session = self.sessions.get(session_of(sampler_id))
        if sampler_id not in self.samplers or session is None or session.tenant != tenant.name:
            raise NotFound(f"unknown sampling session {sampler_id!r}")
        return self.samplers[sampler_id]

    def named_path(self, path: str, tenant: Tenant) -> tuple[str, LoraAdapter]:
        """The model and adapter a save_weights_for_sampler(name=...) path names, if the tenant's."""
        model_id, adapter = self.named.get(path, ("", None))
        session = self.sessions.get(session_of(model_id))
        if adapter is None or session is None or session.tenant != tenant.name:
            raise NotFound(f"unknown model_path {path!r} (save_weights_for_sampler(name=...) makes one)")
        return model_id, adapter

    def end_session(self, session_id: str, why: str) -> None:
        """Forget a session and what it made; its models close once the work queued before now has run."""
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self.ended[session_id] = session.tenant
            while len(self.ended) > _ENDED_KEPT:
                self.ended.popitem(last=False)
        ended = [model_id for model_id in self.claimed if session_of(model_id) == session_id]
        for model_id in ended:
            self.claimed.pop(model_id)
            model = self.models.pop(model_id, None)  # None: still being built; `built` closes it
            if model is not None:
                self.work.put(session_id, lambda model=model: self.release(model))
        self.samplers = {
            key: s for key, s in self.samplers.items() if session_of(key) != session_id and s.model_id not in ended
        }
        self.named = {path: held for path, held in self.named.items() if held[0] not in ended}
        self.say(f"rlvr serve: session {session_id} {why}" + (f"; closing {', '.join(ended)}" if ended else ""))

    def expire_sessions(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for session_id, session in list(self.sessions.items()):
            if now - session.seen > self.cfg.session_timeout_s:
                self.end_session(session_id, f"expired: nothing heard for {now - session.seen:.0f} s")

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()
