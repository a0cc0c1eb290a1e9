"""Where save_state's checkpoints live: CHECKPOINT_DIR/TENANT/MODEL_ID/NAME, named to clients as
tinker://MODEL_ID/weights/NAME. A path resolves only under the asking tenant's folder, so another
tenant's checkpoint is as absent as one never written, and a name cannot climb out of the folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlvr.serve.refusals import BadRequest, NotFound
from rlvr.serve.tenants import Tenant


class SavedStates:
    def __init__(self, checkpoint_dir: str):
        self.root = Path(checkpoint_dir)

    def folder(self, tenant: Tenant, model_id: str, name: str) -> Path:
        for part, what in ((model_id, "model_id"), (name, "checkpoint name")):
            if not part or part in (".", "..") or "/" in part or "\\" in part or "\0" in part:
                raise BadRequest(f"{what} {part!r}: give a name without slashes")
        return self.root / tenant.name / model_id.replace(":", "_") / name

    def path(self, model_id: str, name: str) -> str:
        return f"tinker://{model_id}/weights/{name}"

    def find(self, path: str, tenant: Tenant) -> Path:
        """The folder of a tinker://MODEL_ID/weights/NAME path save_state returned to this tenant
        (by this server or an earlier one on the same checkpoint_dir)."""
        if not path.startswith("tinker://"):
            raise BadRequest(f"{path!r} is not a tinker://MODEL_ID/weights/NAME path")
        model_id, kind, name = (path.removeprefix("tinker://").rsplit("/", 2) + ["", "", ""])[:3]
        if kind != "weights":
            raise BadRequest(f"{path!r} is not a tinker://MODEL_ID/weights/NAME path")
        folder = self.folder(tenant, model_id, name)
        if not (folder / "trainer").is_dir():
            raise NotFound(f"{path!r} is not a checkpoint save_state wrote")
        return folder


def json_file(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise BadRequest(f"{path.name}: not readable JSON ({error})") from None
    if not isinstance(found, dict):
        raise BadRequest(f"{path.name}: not a JSON object")
    return found
