"""The Tinker API over HTTP: the routes the unmodified `tinker` SDK calls, on rlvr's trainer and engine.

    rlvr serve --port 8000          # then: tinker.ServiceClient(base_url="http://127.0.0.1:8000")

Every training or sampling call answers at once with a request id; the work runs on one worker
thread, the sessions' calls taken in turn (rlvr.serve.fair_queue), each session's in arrival
order except that a model's training calls run in the order of their seq_id (the SDK sends
forward_backward chunks in parallel). `retrieve_future` holds a poll until the
result is there or _HOLD_S has passed, then says try_again. A request that is malformed or
names what does not exist gets a 400 with its reason, and the model is left as it was.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from tinker import types

from rlvr.config import RunConfig, ServeConfig
from rlvr.errors import UserError
from rlvr.models.folder import check_model_folder
from rlvr.records import LoraAdapter, Sampling
from rlvr.serve.fair_queue import FairQueue
from rlvr.serve.model import ServedModel, planned_bytes, served_run
from rlvr.serve.protocol import BadRequest, forward_backward_output, read_forward_backward, sample_response

# The SDK waits 45 s for each retrieve_future answer; holding a poll for less keeps it under that.
_HOLD_S = 30.0
_KEEP_S = 600.0
_PROTOBUF = "application/x-protobuf"


class RequestLog:
    """One line per request kind every `every_s` seconds, with its count (a client polls retrieve_future
    many times a second: a line per request would drown everything else)."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self._counts: Counter[str] = Counter()
        self._refused: Counter[str] = Counter()

    def add(self, kind: str, status: int) -> None:
        self._counts[kind] += 1
        if status >= 400:
            self._refused[kind] += 1

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            self.flush()

    def flush(self) -> None:
        for kind, count in sorted(self._counts.items()):
            refused = f", {self._refused[kind]} refused" if self._refused[kind] else ""
            print(f"rlvr serve: {kind}: {count} in {self.every_s:g} s{refused}", flush=True)
        self._counts.clear()
        self._refused.clear()


@dataclass
class SamplerSession:
    base_model: str
    model_id: str | None  # the training model whose engine samples it (None: a base-model session)
    adapter: LoraAdapter | None  # the snapshot it samples (None: the base)
    model_path: str | None = None


@dataclass
class PendingSample:
    request: types.SampleRequest
    prompt: list[int]  # the request's tokens, checked against the vocabulary
    sampler: SamplerSession
    sampling: Sampling
    future: concurrent.futures.Future


