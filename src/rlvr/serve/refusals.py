"""What the server refuses, and with which HTTP status: each refusal's message goes back to the client.

A refusal is raised before any model is touched, so a refused request leaves everything as it was.
"""

from __future__ import annotations

from rlvr.errors import UserError


class BadRequest(UserError, ValueError):
    """A request that is malformed or asks for what this server does not do: 400."""

    status = 400


class Unauthorized(BadRequest):
    """No API key, or one no tenant holds: 401."""

    status = 401


class NotFound(BadRequest):
    """A session, model, sampler, future or checkpoint that does not exist for the asking tenant: 404.
    Another tenant's things are refused exactly so, so that no answer tells them apart."""

    status = 404


class Gone(BadRequest):
    """A session that finished or expired: 410, which stops the SDK's heartbeat loop."""

    status = 410


class TooLarge(BadRequest):
    """A request body over the tenant's body_bytes: 413."""

    status = 413


class OverLimit(BadRequest):
    """A request that would take the tenant over one of its limits: 429 (the SDK retries it later)."""

    status = 429
