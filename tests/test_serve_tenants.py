"""API keys -> tenants, and the server's refusal to listen beyond loopback without them: pure, no model."""

from __future__ import annotations

import pytest

from rlvr.config import ServeConfig
from rlvr.errors import UserError
from rlvr.serve.refusals import Unauthorized
from rlvr.serve.tenants import LOCAL_TENANT, Tenants, check_exposure


def _config(**tenants) -> ServeConfig:
    return ServeConfig.model_validate({"tenants": tenants, "limits": {"models": 3}})


def test_each_key_names_its_tenant_with_its_own_limits(tmp_path):
    keys = tmp_path / "bob.keys"
    keys.write_text("# bob's two clients\ntml-bob-1\n\n  tml-bob-2  # the laptop\n")
    tenants = Tenants(
        _config(alice={"api_keys": ["tml-alice"]}, bob={"api_keys_file": str(keys), "limits": {"models": 1}})
    )
    assert tenants.keyed
    assert tenants.identify("tml-alice").name == "alice" and tenants.identify("tml-alice").limits.models == 3
    assert {tenants.identify(key).name for key in ("tml-bob-1", "tml-bob-2")} == {"bob"}
    assert tenants.identify("tml-bob-2").limits.models == 1
    for key in (None, "", "tml-alicE", "tml-bob-1 "):
        with pytest.raises(Unauthorized):
            tenants.identify(key)


def test_without_tenants_every_caller_is_the_one_local_tenant():
    tenants = Tenants(ServeConfig())
    assert not tenants.keyed
    assert tenants.identify(None).name == tenants.identify("tml-anything").name == LOCAL_TENANT


def test_bad_keys_are_refused_naming_where_without_echoing_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"tenants.alice.api_keys\n.*key 2 must start with 'tml-'") as refused:
        _config(alice={"api_keys": ["tml-ok", "sk-secret-value"]})
    assert "sk-secret-value" not in str(refused.value)
    with pytest.raises(ValueError, match="tenants.alice\n.*give api_keys or api_keys_file"):
        _config(alice={})
    keys = tmp_path / "keys"
    keys.write_text("tml-one\nsk-secret-value\n")
    with pytest.raises(UserError, match=f"^{keys}:2: a key must start with 'tml-'") as refused:
        Tenants(_config(bob={"api_keys_file": str(keys)}))
    assert "sk-secret-value" not in str(refused.value)
    with pytest.raises(UserError, match="tenants.bob.api_keys_file: .*missing.keys: No such file"):
        Tenants(_config(bob={"api_keys_file": str(tmp_path / "missing.keys")}))
    with pytest.raises(UserError, match="a key of tenant alice is given to bob too"):
        Tenants(_config(alice={"api_keys": ["tml-shared"]}, bob={"api_keys": ["tml-shared"]}))


def test_the_key_is_never_printed_with_the_config():
    cfg = _config(alice={"api_keys": ["tml-very-secret"]})
    assert "tml-very-secret" not in repr(cfg) and "tml-very-secret" not in cfg.model_dump_json()


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_needs_no_keys(host):
    check_exposure(host, Tenants(ServeConfig()))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "my-host.example"])
def test_any_other_address_needs_keys(host):
    with pytest.raises(UserError, match=f"host {host} is reachable from other machines"):
        check_exposure(host, Tenants(ServeConfig()))
    check_exposure(host, Tenants(_config(alice={"api_keys": ["tml-alice"]})))