def _memory_budget(cfg: ServeConfig) -> float:
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
    """Sessions, models, sampling sessions and futures; `app` is the ASGI application."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.sessions: dict[str, float] = {}  # session id -> when it was last heard from (time.monotonic)
        self.models: dict = {}  # model id -> rlvr.serve.model.ServedModel
        self._claimed: dict[str, float] = {}  # models created or being built -> the memory planned for each
        self._memory_budget = _memory_budget(cfg)  # before any model loads: what the served models may hold together
        self.samplers: dict[str, SamplerSession] = {}
        self.named: dict[str, tuple[str, LoraAdapter]] = {}  # tinker:// path -> (model id, adapter)
        self.futures: dict[str, concurrent.futures.Future] = {}
        self._done_at: dict[str, float] = {}  # request id -> when its future was done (time.monotonic)
        self._next_seq: dict[str, int] = {}  # model id -> the seq_id its next training call must carry
        self._waiting: dict[str, dict[int, Callable | None]] = {}  # model id -> seq_id -> work (None: refused)
        self._work = FairQueue()
        self._to_sample: dict[str, list[PendingSample]] = {}  # model id -> sampling calls waiting for its batch
        self._batch_lock = threading.Lock()  # the routes add to a batch while the worker takes one
        self._ids = itertools.count(1)
        self.log = RequestLog(cfg.log_every_s)
        self.app = self._routes()

    # ------------------------------------------------------------------ futures

    def _submit(
        self,
        work: Callable,
        model_id: str | None = None,
        seq_id: int | None = None,
        *,
        session: str | None = None,
        **extra,
    ) -> dict:
        """Queue `work` in its session's line (a model's training calls by seq_id); the SDK's UntypedAPIFuture."""
        request_id, future = self._future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(work())
                except BaseException as error:  # reported to the client through retrieve_future
                    future.set_exception(error)

        if model_id is None or seq_id is None:
            self._work.put(session or _session_of(model_id), run)
        else:
            self._in_order(model_id, seq_id, run)
        return {"request_id": request_id, "model_id": model_id, **extra}

    def _future(self) -> tuple[str, concurrent.futures.Future]:
        """A new request's future; results retrievable for _KEEP_S after they are done (the SDK
        retrieves at once, and again only when a poll was lost), then forgotten."""
        now = time.monotonic()
        for old in [rid for rid, done in self._done_at.items() if now - done > _KEEP_S]:
            self.futures.pop(old, None)
            self._done_at.pop(old)
        request_id = f"req-{next(self._ids)}"
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.add_done_callback(lambda _: self._done_at.__setitem__(request_id, time.monotonic()))
        self.futures[request_id] = future
        return request_id, future

    def _in_order(self, model_id: str, seq_id: int, run: Callable | None) -> None:
        """Run a model's training calls by seq_id: a later one waits for the ones before it; a refused
        one (`run` None) still takes its turn, so that the calls after it are not held forever."""
        expected = self._next_seq.setdefault(model_id, 1)
        if seq_id < expected or seq_id in self._waiting.setdefault(model_id, {}):
            raise BadRequest(f"seq_id {seq_id} of model {model_id} was already used (the next is {expected})")
        waiting = self._waiting[model_id]
        waiting[seq_id] = run
        while self._next_seq[model_id] in waiting:
            ready = waiting.pop(self._next_seq[model_id])
            self._next_seq[model_id] += 1
            if ready is not None:
                self._work.put(_session_of(model_id), ready)

    async def _retrieve(self, request_id: str) -> Response:
        future = self.futures.get(request_id)
        if future is None:
            return _refuse(f"unknown request_id {request_id!r}", status=404)
        wrapped = asyncio.wrap_future(future)
        done, _ = await asyncio.wait([wrapped], timeout=_HOLD_S)  # never cancels the work itself
        if not done:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        error = future.exception()
        if error is not None:
            user = isinstance(error, (BadRequest, ValueError)) or getattr(error, "user_error", False)
            return JSONResponse({"error": f"{type(error).__name__}: {error}", "category": "user" if user else "server"})
        result = future.result()
        if isinstance(result, bytes):
            return Response(result, media_type=_PROTOBUF)
        return JSONResponse(result)

    # ------------------------------------------------------------------ the work

    def _claim(self, model_id: str, run: RunConfig) -> None:
        """Count the model's planned memory as held, or refuse it (BadRequest) if the machine cannot hold it too."""
        need, parts = planned_bytes(run)
        held = sum(self._claimed.values())
        budget = self._memory_budget
        if held + need > budget:
            others = (
                f", and the {len(self._claimed)} model(s) served hold ~{held / 1e9:.2f} GB" if self._claimed else ""
            )
            raise BadRequest(
                f"create_model: {run.model.path} with LoRA rank {run.trainer.lora.rank} needs ~{need / 1e9:.2f} GB "
                f"({parts}){others}, over this server's {budget / 1e9:.2f} GB (memory_gb); nothing was loaded"
            )
        self._claimed[model_id] = need

    def _start_model(
        self, session_id: str, model_seq_id: int, run: RunConfig, seed: int, then: Callable[[str], dict]
    ) -> dict:
        """Claim the model's memory now (a request meanwhile counts it as held) and queue its build,
        whose future answers with `then(model_id)` once it is built."""
        model_id = f"{session_id}:train:{model_seq_id}"
        if model_id in self._claimed:
            raise BadRequest(f"model {model_id} exists (model_seq_id {model_seq_id} was used)")
        self._claim(model_id, run)

        def build() -> dict:
            try:
                model = ServedModel(model_id, run, seed)
            except BaseException:
                self._claimed.pop(model_id, None)
                raise
            if model_id not in self._claimed:  # its session ended while it was being built
                model.close()
                raise BadRequest(f"session {session_id} ended before its model was built")
            self.models[model_id] = model
            return then(model_id)

        return self._submit(build, model_id=model_id)

    def _model(self, model_id: str):
        if model_id not in self.models:
            raise BadRequest(f"unknown model_id {model_id!r}")
        session_id = _session_of(model_id)
        if session_id in self.sessions:  # a call on a model is as good as a heartbeat
            self.sessions[session_id] = time.monotonic()
        return self.models[model_id]

    def end_session(self, session_id: str, why: str) -> None:
        """Forget a session and what it made; its models close once the work queued before now has run."""
        self.sessions.pop(session_id, None)
        ended = [model_id for model_id in self._claimed if _session_of(model_id) == session_id]
        for model_id in ended:
            self._claimed.pop(model_id)
            model = self.models.pop(model_id, None)  # None: still being built, _start_model's build closes it
            if model is not None:
                self._work.put(session_id, model.close)
        self.samplers = {
            key: s for key, s in self.samplers.items() if _session_of(key) != session_id and s.model_id not in ended
        }
        self.named = {
            path: (model_id, adapter) for path, (model_id, adapter) in self.named.items() if model_id not in ended
        }
        print(
            f"rlvr serve: session {session_id} {why}" + (f"; closing {', '.join(ended)}" if ended else ""), flush=True
        )

    def expire_sessions(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for session_id, seen in list(self.sessions.items()):
            if now - seen > self.cfg.session_timeout_s:
                self.end_session(session_id, f"expired: nothing heard for {now - seen:.0f} s")

    def _save_for_sampler(self, request: types.SaveWeightsForSamplerRequest) -> dict:
        model = self._model(request.model_id)
        adapter = model.publish()
        if request.path is not None:
            path = f"tinker://{request.model_id}/sampler_weights/{request.path}"
            self.named[path] = (request.model_id, adapter)
            return {"path": path, "type": "save_weights_for_sampler"}
        sampler_id = f"{request.model_id}:sample:{request.sampling_session_seq_id}"
        self.samplers[sampler_id] = SamplerSession(model.base_model, request.model_id, adapter)
        return {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}

    def _state_folder(self, model_id: str, name: str) -> Path:
        if not name or name in (".", "..") or "/" in name or "\\" in name:
            raise BadRequest(f"checkpoint name {name!r}: give a name without slashes")
        return Path(self.cfg.checkpoint_dir) / model_id.replace(":", "_") / name

    def _save_state(self, request: types.SaveWeightsRequest) -> dict:
        model = self._model(request.model_id)
        name = request.path or f"state-{next(self._ids)}"
        folder = self._state_folder(request.model_id, name)
        if folder.exists():
            if not request.overwrite:
                raise BadRequest(f"checkpoint {name!r} exists ({folder}); save with overwrite=True to replace it")
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        model.save_state(folder)
        return {"path": f"tinker://{request.model_id}/weights/{name}", "type": "save_weights"}

    def _load_state(self, request: types.LoadWeightsRequest) -> dict:
        model = self._model(request.model_id)
        model.load_state(self._saved_state(request.path), optimizer=request.optimizer)
        return {"path": request.path, "model_id": request.model_id, "type": "load_weights"}

    def _create_from_state(self, request: types.LoadWeightsRequest) -> dict:
        """create_training_client_from_state(_with_optimizer): a new model on the checkpoint's base
        with its LoRA rank (its adapter_config.json says both), then the checkpoint loaded into it."""
        if request.session_id is None or request.model_seq_id is None:
            raise BadRequest(
                "load_weights: give model_id, or session_id and model_seq_id to create a model from the state"
            )
        self._session(request.session_id)
        _adam_only(request.optimizer_config)
        folder = self._saved_state(request.path)
        adapter = _json_file(folder / "adapter" / "adapter_config.json")
        base_model = request.base_model or adapter.get("base_model_name_or_path")
        if not isinstance(base_model, str) or not isinstance(adapter.get("r"), int):
            raise BadRequest(
                f"{folder / 'adapter' / 'adapter_config.json'}: no base_model_name_or_path or r to build the model on"
            )
        check_model_folder(base_model, key="base_model")
        run = served_run(base_model, adapter["r"], self.cfg)
        return self._start_model(
            request.session_id,
            request.model_seq_id,
            run,
            self.cfg.seed,
            lambda model_id: self._load_state(request.model_copy(update={"model_id": model_id})),
        )

    def _saved_state(self, path: str) -> Path:
        """The folder of a tinker://MODEL_ID/weights/NAME path save_state returned (this server's or an earlier one's)."""
        model_id, kind, name = (path.removeprefix("tinker://").rsplit("/", 2) + ["", "", ""])[:3]
        folder = self._state_folder(model_id, name) if path.startswith("tinker://") and kind == "weights" else None
        if folder is None or not (folder / "trainer").is_dir():
            raise BadRequest(f"{path!r} is not a checkpoint save_state wrote under {self.cfg.checkpoint_dir}")
        return folder

    def _queue_sample(
        self, request: types.SampleRequest, prompt: list[int], sampler: SamplerSession, sampling: Sampling
    ) -> str:
        """Add a sampling call to its model's batch; the first call of a batch queues the batch's turn."""
        request_id, future = self._future()
        with self._batch_lock:
            batch = self._to_sample.setdefault(sampler.model_id, [])
            batch.append(PendingSample(request, prompt, sampler, sampling, future))
            first = len(batch) == 1
        if first:
            self._work.put(_session_of(sampler.model_id), lambda: self._sample_batch(sampler.model_id))
        return request_id

    def _sample_batch(self, model_id: str) -> None:
        """Every sampling call of the model that arrived before its turn came, in one engine batch:
        the cookbook sends a step's groups as concurrent calls, which one by one would each wait for
        the engine to run a few sequences. Each call's samples are drawn as alone (its own seeds)."""
        with self._batch_lock:
            batch = [item for item in self._to_sample.pop(model_id, []) if item.future.set_running_or_notify_cancel()]
        try:
            model = self._model(model_id)
            scored = {}
            for item in batch:
                if item.request.prompt_logprobs:
                    try:
                        scored[id(item)] = model.prompt_logprobs(
                            item.sampler.adapter, item.prompt, item.request.prompt_logprobs_last_n
                        )
                    except BadRequest as error:
                        item.future.set_exception(error)
            live = [item for item in batch if not item.future.done()]
            drawn = model.sample_many(
                [(item.sampler.adapter, item.prompt, item.request.num_samples, item.sampling) for item in live]
            )
            for item, rollouts in zip(live, drawn):
                item.future.set_result(sample_response(rollouts, scored.get(id(item))))
        except BaseException as error:  # reported to each client through retrieve_future
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)

    # ------------------------------------------------------------------ routes

    def _routes(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(_):
            log_lines = asyncio.create_task(self.log.run())
            expiry = asyncio.create_task(self._expire_every(min(5.0, self.cfg.session_timeout_s / 2)))
            yield
            log_lines.cancel()
            expiry.cancel()
            self.log.flush()
            # here, not after uvicorn.run: on SIGTERM uvicorn re-raises the signal once it has shut down
            self.close()

        app = FastAPI(title="rlvr serve: the Tinker API", lifespan=lifespan)

        @app.middleware("http")
        async def count(request: Request, call_next):
            response = await call_next(request)
            route = request.scope.get("route")  # the template (samplers/{sampler_id}), not the id
            path = route.path if route else f"{request.url.path} (no such route)"
            self.log.add(path.removeprefix("/api/v1/"), response.status_code)
            return response

        @app.exception_handler(UserError)  # BadRequest, and a model folder that is not one
        async def bad_request(_, error: UserError):
            return _refuse(str(error))

        @app.exception_handler(ValidationError)
        async def invalid(_, error: ValidationError):
            first = error.errors()[0]
            return _refuse(f"{error.title}: {'.'.join(map(str, first['loc']))}: {first['msg']}")

        @app.get("/api/v1/healthz")
        async def healthz():
            return {"status": "ok"}

        @app.post("/api/v1/telemetry")
        async def telemetry():
            return {"status": "accepted"}  # the SDK's own error reports: not kept

        @app.post("/api/v1/client/config")
        async def client_config():
            return {"pjwt_auth_enabled": False}

        @app.post("/api/v1/create_session")
        async def create_session(request: Request):
            types.CreateSessionRequest.model_validate(await request.json())
            session_id = f"session-{uuid.uuid4().hex[:12]}"
            self.sessions[session_id] = time.monotonic()
            return {"type": "create_session", "session_id": session_id}

        @app.post("/api/v1/session_heartbeat")
        async def session_heartbeat(request: Request):
            self._session(types.SessionHeartbeatRequest.model_validate(await request.json()).session_id)
            return {"type": "session_heartbeat"}

        @app.post("/api/v1/sessions/{session_id}/finish")
        async def finish_session(session_id: str):
            self._session(session_id)
            self.end_session(session_id, "finished by its client")
            return {}

        @app.post("/api/v1/create_model")
        async def create_model(request: Request):
            body = types.CreateModelRequest.model_validate(await request.json())
            self._session(body.session_id)
            if body.lora_config is None:
                raise BadRequest("create_model: full fine-tuning is not served; ask for LoRA (lora_config.rank)")
            if not (body.lora_config.train_attn and body.lora_config.train_mlp):
                raise BadRequest("lora_config: LoRA on attention and MLP both is all this server trains")
            _adam_only(body.optimizer_config)
            check_model_folder(body.base_model, key="base_model")
            run = served_run(body.base_model, body.lora_config.rank, self.cfg)
            seed = self.cfg.seed if body.lora_config.seed is None else body.lora_config.seed
            return self._start_model(
                body.session_id,
                body.model_seq_id,
                run,
                seed,
                lambda model_id: {"model_id": model_id, "type": "create_model"},
            )

        @app.post("/api/v1/get_info")
        async def get_info(request: Request):
            model = self._model(types.GetInfoRequest.model_validate(await request.json()).model_id)
            return {
                "type": "get_info",
                "model_id": model.model_id,
                "is_lora": True,
                "lora_rank": model.rank,
                "model_name": model.base_model,
                "model_data": {"arch": None, "model_name": model.base_model, "tokenizer_id": model.base_model},
            }

        @app.post("/api/v1/forward_backward")
        async def forward_backward(request: Request):
            batch = read_forward_backward(await request.body())
            model = self._model(batch.model_id)
            try:
                checked = model.check(batch)  # refused here, before the call takes its turn
            except BadRequest:
                self._in_order(batch.model_id, batch.seq_id, None)
                raise

            def work() -> bytes:
                logprobs, loss = model.forward_backward(checked)
                return forward_backward_output(logprobs, {"loss:sum": loss})

            return self._submit(work, batch.model_id, batch.seq_id)

        @app.post("/api/v1/optim_step")
        async def optim_step(request: Request):
            body = types.OptimStepRequest.model_validate(await request.json())
            model = self._model(body.model_id)
            if not isinstance(body.optim_params, types.AdamParams):
                self._in_order(body.model_id, body.seq_id, None)
                raise BadRequest(f"optim_step: only AdamParams are supported, not {type(body.optim_params).__name__}")
            return self._submit(lambda: {"metrics": model.optim_step(body.optim_params)}, body.model_id, body.seq_id)

        @app.post("/api/v1/save_weights_for_sampler")
        async def save_weights_for_sampler(request: Request):
            body = types.SaveWeightsForSamplerRequest.model_validate(await request.json())
            self._model(body.model_id)
            return self._submit(lambda: self._save_for_sampler(body), body.model_id, body.seq_id)

        @app.post("/api/v1/save_weights")
        async def save_weights(request: Request):
            body = types.SaveWeightsRequest.model_validate(await request.json())
            self._model(body.model_id)
            return self._submit(lambda: self._save_state(body), body.model_id, body.seq_id)

        @app.post("/api/v1/load_weights")
        async def load_weights(request: Request):
            body = types.LoadWeightsRequest.model_validate(await request.json())
            if body.model_id is None:
                return self._create_from_state(body)
            self._model(body.model_id)
            try:
                self._saved_state(body.path)
            except BadRequest:
                self._in_order(body.model_id, body.seq_id, None)
                raise
            return self._submit(lambda: self._load_state(body), body.model_id, body.seq_id)

        @app.post("/api/v1/create_sampling_session")
        async def create_sampling_session(request: Request):
            body = types.CreateSamplingSessionRequest.model_validate(await request.json())
            self._session(body.session_id)
            sampler_id = f"{body.session_id}:sample:{body.sampling_session_seq_id}"
            if body.model_path is not None:
                if body.model_path not in self.named:
                    raise BadRequest(
                        f"unknown model_path {body.model_path!r} (save_weights_for_sampler(name=...) makes one)"
                    )
                model_id, adapter = self.named[body.model_path]
                session = SamplerSession(self.models[model_id].base_model, model_id, adapter, body.model_path)
            elif body.base_model is not None:
                on_it = [m.model_id for m in self.models.values() if m.base_model == body.base_model]
                session = SamplerSession(body.base_model, on_it[0] if on_it else None, None)
            else:
                raise BadRequest("create_sampling_session: give base_model or model_path")
            self.samplers[sampler_id] = session
            return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

        @app.get("/api/v1/samplers/{sampler_id}")
        async def get_sampler(sampler_id: str):
            session = self._sampler(sampler_id)
            return {"sampler_id": sampler_id, "base_model": session.base_model, "model_path": session.model_path}

        @app.post("/api/v1/asample")
        async def asample(request: Request):
            body = types.SampleRequest.model_validate(await request.json())
            if body.sampling_session_id is None:
                raise BadRequest("asample: sampling_session_id is required (create_sampling_session makes one)")
            session = self._sampler(body.sampling_session_id)
            unsupported = {
                "topk_prompt_logprobs": body.topk_prompt_logprobs,
                "topk_sample_logprobs": body.topk_sample_logprobs,
                "prompt_alt_tokens_k": body.prompt_alt_tokens_k,
                "target_prompt_logprobs": body.target_prompt_logprobs,
                "record_stability_info": body.record_stability_info,
            }
            asked = [name for name, value in unsupported.items() if value]
            if asked:
                raise BadRequest(f"asample: {asked[0]} is not supported yet")
            if session.model_id is None:
                raise BadRequest(f"sampling {session.base_model} needs a model created on it first (create_model)")
            model = self._model(session.model_id)
            sampling = _sampling(body.sampling_params)  # refuse what the engine cannot do now, not in the future
            prompt = _tokens(body.prompt)
            model.check_tokens(prompt, "prompt")
            if sampling.stop_token_ids:
                model.check_tokens(list(sampling.stop_token_ids), "sampling_params.stop")
            request_id = self._queue_sample(body, prompt, session, sampling)
            return {
                "request_id": request_id,
                "model_id": None,
                "sample_sequence_ids": [f"{request_id}:{j}" for j in range(body.num_samples)],
            }

        @app.post("/api/v1/retrieve_future")
        async def retrieve_future(request: Request):
            body = types.FutureRetrieveRequest.model_validate(await request.json())
            return await self._retrieve(body.request_id)

        return app

    def _session(self, session_id: str) -> None:
        if session_id not in self.sessions:
            raise BadRequest(f"unknown session_id {session_id!r}")
        self.sessions[session_id] = time.monotonic()

    async def _expire_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.expire_sessions()

    def _sampler(self, sampler_id: str) -> SamplerSession:
        if sampler_id not in self.samplers:
            raise BadRequest(f"unknown sampling session {sampler_id!r}")
        return self.samplers[sampler_id]

    def close(self) -> None:
        for future in self.futures.values():
            future.cancel()  # what has not started
        self._work.close()
        for model in self.models.values():
            model.close()


def _session_of(some_id: str) -> str:
    """The session a model or sampling-session id belongs to (its first part: SESSION:train:N)."""
    return some_id.split(":", 1)[0]


def _adam_only(optimizer: object) -> None:
    if optimizer is not None and not isinstance(optimizer, types.AdamOptimizerConfig):
        raise BadRequest(f"optimizer_config: only Adam is served, not {type(optimizer).__name__}")


def _json_file(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise BadRequest(f"{path}: not readable JSON ({error})") from None
    if not isinstance(found, dict):
        raise BadRequest(f"{path}: not a JSON object")
    return found


def _refuse(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def _tokens(model_input: types.ModelInput) -> list[int]:
    tokens: list[int] = []
    for chunk in model_input.chunks:
        if not isinstance(chunk, types.EncodedTextChunk):
            raise BadRequest(f"only text inputs are supported, not {type(chunk).__name__}")
        tokens.extend(chunk.tokens)
    return tokens


def _sampling(params: types.SamplingParams) -> Sampling:
    """rlvr's Sampling for the SDK's; what it cannot express is refused."""
    if params.top_k is not None and params.top_k < -1:
        raise BadRequest(f"sampling_params.top_k must be -1 (no limit) or a positive count, got {params.top_k}")
    stop = [params.stop] if isinstance(params.stop, (str, int)) else list(params.stop or [])
    if params.stop is not None and not stop:
        raise BadRequest("sampling_params.stop=[] (no end-of-sequence stop) is not supported yet")
    strings = tuple(s for s in stop if isinstance(s, str))
    token_ids = tuple(s for s in stop if not isinstance(s, str))
    if strings and token_ids:
        raise BadRequest("sampling_params.stop: give strings or token ids, not both")
    given = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "seed": params.seed,
        "max_tokens": params.max_tokens,
        "top_k": -1 if params.top_k == 0 else params.top_k,
    }
    return Sampling(
        stop=strings, stop_token_ids=token_ids, **{key: value for key, value in given.items() if value is not None}
    )


def serve(cfg: ServeConfig) -> None:
    """Serve until interrupted; the models' ranks and engines are closed on the way out."""
    import uvicorn

    server = TinkerServer(cfg)
    print(f"rlvr serve: the Tinker API on http://{cfg.host}:{cfg.port}", flush=True)
    uvicorn.run(server.app, host=cfg.host, port=cfg.port, log_level="warning")
