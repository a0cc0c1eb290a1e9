"""`rlvr serve` driven by the real `tinker` SDK: a subprocess on a free port, a tiny model, the
SDK's ServiceClient as a user would write it. The server has two tenants: alice (whose key the
SDK clients use), bob, whose key comes from a file and whose limits are small enough to reach,
and carol."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from rlvr.hardware import compute_dtype  # noqa: E402
from rlvr.models.tiny import build_tiny_model  # noqa: E402
from rlvr.training.trainer import free_port  # noqa: E402

TOKENS = list(range(5, 29))  # one fixed sequence: the SL loop learns it
ALICE, BOB, CAROL = "tml-alice-key", "tml-bob-key", "tml-carol-key"
BOB_LIMITS = {"models": 1, "queued_requests": 2, "body_bytes": 65536, "sampling_tokens": 64}


def _refused_serve(*args: str) -> subprocess.CompletedProcess:
    """`rlvr serve ARGS`, expected to refuse before it listens."""
    return subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_a_bad_serve_config_is_one_line_and_exit_2(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("engine:\n  kv_cache_gbb: 1\n")
    done = _refused_serve("--config", str(config))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {config}: unknown key 'engine.kv_cache_gbb'; did you mean engine.kv_cache_gb?"
    ]


def test_sessions_end_when_finished_or_silent(model_dir):
    from starlette.testclient import TestClient

    from rlvr.config import ServeConfig
    from rlvr.serve.app import build_app
    from rlvr.serve.server import TinkerServer

    server = TinkerServer(ServeConfig(session_timeout_s=11, models={"tiny": str(model_dir)}))
    with TestClient(build_app(server)) as client:

        def heartbeat(session_id: str):
            return client.post("/api/v1/session_heartbeat", json={"session_id": session_id})

        body = {"tags": [], "user_metadata": None, "sdk_version": "0.38.0"}
        first, second = (client.post("/api/v1/create_session", json=body).json()["session_id"] for _ in range(2))
        assert client.post(f"/api/v1/sessions/{first}/finish", json={}).status_code == 200
        # 410 for an ended session: the SDK stops heartbeating on it
        assert heartbeat(first).status_code == 410 and heartbeat(second).status_code == 200
        server.registry.expire_sessions(now=time.monotonic() + 5)  # heard from 5 s ago: kept
        assert heartbeat(second).status_code == 200
        server.registry.expire_sessions(now=time.monotonic() + 12)
        assert heartbeat(second).status_code == 410
        refused = heartbeat("session-never-made")
        assert refused.status_code == 404 and "unknown session_id" in refused.json()["detail"]


def serve_config(folder: Path, model: Path, checkpoints: Path | None = None) -> Path:
    """The module's serve.yaml: `model` in the catalog under its own path (the SDK loads the tokenizer
    by that name, and there is no hub here), alice's key inline, bob's in a file."""
    (folder / "bob.keys").write_text(f"# bob's clients\n{BOB}\n")
    config = folder / "serve.yaml"
    config.write_text(
        json.dumps(
            {
                "checkpoint_dir": str(checkpoints or folder / "checkpoints"),
                "log_file": str(folder / "libraries.log"),
                "log_every_s": 1,
                "session_timeout_s": 30,
                "models": {str(model): str(model)},
                "tenants": {
                    "alice": {"api_keys": [ALICE], "limits": {"models": 4}},
                    "bob": {"api_keys_file": str(folder / "bob.keys"), "limits": BOB_LIMITS},
                    "carol": {"api_keys": [CAROL]},
                },
                "engine": {"max_model_len": 128, "kv_cache_gb": 0.25},
            }
        )
    )
    return config


@contextmanager
def serving(folder: Path, model: Path, checkpoints: Path | None = None):
    """`rlvr serve` as a subprocess on a free port, its checkpoints under `checkpoints` (default
    `folder`/checkpoints), sessions ending 30 s after their client is last heard from; yields its URL."""
    config = serve_config(folder, model, checkpoints)
    port = free_port()
    with open(folder / "server.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "rlvr.cli", "serve", "--port", str(port), "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/api/v1/healthz", timeout=2) as reply:
                        assert json.load(reply) == {"status": "ok"}
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"rlvr serve did not come up:\n{(folder / 'server.log').read_text()[-3000:]}"
                        )
                    time.sleep(0.5)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=60)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("model"),
        "qwen2",
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    folder = tmp_path_factory.mktemp("tinker")
    with serving(folder, model_dir) as url:
        yield url, str(model_dir), folder / "checkpoints" / "alice", folder / "server.log"


@pytest.fixture(scope="module")
def training(server):
    url, model, *_ = server
    # closed before the server stops: an open session's heartbeat would log connection errors after it
    with tinker.ServiceClient(base_url=url, api_key=ALICE) as service:
        yield service.create_lora_training_client(base_model=model, rank=4, seed=0).result()


@pytest.fixture(scope="module")
def bob_training(server):
    """Bob's model, on the same base as alice's."""
    with tinker.ServiceClient(base_url=server[0], api_key=BOB) as service:
        yield service.create_lora_training_client(base_model=server[1], rank=8, seed=1).result()


def _datum(tokens: list[int], **inputs) -> types.Datum:
    """model_input[i] predicts target_tokens[i]: the sequence and itself shifted by one."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": np.array(tokens[1:], dtype=np.int64), **inputs},
    )