def test_a_serve_file_names_a_bad_key_s_place_not_the_key(tmp_path):
    from rlvr.config import load_config

    config = tmp_path / "serve.yaml"
    config.write_text("tenants:\n  alice:\n    api_keys: [sk-secret-value]\n")
    with pytest.raises(ValueError) as refused:
        load_config(config, schema=ServeConfig)
    assert str(refused.value) == (
        f"{config}: tenants.alice.api_keys: key 1 must start with 'tml-': the tinker SDK sends no other key"
    )
    config.write_text("tenants:\n  alice:\n    api_key: tml-x\n")
    with pytest.raises(ValueError, match="unknown key 'tenants.alice.api_key'; did you mean tenants.alice.api_keys"):
        load_config(config, schema=ServeConfig)
    config.write_text("port: 70000\n")
    with pytest.raises(ValueError, match="port: .* 65535 \\(got 70000\\)"):  # values outside tenants are shown
        load_config(config, schema=ServeConfig)


def test_a_model_on_a_loaded_base_claims_its_adapter_alone(tmp_path):
    """Models whose base, LoRA rank and seed agree share one host: the base is counted once, however
    many tenants train on it; another seed or rank is another host, and its base counts again."""
    from rlvr.models.tiny import build_tiny_model
    from rlvr.serve.base_host import HostKey
    from rlvr.serve.futures import FutureStore
    from rlvr.serve.model import planned_bytes, served_sections
    from rlvr.serve.registry import ModelRegistry
    from rlvr.serve.work_line import WorkLine

    folder = str(build_tiny_model(tmp_path / "model", "qwen2", hidden_size=64, num_layers=2, num_heads=2))
    cfg = _config(alice={"api_keys": ["tml-alice"]}, bob={"api_keys": ["tml-bob"]})
    tenants = Tenants(cfg)
    alice, bob = tenants.identify("tml-alice"), tenants.identify("tml-bob")
    sections = served_sections(folder, 4, cfg, log=lambda *_: None)
    planned = planned_bytes(sections)
    assert 0 < planned.adapter < planned.base
    registry = ModelRegistry(cfg, memory_budget=planned.total + 1.5 * planned.adapter, work=WorkLine(FutureStore()))
    registry.claim(alice, "a:train:0", sections, HostKey(folder, 4, 0))
    registry.claim(bob, "b:train:0", sections, HostKey(folder, 4, 0))
    assert registry.held_bytes() == pytest.approx(planned.base + 2 * planned.adapter)
    # a third adapter passes the budget; the message says the base is loaded already
    with pytest.raises(UserError, match=r"its adapter \(the base is loaded already\).*nothing was loaded"):
        registry.claim(bob, "b:train:1", sections, HostKey(folder, 4, 0))
    registry.memory_budget = 10 * planned.total
    registry.claim(bob, "b:train:1", sections, HostKey(folder, 4, 1))  # another seed: its own host
    assert registry.held_bytes() == pytest.approx(2 * planned.base + 3 * planned.adapter)
    registry.work.close()


def test_a_served_model_s_sequences_are_bounded_by_engine_max_model_len(tmp_path):
    """A served model has no data of its own: its plan checks engine.max_model_len, the longest
    sequence a client may send or sample, against the model and the trainer's micro-batches."""
    from rlvr.models.tiny import build_tiny_model
    from rlvr.serve.model import planned_bytes, served_sections

    folder = str(build_tiny_model(tmp_path / "model", "qwen2", hidden_size=64, num_layers=2, num_heads=2))

    def planned(engine: dict, trainer: dict):
        cfg = ServeConfig.model_validate({"engine": engine, "trainer": trainer})
        return planned_bytes(served_sections(folder, 4, cfg, log=lambda *_: None))

    assert planned({"max_model_len": 1024}, {"micro_batch_tokens": 1024}).total > 0
    assert planned({"max_model_len": None}, {"micro_batch_tokens": 1}).total > 0  # as long as the engine makes them
    with pytest.raises(UserError, match=r"engine.max_model_len=2048 exceeds the model's max_position_embeddings=1024"):
        planned({"max_model_len": 2048}, {"micro_batch_tokens": 4096})
    with pytest.raises(
        UserError, match=r"trainer.micro_batch_tokens=512 < the longest sequence \(engine.max_model_len=1024\)$"
    ):
        planned({"max_model_len": 1024}, {"micro_batch_tokens": 512})
