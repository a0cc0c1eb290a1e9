"""The Tinker API over HTTP: the routes the unmodified `tinker` SDK calls, each a plain function of
the server, the asking tenant and the request's body.

    rlvr serve --config serve.yaml     # then: tinker.ServiceClient(base_url="http://127.0.0.1:8000")

Every request but /healthz carries an API key (X-API-Key) naming its tenant (rlvr.serve.tenants),
and its body is read up to the tenant's body_bytes. Training and sampling calls answer at once
with a request id; their work runs on one worker thread (rlvr.serve.work_line), and
`retrieve_future` holds a poll until the result is there. A refused request gets its status
(rlvr.serve.refusals) and one-line reason, and leaves everything as it was.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from tinker import types

from rlvr.config import ServeConfig
from rlvr.errors import UserError
from rlvr.records import Sampling
from rlvr.serve.fair_queue import Say
from rlvr.serve.protocol import forward_backward_output, read_forward_backward
from rlvr.serve.refusals import BadRequest, TooLarge, Unauthorized
from rlvr.serve.sample_batcher import PendingSample
from rlvr.serve.server import TinkerServer, adam_only
from rlvr.serve.tenants import Tenant, Tenants, check_exposure
from rlvr.tracking.terminal import quiet_output

_API = "/api/v1/"
_OPEN = {f"{_API}healthz"}  # answered without a key: a load balancer's probe has none


class RequestLog:
    """One line per request kind every `every_s` seconds, with its count (a client polls retrieve_future
    many times a second: a line per request would drown everything else)."""

    def __init__(self, every_s: float, say: Say = print):
        self.every_s, self._say = every_s, say
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
            self._say(f"rlvr serve: {kind}: {count} in {self.every_s:g} s{refused}")
        self._counts.clear()
        self._refused.clear()


# ---------------------------------------------------------------------------------------- routes


def client_config(server: TinkerServer, tenant: Tenant) -> dict:
    return {"pjwt_auth_enabled": False}  # the SDK then sends its API key on every call


def dynamic_config(server: TinkerServer, tenant: Tenant) -> dict:
    # the SDK re-reads this every refresh_interval_sec; a sampling call is not cancelled from the
    # client (its future expires with its session instead)
    return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}


def telemetry(server: TinkerServer, tenant: Tenant, body: bytes) -> dict:
    return {"status": "accepted"}  # the SDK's own error reports: not kept


def capabilities(server: TinkerServer, tenant: Tenant) -> dict:
    return {
        "supported_models": [{"model_name": name, "trainable": True, "sampleable": True} for name in server.cfg.models]
    }


def create_session(server: TinkerServer, tenant: Tenant, body: types.CreateSessionRequest) -> dict:
    session_id = f"session-{uuid.uuid4().hex}"
    server.registry.open_session(session_id, tenant)
    return {"type": "create_session", "session_id": session_id}


def session_heartbeat(server: TinkerServer, tenant: Tenant, body: types.SessionHeartbeatRequest) -> dict:
    server.registry.session(body.session_id, tenant)
    return {"type": "session_heartbeat"}


def finish_session(server: TinkerServer, tenant: Tenant, body: bytes, session_id: str) -> dict:
    server.registry.session(session_id, tenant)
    server.registry.end_session(session_id, "finished by its client")
    return {}


def create_model(server: TinkerServer, tenant: Tenant, body: types.CreateModelRequest) -> dict:
    server.registry.session(body.session_id, tenant)
    if body.lora_config is None:
        raise BadRequest("create_model: full fine-tuning is not served; ask for LoRA (lora_config.rank)")
    if not (body.lora_config.train_attn and body.lora_config.train_mlp):
        raise BadRequest("lora_config: LoRA on attention and MLP both is all this server trains")
    adam_only(body.optimizer_config)
    seed = server.cfg.seed if body.lora_config.seed is None else body.lora_config.seed
    return server.start_model(
        tenant,
        body.session_id,
        body.model_seq_id,
        body.base_model,
        body.lora_config.rank,
        seed,
        lambda model_id: {"model_id": model_id, "type": "create_model"},
    )


def get_info(server: TinkerServer, tenant: Tenant, body: types.GetInfoRequest) -> dict:
    model = server.registry.model(body.model_id, tenant)
    return {
        "type": "get_info",
        "model_id": model.model_id,
        "is_lora": True,
        "lora_rank": model.rank,
        "model_name": model.base_model,
        "model_data": {"arch": None, "model_name": model.base_model, "tokenizer_id": model.base_model},
    }


def forward_backward(server: TinkerServer, tenant: Tenant, body: bytes) -> dict:
    batch = read_forward_backward(body)
    model = server.registry.model(batch.model_id, tenant)
    try:
        checked = model.check(batch)  # refused here, before the call takes its turn
    except BadRequest:
        server.work.skip(batch.model_id, batch.seq_id)
        raise

    def work() -> bytes:
        logprobs, loss = model.forward_backward(checked)
        return forward_backward_output(logprobs, {"loss:sum": loss})

    return server.work.submit(tenant, work, batch.model_id, batch.seq_id)


def optim_step(server: TinkerServer, tenant: Tenant, body: types.OptimStepRequest) -> dict:
    model = server.registry.model(body.model_id, tenant)
    if not isinstance(body.optim_params, types.AdamParams):
        server.work.skip(body.model_id, body.seq_id)
        raise BadRequest(f"optim_step: only AdamParams are supported, not {type(body.optim_params).__name__}")
    adam = body.optim_params
    return server.work.submit(tenant, lambda: {"metrics": model.optim_step(adam)}, body.model_id, body.seq_id)


def save_weights_for_sampler(server: TinkerServer, tenant: Tenant, body: types.SaveWeightsForSamplerRequest) -> dict:
    server.registry.model(body.model_id, tenant)
    return server.work.submit(tenant, lambda: server.save_for_sampler(tenant, body), body.model_id, body.seq_id)


def save_weights(server: TinkerServer, tenant: Tenant, body: types.SaveWeightsRequest) -> dict:
    server.registry.model(body.model_id, tenant)
    if body.path is not None:
        try:
            server.states.folder(tenant, body.model_id, body.path)  # a bad name is refused now, not in the future
        except BadRequest:
            server.work.skip(body.model_id, body.seq_id)
            raise
    return server.work.submit(tenant, lambda: server.save_state(tenant, body), body.model_id, body.seq_id)


def load_weights(server: TinkerServer, tenant: Tenant, body: types.LoadWeightsRequest) -> dict:
    if body.model_id is None:
        return server.create_from_state(tenant, body)
    server.registry.model(body.model_id, tenant)
    try:
        server.states.find(body.path, tenant)
    except BadRequest:
        server.work.skip(body.model_id, body.seq_id)
        raise
    return server.work.submit(tenant, lambda: server.load_state(tenant, body), body.model_id, body.seq_id)


def create_sampling_session(server: TinkerServer, tenant: Tenant, body: types.CreateSamplingSessionRequest) -> dict:
    server.registry.session(body.session_id, tenant)
    sampler_id = f"{body.session_id}:sample:{body.sampling_session_seq_id}"
    server.registry.samplers[sampler_id] = server.sampler_for(tenant, body)
    return {"type": "create_sampling_session", "sampling_session_id": sampler_id}


def get_sampler(server: TinkerServer, tenant: Tenant, sampler_id: str) -> dict:
    session = server.registry.sampler(sampler_id, tenant)
    return {"sampler_id": sampler_id, "base_model": session.base_model, "model_path": session.model_path}


def asample(server: TinkerServer, tenant: Tenant, body: types.SampleRequest) -> dict:
    if body.sampling_session_id is None:
        raise BadRequest("asample: sampling_session_id is required (create_sampling_session makes one)")
    session = server.registry.sampler(body.sampling_session_id, tenant)
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
    model = server.registry.model(session.model_id, tenant)
    sampling = _sampling(body.sampling_params)  # refuse what the engine cannot do now, not in the future
    prompt = _tokens(body.prompt)
    model.check_tokens(prompt, "prompt")
    if sampling.stop_token_ids:
        model.check_tokens(list(sampling.stop_token_ids), "sampling_params.stop")
    tokens = body.num_samples * (len(prompt) + sampling.max_tokens)
    request_id, future = server.futures.new(tenant, tokens=tokens)
    server.batcher.add(model.host, PendingSample(body, prompt, session, sampling, future))
    return {
        "request_id": request_id,
        "model_id": None,
        "sample_sequence_ids": [f"{request_id}:{j}" for j in range(body.num_samples)],
    }


async def retrieve_future(server: TinkerServer, tenant: Tenant, body: types.FutureRetrieveRequest) -> Response:
    return await server.futures.answer(body.request_id, tenant)


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable
    body: type[BaseModel] | type[bytes] | None = None  # the body's SDK type; bytes: as sent; None: none read


ROUTES = (
    Route("POST", "client/config", client_config),
    Route("POST", "client/dynamic_config", dynamic_config),
    Route("POST", "telemetry", telemetry, bytes),
    Route("GET", "get_server_capabilities", capabilities),
    Route("POST", "create_session", create_session, types.CreateSessionRequest),
    Route("POST", "session_heartbeat", session_heartbeat, types.SessionHeartbeatRequest),
    Route("POST", "sessions/{session_id}/finish", finish_session, bytes),
    Route("POST", "create_model", create_model, types.CreateModelRequest),
    Route("POST", "get_info", get_info, types.GetInfoRequest),
    Route("POST", "forward_backward", forward_backward, bytes),
    Route("POST", "optim_step", optim_step, types.OptimStepRequest),
    Route("POST", "save_weights_for_sampler", save_weights_for_sampler, types.SaveWeightsForSamplerRequest),
    Route("POST", "save_weights", save_weights, types.SaveWeightsRequest),
    Route("POST", "load_weights", load_weights, types.LoadWeightsRequest),
    Route("POST", "create_sampling_session", create_sampling_session, types.CreateSamplingSessionRequest),
    Route("GET", "samplers/{sampler_id}", get_sampler),
    Route("POST", "asample", asample, types.SampleRequest),
    Route("POST", "retrieve_future", retrieve_future, types.FutureRetrieveRequest),
)


# ---------------------------------------------------------------------------------------- the app


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it passes `limit` bytes: a huge body is never held whole."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"limits.body_bytes: the body's {int(declared)} bytes pass this tenant's {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"limits.body_bytes: the body passes this tenant's {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _endpoint(server: TinkerServer, route: Route) -> Callable:
    async def endpoint(request: Request):
        tenant = request.state.tenant
        args: list = []
        if route.body is not None:
            raw = await _read_body(request, tenant.limits.body_bytes)
            args.append(raw if route.body is bytes else route.body.model_validate_json(raw or b"{}"))
        answer = route.handler(server, tenant, *args, **request.path_params)
        return await answer if inspect.isawaitable(answer) else answer

    endpoint.__name__ = route.handler.__name__
    return endpoint


def _refuse(error: UserError) -> JSONResponse:
    status = getattr(error, "status", 400)
    headers = {"Retry-After": "1"} if status == 429 else None
    return JSONResponse({"detail": str(error)}, status_code=status, headers=headers)


def _route_template(app: FastAPI, scope) -> str | None:
    """The route a request is for, as its template (samplers/{sampler_id}), not the id; also for
    one refused before routing (a missing key), which starlette never matched."""
    from starlette.routing import Match

    if scope.get("route") is not None:
        return scope["route"].path
    for route in app.router.routes:
        if route.matches(scope)[0] == Match.FULL:
            return getattr(route, "path", None)
    return None


def build_app(server: TinkerServer) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_):
        log = asyncio.create_task(server_log.run())
        expiry = asyncio.create_task(_expire_every(server, min(5.0, server.cfg.session_timeout_s / 2)))
        yield
        log.cancel()
        expiry.cancel()
        server_log.flush()
        # here, not after uvicorn.run: on SIGTERM uvicorn re-raises the signal once it has shut down
        server.close()

    server_log = RequestLog(server.cfg.log_every_s, server.say)
    app = FastAPI(title="rlvr serve: the Tinker API", lifespan=lifespan)

    @app.middleware("http")
    async def key_and_count(request: Request, call_next):
        response = None
        if request.url.path not in _OPEN:
            try:
                request.state.tenant = server.tenants.identify(request.headers.get("x-api-key"))
            except Unauthorized as error:
                response = _refuse(error)
        if response is None:
            response = await call_next(request)
        route = request.scope.get("route")  # the template (samplers/{sampler_id}), not the id
        path = route.path if route else f"{request.url.path} (no such route)"
        server_log.add(path.removeprefix(_API), response.status_code)
        return response

    @app.exception_handler(UserError)  # the refusals, and a model folder that is not one
    async def refused(_, error: UserError):
        return _refuse(error)

    @app.exception_handler(ValidationError)
    async def invalid(_, error: ValidationError):
        first = error.errors()[0]
        return _refuse(BadRequest(f"{error.title}: {'.'.join(map(str, first['loc']))}: {first['msg']}"))

    @app.get(f"{_API}healthz")
    async def healthz():
        return {"status": "ok"}

    for route in ROUTES:
        app.add_api_route(f"{_API}{route.path}", _endpoint(server, route), methods=[route.method])
    return app


async def _expire_every(server: TinkerServer, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        server.registry.expire_sessions()


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


def serve(cfg: ServeConfig, verbose: bool = False) -> None:
    """Serve until interrupted; the models' ranks and engines are closed on the way out. The
    libraries' output goes to cfg.log_file (with `verbose`, to the terminal), the server's own
    lines to the terminal."""
    import uvicorn

    tenants = Tenants(cfg)
    check_exposure(cfg.host, tenants)  # before the log file opens: a refusal leaves nothing behind
    with quiet_output(cfg.log_file, verbose, keep_empty=True) as terminal:

        def say(line: str) -> None:
            terminal.print(line, highlight=False, markup=False)

        server = TinkerServer(cfg, say, tenants)
        keys = f"{len(cfg.tenants)} tenant(s) with keys" if cfg.tenants else "no keys (loopback only)"
        logs = "" if verbose else f"; library logs: {cfg.log_file}"
        say(
            f"rlvr serve: the Tinker API on http://{cfg.host}:{cfg.port}; models: {', '.join(cfg.models)}; {keys}{logs}"
        )
        uvicorn.run(build_app(server), host=cfg.host, port=cfg.port, log_level="warning")