def _logprobs(training, tokens: list[int]) -> np.ndarray:
    weights = np.ones(len(tokens) - 1, dtype=np.float32)
    result = training.forward([_datum(tokens, weights=weights)], "cross_entropy").result()
    return np.asarray(result.loss_fn_outputs[0]["logprobs"].tolist())


@pytest.mark.slow
def test_smoke_path_losses_are_sums_and_sampling_is_seeded(training):
    n = len(TOKENS) - 1
    weights = np.linspace(-0.5, 2.0, n).astype(np.float32)  # any floats, negatives included
    result = training.forward_backward(
        [_datum(TOKENS, weights=weights), _datum(TOKENS[:9], weights=np.ones(8, np.float32))], "cross_entropy"
    ).result()
    first, second = (np.asarray(out["logprobs"].tolist()) for out in result.loss_fn_outputs)
    assert first.shape == (n,) and second.shape == (8,)
    assert np.all(first < 0)
    expected = -(weights * first).sum() - second.sum()
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)
    # the prefix's logprobs are the longer datum's: the same model scored both
    np.testing.assert_allclose(second, first[:8], atol=1e-5)

    # importance_sampling at the sampler's own logprobs: every ratio is 1, the loss -sum(A)
    advantages = np.linspace(-1.0, 1.0, n).astype(np.float32)
    sampled = _datum(TOKENS, advantages=advantages, logprobs=first.astype(np.float32))
    result = training.forward_backward([sampled], "importance_sampling").result()
    assert result.metrics["loss:sum"] == pytest.approx(-advantages.sum(), abs=1e-4)

    training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    assert not np.allclose(_logprobs(training, TOKENS), first, atol=1e-6)  # the step moved the adapter

    sampler = training.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=6, seed=3, temperature=1.0)
    prompt = types.ModelInput.from_ints(TOKENS[:5])
    one = sampler.sample(prompt, 2, params).result()
    again = sampler.sample(prompt, 2, params).result()
    assert [s.tokens for s in one.sequences] == [s.tokens for s in again.sequences]
    assert one.sequences[0].tokens != one.sequences[1].tokens
    for sequence in one.sequences:
        assert len(sequence.tokens) == len(sequence.logprobs) and sequence.stop_reason in ("stop", "length")
        assert all(lp <= 0 for lp in sequence.logprobs)
    # a token-id stop (the cookbook's renderers stop on token ids) ends the sequence at its first place
    stop = one.sequences[0].tokens[2]
    cut = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=6, seed=3, temperature=1.0, stop=[stop])).result()
    first = one.sequences[0].tokens
    assert cut.sequences[0].tokens == first[: first.index(stop) + 1] and cut.sequences[0].stop_reason == "stop"
    top1 = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=6, seed=3, top_k=1)).result()
    greedy = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=6, temperature=0.0)).result()
    assert [s.tokens for s in top1.sequences] == [greedy.sequences[0].tokens] * 2
    ids = [s.sequence_id for s in one.sequences + again.sequences]
    assert all(isinstance(i, str) for i in ids) and len(set(ids)) == 4
    # the engine samples the trained adapter: its logprobs are the trainer's for the same tokens, to the
    # rounding of the compute dtype the server picks (bf16 where the CPU computes in it: ~2e-3 apart here)
    atol = 2e-3 if compute_dtype("auto", "cpu").name == "float32" else 1e-2
    tokens = TOKENS[:5] + one.sequences[0].tokens
    trainer_side = _logprobs(training, tokens)
    np.testing.assert_allclose(one.sequences[0].logprobs, trainer_side[4:], atol=atol)
    # and the prompt's logprobs, the whole prompt's or its last tokens', as compute_logprobs asks for them
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    assert scored[0] is None
    np.testing.assert_allclose(scored[1:], trainer_side, atol=atol)
    last = sampler.compute_logprobs(types.ModelInput.from_ints(tokens), prompt_logprobs_last_n=3).result()
    assert last[:-3] == [None] * (len(tokens) - 3)
    np.testing.assert_allclose(last[-3:], trainer_side[-3:], atol=atol)


