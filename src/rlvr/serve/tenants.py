"""Who is asking: the API key a request carries names its tenant, and each tenant sees only its own.

    tenants = Tenants(cfg)               # the keys of cfg.tenants (and their files), read once
    tenant = tenants.identify(key)       # Unauthorized (401) for no key or one nobody holds
    check_exposure(cfg.host, tenants)    # a server without keys listens on loopback only

Keys are kept as their SHA-256 digests, never printed: a key in a log is a key given away.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from rlvr.config import LimitsConfig, ServeConfig
from rlvr.config.serve import SDK_KEY_PREFIX
from rlvr.errors import UserError
from rlvr.serve.refusals import Unauthorized

# The one tenant of a server without keys: everyone who can reach its loopback address.
LOCAL_TENANT = "local"


@dataclass(frozen=True)
class Tenant:
    name: str
    limits: LimitsConfig


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _keys_in_file(path: Path, tenant: str) -> list[str]:
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise UserError(f"tenants.{tenant}.api_keys_file: {path}: {error.strerror}") from None
    keys = []
    for number, line in enumerate(lines, 1):
        key = line.split("#", 1)[0].strip()
        if not key:
            continue
        if not key.startswith(SDK_KEY_PREFIX):
            raise UserError(
                f"{path}:{number}: a key must start with {SDK_KEY_PREFIX!r}: the tinker SDK sends no other key"
            )
        keys.append(key)
    if not keys:
        raise UserError(f"tenants.{tenant}.api_keys_file: {path} holds no key")
    return keys


class Tenants:
    def __init__(self, cfg: ServeConfig):
        self._by_digest: dict[bytes, Tenant] = {}
        for name, tenant_cfg in cfg.tenants.items():
            tenant = Tenant(name, tenant_cfg.limits or cfg.limits)
            keys = [key.get_secret_value() for key in tenant_cfg.api_keys]
            if tenant_cfg.api_keys_file is not None:
                keys += _keys_in_file(Path(tenant_cfg.api_keys_file), name)
            for key in keys:
                holder = self._by_digest.setdefault(_digest(key), tenant)
                if holder is not tenant:
                    raise UserError(f"tenants.{name}: a key of tenant {holder.name} is given to {name} too")
        self._local = None if cfg.tenants else Tenant(LOCAL_TENANT, cfg.limits)

    @property
    def keyed(self) -> bool:
        return self._local is None

    def identify(self, key: str | None) -> Tenant:
        """The tenant holding `key` (a server without keys: its one tenant, whatever the key)."""
        if self._local is not None:
            return self._local
        if not key:
            raise Unauthorized("no API key: send the key this server gave you as the X-API-Key header")
        tenant = self._by_digest.get(_digest(key))
        if tenant is None:
            raise Unauthorized("API key not recognised (X-API-Key)")
        return tenant


def check_exposure(host: str, tenants: Tenants) -> None:
    """Refuse to listen beyond this machine without keys: anyone reaching the port could train and
    sample on its accelerators and read what others made."""
    if tenants.keyed or host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        loopback = False
    if not loopback:
        raise UserError(
            f"serve: host {host} is reachable from other machines and no tenant has an API key; "
            "name tenants with api_keys in the config, or listen on 127.0.0.1"
        )