@pytest.mark.slow
def test_supervised_loop_loss_falls(training):
    weights = np.ones(len(TOKENS) - 1, dtype=np.float32)
    batch = [_datum(TOKENS, weights=weights), _datum(TOKENS[3:], weights=weights[3:])]
    losses = []
    for _ in range(12):
        result = training.forward_backward(batch, "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=3e-3)).result()
        losses.append(result.metrics["loss:sum"])
    # a random tiny model starts near uniform (log 320 nats a token) and learns slowly: 8 steps took 10%
    assert losses[-1] < 0.9 * losses[0] and max(losses[-3:]) < min(losses[:3]), losses


@pytest.mark.slow
def test_malformed_request_is_refused_and_leaves_the_model_alone(server, training):
    service = tinker.ServiceClient(base_url=server[0], api_key=ALICE)
    # a base outside the catalog, a path above all: refused, naming what is served
    with pytest.raises(
        tinker.BadRequestError, match=f"'/no/such/model' is not served here; choose one of: {server[1]}"
    ):
        service.create_lora_training_client(base_model="/no/such/model", rank=4).result()
    # a model the machine cannot hold (its LoRA alone: terabytes) is refused by the plan's estimate when
    # asked: an HTTP 400 (BadRequestError), where work that had been queued would fail through its future
    with pytest.raises(tinker.BadRequestError, match="needs ~.* GB .*over this server's .* nothing was loaded"):
        service.create_lora_training_client(base_model=server[1], rank=10_000_000).result()
    before = _logprobs(training, TOKENS)
    vocab_size = 10**6
    bad = _datum([*TOKENS[:4], vocab_size], weights=np.ones(4, np.float32))
    with pytest.raises(tinker.BadRequestError, match="outside the vocabulary"):
        training.forward_backward([bad], "cross_entropy").result()
    with pytest.raises(tinker.BadRequestError, match="needs loss_fn_inputs\\['advantages'\\]"):
        training.forward_backward(
            [_datum(TOKENS, weights=np.ones(len(TOKENS) - 1, np.float32))], "importance_sampling"
        ).result()
    # the refused calls left no gradient behind, and the calls after them still take their turn
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    np.testing.assert_array_equal(_logprobs(training, TOKENS), before)


@pytest.mark.slow
def test_save_state_writes_peft_and_loads_back(server, training):
    saved = _logprobs(training, TOKENS)
    path = training.save_state("first").result().path
    folder = server[2] / training.model_id.replace(":", "_") / "first"
    assert path == f"tinker://{training.model_id}/weights/first"
    assert (folder / "adapter" / "adapter_model.safetensors").is_file() and (
        folder / "adapter" / "adapter_config.json"
    ).is_file()
    with pytest.raises(tinker.RequestFailedError, match="exists"):
        training.save_state("first").result()
    weights = np.ones(len(TOKENS) - 1, dtype=np.float32)
    training.forward_backward([_datum(TOKENS, weights=weights)], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert not np.allclose(_logprobs(training, TOKENS), saved, atol=1e-6)
    training.load_state_with_optimizer(path).result()
    np.testing.assert_array_equal(_logprobs(training, TOKENS), saved)

    def step_from(load) -> np.ndarray:
        load(path).result()
        np.testing.assert_array_equal(_logprobs(training, TOKENS), saved)
        training.forward_backward([_datum(TOKENS, weights=weights)], "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        return _logprobs(training, TOKENS)

    resumed = step_from(training.load_state_with_optimizer)
    np.testing.assert_array_equal(step_from(training.load_state_with_optimizer), resumed)  # Adam's moments came back
    assert not np.allclose(step_from(training.load_state), resumed, atol=1e-6)  # weights only: Adam starts afresh
    with pytest.raises(tinker.NotFoundError, match="not a checkpoint"):
        training.load_state_with_optimizer(f"tinker://{training.model_id}/weights/never-saved").result()
    current = _logprobs(training, TOKENS)
    for name in ("../../escape", "a/b", ".."):  # a name that would leave the tenant's folder
        with pytest.raises(tinker.BadRequestError, match="without slashes"):
            training.save_state(name).result()
    np.testing.assert_array_equal(_logprobs(training, TOKENS), current)  # the refused saves kept their turn


@pytest.mark.slow
def test_cookbook_arithmetic_recipe_runs_unmodified(tmp_path, model_dir):
    """tinker-cookbook's math_rl recipe as its README runs it; role_colon: the renderer whose stops are strings."""
    import tinker_cookbook  # noqa: F401  (make setup installs it: requirements/cpu.txt)

    with serving(tmp_path, model_dir) as url:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tinker_cookbook.recipes.math_rl.train",
                f"base_url={url}",
                f"model_name={model_dir}",
                "renderer_name=role_colon",
                "env=arithmetic",
                "loss_fn=importance_sampling",
                "groups_per_batch=4",
                "group_size=4",
                "max_steps=3",
                "eval_every=0",
                "save_every=0",
                "lora_rank=8",
                f"log_path={tmp_path / 'run'}",
                "behavior_if_log_dir_exists=delete",
            ],
            env={**os.environ, "TINKER_API_KEY": ALICE},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [step["step"] for step in steps if "env/all/reward/total" in step] == [0, 1, 2]
    (final,) = (tmp_path / "checkpoints" / "alice").glob("*/final")  # the recipe's closing save_state
    assert (final / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_requests_are_logged_by_kind_not_one_by_one(server, training):
    log = server[3]

    def forward_backward_lines() -> list[int]:
        return [
            int(line.split(": ")[2].split()[0])
            for line in log.read_text().splitlines()
            if line.startswith("rlvr serve: forward_backward: ")
        ]

    time.sleep(1.5)  # what earlier tests sent is logged by now
    before = len(forward_backward_lines())
    weights = np.ones(len(TOKENS) - 1, dtype=np.float32)
    futures = [training.forward([_datum(TOKENS, weights=weights)], "cross_entropy") for _ in range(6)]
    for future in futures:
        future.result()
    time.sleep(2.5)
    counts = forward_backward_lines()[before:]
    assert sum(counts) == 6 and len(counts) < 6, counts


def test_fair_queue_takes_each_session_in_turn():
    import threading

    from rlvr.serve.fair_queue import FairQueue

    queue, ran, busy, gate = FairQueue(), [], threading.Event(), threading.Event()
    queue.put("a", lambda: (busy.set(), gate.wait()))  # holds the thread while the lines fill
    busy.wait()
    for i in range(4):
        queue.put("a", lambda i=i: ran.append(f"a{i}"))
    queue.put("b", lambda: ran.append("b0"))
    queue.put("c", lambda: ran.append("c0"))
    queue.put("b", lambda: ran.append("b1"))
    assert queue.waiting() == {"a": 4, "b": 2, "c": 1}
    gate.set()
    queue.close()  # runs what is queued, then stops
    # a's four calls, queued first, delay b's and c's first calls by one call each, not four
    assert ran == ["a0", "b0", "c0", "a1", "b1", "a2", "a3"]


@pytest.mark.slow
def test_two_tenants_train_their_own_adapters(training, bob_training):
    """Bob's model on the same server and base: its own adapter, its steps leave alice's model alone."""
    first_before = _logprobs(training, TOKENS)
    other_before = _logprobs(bob_training, TOKENS)
    weights = np.ones(len(TOKENS) - 1, dtype=np.float32)
    for _ in range(2):
        bob_training.forward_backward([_datum(TOKENS, weights=weights)], "cross_entropy").result()
        bob_training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert not np.allclose(_logprobs(bob_training, TOKENS), other_before, atol=1e-6)
    np.testing.assert_array_equal(_logprobs(training, TOKENS), first_before)
    assert bob_training.get_info().lora_rank == 8 and training.get_info().lora_rank == 4


@pytest.mark.slow
def test_out_of_order_seq_id_is_refused(server, training):
    body = {
        "model_id": training.model_id,
        "seq_id": 1,
        "type": "optim_step",
        "adam_params": {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12},
    }
    request = urllib.request.Request(
        f"{server[0]}/api/v1/optim_step",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-API-Key": ALICE},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
    assert "seq_id 1 of model" in json.load(refused.value)["detail"]


CLIENT = """
import sys, time, tinker
client = tinker.ServiceClient(base_url=sys.argv[1], api_key="tml-alice-key").create_lora_training_client(base_model=sys.argv[2], rank=4).result()
print(client.model_id, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_vanished_client_s_session_expires_and_its_model_closes(server, tmp_path):
    """A client killed with its model open: no heartbeat comes, the session ends after
    session_timeout_s (30 s here) and its model is closed and forgotten."""
    import signal

    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    client = subprocess.Popen([sys.executable, str(script), server[0], server[1]], stdout=subprocess.PIPE, text=True)
    model_id = client.stdout.readline().strip()
    assert model_id.endswith(":train:0"), model_id
    client.send_signal(signal.SIGKILL)
    client.wait()

    def info() -> int:
        request = urllib.request.Request(
            f"{server[0]}/api/v1/get_info",
            data=json.dumps({"model_id": model_id}).encode(),
            headers={"Content-Type": "application/json", "X-API-Key": ALICE},
        )
        try:
            with urllib.request.urlopen(request, timeout=30):
                return 200
        except urllib.error.HTTPError as refused:
            return refused.code

    assert info() == 200
    # watched in the log: a call on the model would count as the session being heard from
    expired = f"rlvr serve: session {model_id.split(':')[0]} expired"
    deadline = time.monotonic() + 120
    while expired not in server[3].read_text() and time.monotonic() < deadline:
        time.sleep(1)
    assert f"closing {model_id}" in next(
        line for line in server[3].read_text().splitlines() if line.startswith(expired)
    )
    assert info() == 404


SCRIPT = """
import json, sys, numpy as np, tinker
from tinker import types
T = list(range(5, 29))
datum = types.Datum(model_input=types.ModelInput.from_ints(T[:-1]),
                    loss_fn_inputs={"target_tokens": np.array(T[1:], dtype=np.int64), "weights": np.ones(len(T) - 1, np.float32)})
service = tinker.ServiceClient(base_url=sys.argv[1], api_key="tml-alice-key")
training = service.create_lora_training_client(base_model=sys.argv[2], rank=4, seed=7).result()
losses = []
for _ in range(3):
    losses.append(training.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"])
    training.optim_step(types.AdamParams(learning_rate=3e-3)).result()
sampler = training.save_weights_and_get_sampling_client().result()
samples = sampler.sample(types.ModelInput.from_ints(T[:5]), 3, types.SamplingParams(max_tokens=8, seed=11)).result()
path = training.save_state(sys.argv[3]).result().path
logprobs = training.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
print(json.dumps({"losses": losses, "tokens": [s.tokens for s in samples.sequences], "path": path, "logprobs": logprobs}))
"""

RESUME = """
import json, sys, numpy as np, tinker
from tinker import types
T = list(range(5, 29))
datum = types.Datum(model_input=types.ModelInput.from_ints(T[:-1]),
                    loss_fn_inputs={"target_tokens": np.array(T[1:], dtype=np.int64), "weights": np.ones(len(T) - 1, np.float32)})
service = tinker.ServiceClient(base_url=sys.argv[1], api_key="tml-alice-key")
training = service.create_training_client_from_state_with_optimizer(sys.argv[2]).result()
print(json.dumps({"logprobs": training.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist(),
                  "rank": training.get_info().lora_rank}))
"""


@pytest.mark.slow
def test_same_script_same_numbers_and_a_saved_state_resumes_after_a_restart(server, tmp_path, model_dir):
    """The same user script on a fresh server and on the module's (which has served other clients
    meanwhile) gives the same losses and samples; the state the fresh one saved, after it has
    exited, is a training client on the other."""
    (tmp_path / "script.py").write_text(SCRIPT)
    (tmp_path / "resume.py").write_text(RESUME)

    def run(script: str, *args: str) -> dict:
        done = subprocess.run(
            [sys.executable, str(tmp_path / script), *args], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    with serving(tmp_path, model_dir, checkpoints=server[2].parent) as url:  # the module server's checkpoints
        first = run("script.py", url, str(model_dir), "before-restart")
    second = run("script.py", server[0], str(model_dir), "again")
    assert first["losses"] == second["losses"] and first["tokens"] == second["tokens"]
    assert first["losses"][-1] < first["losses"][0]
    resumed = run("resume.py", server[0], first["path"])
    assert resumed["rank"] == 4
    np.testing.assert_array_equal(resumed["logprobs"], first["logprobs"])


# ------------------------------------------------------------------ tenants, the catalog and limits


def _http(url: str, route: str, body: dict | None = None, *, key: str | None = ALICE, raw: bytes | None = None):
    """(status, reply) of one raw request: GET without a body, POST with one. A JSON reply is read;
    a protobuf one (a forward_backward result) is {"protobuf": its bytes}."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"X-API-Key": key} if key else {})}
    request = urllib.request.Request(f"{url}/api/v1/{route}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            status, content, kind = reply.status, reply.read(), reply.headers.get_content_type()
    except urllib.error.HTTPError as refused:
        status, content, kind = refused.code, refused.read(), refused.headers.get_content_type()
    return status, json.loads(content) if kind == "application/json" else {"protobuf": content}


def _retrieve(url: str, request_id: str, key: str) -> tuple[int, dict]:
    while True:
        status, reply = _http(url, "retrieve_future", {"request_id": request_id}, key=key)
        if reply.get("type") != "try_again":
            return status, reply


def test_a_server_without_keys_listens_on_loopback_only(model_dir):
    done = _refused_serve("--host", "0.0.0.0", "--model", f"tiny={model_dir}")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: serve: host 0.0.0.0 is reachable from other machines and no tenant has an API key; "
        "name tenants with api_keys in the config, or listen on 127.0.0.1"
    ]


@pytest.mark.slow
def test_every_call_needs_a_key_a_tenant_holds(server, training):
    url = server[0]
    assert _http(url, "healthz") == (200, {"status": "ok"})  # a load balancer's probe carries no key
    for key in (None, "tml-nobody-holds-this"):
        status, reply = _http(url, "get_server_capabilities", key=key)
        assert status == 401 and "API key" in reply["detail"]
        assert _http(url, "get_info", {"model_id": training.model_id}, key=key)[0] == 401
    status, capabilities = _http(url, "get_server_capabilities")
    assert status == 200 and [m["model_name"] for m in capabilities["supported_models"]] == [server[1]]
    with pytest.raises(tinker.AuthenticationError):
        service = tinker.ServiceClient(base_url=url, api_key="tml-nobody-holds-this")
        service.create_lora_training_client(base_model=server[1], rank=4).result()
    assert _http(url, "client/dynamic_config", {}) == (
        200,
        {"refresh_interval_sec": 300, "sample_cancel_enabled": False},
    )
    log = server[3].read_text()
    assert ALICE not in log and BOB not in log
    assert "no such route" not in log  # every route the SDK called so far exists
    # the terminal holds the server's own lines; vLLM's, transformers' and the ranks' go to log_file
    assert all(line.startswith("rlvr serve: ") for line in log.splitlines()), log[-2000:]
    libraries = (server[3].parent / "libraries.log").read_text()
    assert "vllm" in libraries.lower() and ALICE not in libraries and BOB not in libraries


def _forward_backward_body(model_id: str, seq_id: int) -> bytes:
    from tinker.proto import tinker_public_pb2 as pb

    message = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy")
    datum = message.data.add()
    datum.model_input.add().encoded_text.tokens = np.array(TOKENS[:-1], np.int32).tobytes()
    for name, values in (("target_tokens", np.array(TOKENS[1:], np.int64)), ("weights", np.ones(23, np.float32))):
        tensor = datum.loss_fn_inputs[name]
        tensor.dtype = pb.DTYPE_INT64 if values.dtype == np.int64 else pb.DTYPE_FLOAT32
        tensor.dense = values.tobytes()
    return message.SerializeToString()


@pytest.mark.slow
def test_another_tenant_finds_nothing_of_alice_s(server, training, bob_training):
    """Bob, with his own session and model, names alice's model, session, sampler, saved state,
    named sampler weights and request: each is as unknown to him as a thing never made (404), and
    alice's model answers as before, to the bit."""
    url = server[0]
    before = _logprobs(training, TOKENS)
    state = training.save_state("alice-only").result().path
    named = training.save_weights_for_sampler("alice-sampler").result().path
    alice_session, bob_session = (client.model_id.split(":")[0] for client in (training, bob_training))
    status, sampler = _http(
        url,
        "create_sampling_session",
        {"session_id": alice_session, "sampling_session_seq_id": 900, "model_path": named},
    )
    assert status == 200
    sample = {
        "sampling_session_id": sampler["sampling_session_id"],
        "prompt": {"chunks": [{"tokens": TOKENS[:5], "type": "encoded_text"}]},
        "num_samples": 1,
        "sampling_params": {"max_tokens": 4, "seed": 1},
    }
    status, alice_request = _http(url, "asample", sample)
    assert status == 200
    adam = {"learning_rate": 1.0, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12}
    model = training.model_id
    asked = {
        "get_info": {"model_id": model},
        "optim_step": {"model_id": model, "seq_id": 10_000, "adam_params": adam},
        "save_weights": {"model_id": model, "seq_id": 10_000, "path": "taken"},
        "save_weights_for_sampler": {"model_id": model, "seq_id": 10_000, "path": "taken"},
        "load_weights": {"model_id": model, "seq_id": 10_000, "path": state, "optimizer": True},
        "session_heartbeat": {"session_id": alice_session},
        "asample": sample,
        "retrieve_future": {"request_id": alice_request["request_id"]},
    }
    for route, body in asked.items():
        status, reply = _http(url, route, body, key=BOB)
        assert status == 404, (route, status, reply)
    # alice's state and sampler weights, named from bob's own session: unknown too
    from_state = {"session_id": bob_session, "model_seq_id": 77, "path": state, "optimizer": True}
    assert _http(url, "load_weights", from_state, key=BOB)[0] == 404
    from_named = {"session_id": bob_session, "sampling_session_seq_id": 901, "model_path": named}
    assert _http(url, "create_sampling_session", from_named, key=BOB)[0] == 404
    assert _http(url, f"sessions/{alice_session}/finish", {}, key=BOB)[0] == 404
    status, reply = _http(url, "forward_backward", raw=_forward_backward_body(model, 10_000), key=BOB)
    assert status == 404 and "unknown model_id" in reply["detail"]
    # alice's things are all there for her
    assert _retrieve(url, alice_request["request_id"], ALICE)[0] == 200
    np.testing.assert_array_equal(_logprobs(training, TOKENS), before)
    training.load_state(state).result()
    np.testing.assert_array_equal(_logprobs(training, TOKENS), before)


@pytest.mark.slow
def test_limits_are_refused_by_name_and_lose_nothing(server, bob_training):
    """Bob's small limits (BOB_LIMITS): each refusal names the limit, and what he had is kept. Last
    in the file: it moves bob's seq_ids past his SDK client's."""
    url, model = server[0], bob_training.model_id
    status, reply = _http(url, "create_session", raw=b"{" + b" " * 70_000 + b"}", key=BOB)
    assert status == 413 and "limits.body_bytes" in reply["detail"]
    session = model.split(":")[0]
    second = {"session_id": session, "model_seq_id": 50, "base_model": server[1], "lora_config": {"rank": 4}}
    status, reply = _http(url, "create_model", second, key=BOB)
    assert status == 429 and "limits.models" in reply["detail"]
    status, sampler = _http(
        url,
        "create_sampling_session",
        {"session_id": session, "sampling_session_seq_id": 70, "base_model": server[1]},
        key=BOB,
    )
    assert status == 200
    big = {
        "sampling_session_id": sampler["sampling_session_id"],
        "prompt": {"chunks": [{"tokens": TOKENS[:5], "type": "encoded_text"}]},
        "num_samples": 4,
        "sampling_params": {"max_tokens": 20},
    }  # 4 x (5 + 20) = 100 tokens, over bob's 64
    status, reply = _http(url, "asample", big, key=BOB)
    assert status == 429 and "limits.sampling_tokens" in reply["detail"]

    # training calls after a seq_id not yet sent wait, unanswered: two fill bob's queue, a third is refused
    status, reply = _http(
        url, "optim_step", {"model_id": model, "seq_id": 1, "adam_params": {"learning_rate": 0.0}}, key=BOB
    )
    next_seq = int(reply["detail"].split("the next is ")[1].rstrip(")"))
    held = [_http(url, "forward_backward", raw=_forward_backward_body(model, next_seq + k), key=BOB) for k in (1, 2)]
    assert [status for status, _ in held] == [200, 200]
    status, reply = _http(url, "forward_backward", raw=_forward_backward_body(model, next_seq + 3), key=BOB)
    assert status == 429 and "limits.queued_requests" in reply["detail"]
    # the call they wait for is taken over the limit: refusing it would hold them, and the queue, forever
    first = _http(url, "forward_backward", raw=_forward_backward_body(model, next_seq), key=BOB)
    assert first[0] == 200
    results = [_retrieve(url, reply["request_id"], BOB) for _, reply in [first, *held]]
    # the refused call, sent again, takes its turn: nothing was lost
    status, resent = _http(url, "forward_backward", raw=_forward_backward_body(model, next_seq + 3), key=BOB)
    assert status == 200
    results.append(_retrieve(url, resent["request_id"], BOB))
    assert [status for status, _ in results] == [200] * 4


@pytest.mark.slow
def test_adapters_on_one_base_share_its_host_and_train_as_alone(server):
    """Two tenants' models with the same base, rank and seed: one engine and one set of ranks (the
    server says so), each adapter switched in per call, and each trained exactly as alone: steps
    interleaved with the other tenant's give the logprobs one model alone gave, bit for bit; and the
    two tenants' sampling calls, sent together, each draw what the model alone drew."""
    url, model, _, log = server
    ours, theirs = TOKENS, TOKENS[::-1]

    def step(training, tokens: list[int]) -> None:
        training.forward_backward(
            [_datum(tokens, weights=np.ones(len(tokens) - 1, np.float32))], "cross_entropy"
        ).result()

    def apply(training) -> np.ndarray:
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        return _logprobs(training, ours)

    def create(key: str):
        return (
            tinker.ServiceClient(base_url=url, api_key=key)
            .create_lora_training_client(base_model=model, rank=4, seed=5)
            .result()
        )

    prompt, params = types.ModelInput.from_ints(ours[:5]), types.SamplingParams(max_tokens=6, seed=3)

    def sample_at_once(training_clients) -> list:
        """Each model's sampler sampled, the calls sent together: they share a batch of the host's engine
        (a LoRA slot each where adapters are not merged), each drawing as it would alone."""
        samplers = [training.save_weights_and_get_sampling_client().result() for training in training_clients]
        ours_forward = training_clients[0].forward(
            [_datum(ours, weights=np.ones(len(ours) - 1, np.float32))], "cross_entropy"
        )
        futures = [sampler.sample(prompt, 2, params) for sampler in samplers]  # queued behind the forward
        ours_forward.result()
        return [future.result().sequences for future in futures]

    alone = create(CAROL)
    expected = [_logprobs(alone, ours)]
    for _ in range(2):
        step(alone, ours)
        expected.append(apply(alone))
    [sampled_alone] = sample_at_once([alone])
    # the model alone ends (its host with it), then carol's and alice's share a new one
    assert _http(url, f"sessions/{alone.model_id.split(':')[0]}/finish", {}, key=CAROL)[0] == 200
    carols, alices = create(CAROL), create(ALICE)
    got = [_logprobs(carols, ours)]
    for _ in range(2):
        step(carols, ours)  # carol's gradient waits for her optim_step while alice trains
        step(alices, theirs)
        alices_after = apply(alices)
        got.append(apply(carols))
    for want, have in zip(expected, got):
        np.testing.assert_array_equal(have, want)
    assert not np.array_equal(alices_after, got[-1])  # alice's adapter learned her own sequence
    carols_sampled, alices_sampled = sample_at_once([carols, alices])
    assert [s.tokens for s in carols_sampled] == [s.tokens for s in sampled_alone]
    np.testing.assert_allclose([s.logprobs for s in carols_sampled], [s.logprobs for s in sampled_alone], atol=1e-5)
    # alice's call sampled her adapter, not carol's
    assert [(s.tokens, s.logprobs) for s in alices_sampled] != [(s.tokens, s.logprobs) for s in carols_sampled]
    deadline = time.monotonic() + 10
    while f"{alices.model_id} shares the loaded {model} with 1 adapter(s)" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)
    for training, key in ((carols, CAROL), (alices, ALICE)):
        assert _http(url, f"sessions/{training.model_id.split(':')[0]}/finish", {}, key=key)[0] == 200
