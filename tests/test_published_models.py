"""`rlvr fetch` / `make qwen`: a GGUF file assembled from the pieces its part wheels carry, refused
unless its size and sha256 are the pinned ones, then imported and quantized. The wheels here are
small ones laid out as pip installs a wheel (a package folder and its .dist-info with a RECORD),
so importlib.metadata finds them as it finds the real ones; nothing is downloaded."""

import dataclasses
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.quant import published
from rlvr.quant.formats import read_quantization_config
from rlvr.quant.published import PUBLISHED, PartWheels, assemble_gguf, build_published_model, part_files


def install_like_pip(site: Path, wheels: PartWheels, pieces: list[bytes], version: str | None = None) -> None:
    """`site` as pip leaves it after installing `wheels`, part i carrying `pieces[i]` as data/partNN.bin."""
    for number, (name, piece) in enumerate(zip(wheels.distributions, pieces, strict=True), start=1):
        package = name.replace("-", "_")
        data = site / package / "data"
        data.mkdir(parents=True)
        (data / f"part{number:02d}.bin").write_bytes(piece)
        info = site / f"{package}-{version or wheels.version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version or wheels.version}\n")
        (info / "RECORD").write_text(
            f"{package}/__init__.py,,\n{package}/data/part{number:02d}.bin,,\n{info.name}/RECORD,,\n"
        )


def pinned(pieces: list[bytes], prefix: str = "rlvr-test-part") -> PartWheels:
    whole = b"".join(pieces)
    return PartWheels(
        gguf_name="model.gguf",
        wheel_prefix=prefix,
        version="1.0.0",
        count=len(pieces),
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
    )


PIECES = [os.urandom(1000), os.urandom(1), os.urandom(4093)]


def test_the_pieces_are_streamed_in_order_into_the_pinned_file(tmp_path, monkeypatch):
    monkeypatch.setattr(published, "CHUNK_BYTES", 64)  # many reads per piece, a piece shorter than one
    parts = []
    for number, piece in enumerate(PIECES, start=1):
        parts.append(tmp_path / f"part{number:02d}.bin")
        parts[-1].write_bytes(piece)
    wheels = pinned(PIECES)
    out = assemble_gguf(parts, tmp_path / "out" / "model.gguf", wheels.size, wheels.sha256)
    assert out.read_bytes() == b"".join(PIECES)
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]


@pytest.mark.parametrize("wrong", ["sha256", "size", "order"])
def test_a_file_that_is_not_the_pinned_one_is_refused_in_one_line_and_deleted(tmp_path, wrong):
    wheels = pinned(PIECES)
    pieces = {"sha256": [PIECES[0], bytes([PIECES[1][0] ^ 1]), PIECES[2]], "size": PIECES[:2], "order": PIECES[::-1]}[
        wrong
    ]
    parts = []
    for number, piece in enumerate(pieces, start=1):
        parts.append(tmp_path / f"part{number:02d}.bin")
        parts[-1].write_bytes(piece)
    out = tmp_path / "out" / "model.gguf"
    with pytest.raises(ValueError) as refused:
        assemble_gguf(parts, out, wheels.size, wheels.sha256)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{out}: the pieces give {len(b''.join(pieces)):,} bytes")
    assert f"not the pinned {wheels.size:,} bytes with sha256 {wheels.sha256}" in message
    assert list(out.parent.iterdir()) == []


def test_the_pieces_are_found_through_the_installed_distributions(tmp_path, monkeypatch):
    wheels = pinned(PIECES)
    install_like_pip(tmp_path / "site", wheels, PIECES)
    monkeypatch.syspath_prepend(tmp_path / "site")
    assert [p.read_bytes() for p in part_files(wheels)] == PIECES

    older = dataclasses.replace(wheels, wheel_prefix="rlvr-old-part")
    install_like_pip(tmp_path / "old", older, PIECES, version="0.1.0")
    monkeypatch.syspath_prepend(tmp_path / "old")
    with pytest.raises(ValueError, match=r"^rlvr-old-part1: version 0.1.0 is installed, not the pinned 1.0.0$"):
        part_files(older)
    assert published.install_part_wheels(wheels) == []  # all there at the pinned version: pip does not run


def test_a_tiny_published_model_is_built_then_every_step_is_skipped(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    from gguf_fixtures import tiny_llama_gguf

    _, gguf_path = tiny_llama_gguf(tmp_path, "Q8_0")
    whole = gguf_path.read_bytes()
    pieces = [whole[: len(whole) // 3], whole[len(whole) // 3 :]]
    wheels = pinned(pieces)
    install_like_pip(tmp_path / "site", wheels, pieces)
    monkeypatch.syspath_prepend(tmp_path / "site")

    lines = []
    folders = build_published_model(wheels, tmp_path / "built", say=lines.append)
    assert folders.gguf.read_bytes() == whole
    assert read_quantization_config(folders.nvfp4)["quant_method"] == "compressed-tensors"
    assert (folders.hf / "config.json").is_file() and (folders.nvfp4 / "model.safetensors").is_file()
    expected = [
        "part wheels rlvr-test-part1..2==1.0.0: already installed (",
        f"{folders.gguf}: assembled, {wheels.size:,} bytes, sha256 verified (",
        f"{folders.hf}: imported as rlvr import does (",
        f"{folders.nvfp4}: quantized as rlvr quantize --format nvfp4 does (",
    ]
    assert len(lines) == len(expected) and all(map(str.startswith, lines, expected)), lines
    written = {path: path.stat().st_mtime_ns for path in (tmp_path / "built").rglob("*")}

    lines.clear()
    build_published_model(wheels, tmp_path / "built", say=lines.append)
    assert lines == [f"{folders.hf}: already imported", f"{folders.nvfp4}: already quantized"]
    assert {path: path.stat().st_mtime_ns for path in (tmp_path / "built").rglob("*")} == written


def fetch(*args, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "fetch", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_rlvr_fetch_refuses_pieces_that_are_not_the_published_file(tmp_path):
    """The real pins, with small wheels of the pinned names and version installed in their place."""
    wheels = PUBLISHED["qwen2.5-coder-0.5b"]
    install_like_pip(tmp_path / "site", wheels, [b"not qwen"] * wheels.count)
    done = fetch("qwen2.5-coder-0.5b", tmp_path / "qwen", site=tmp_path / "site")
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert errors[0] == (
        f"error: {tmp_path / 'qwen' / wheels.gguf_name}: the pieces give {8 * wheels.count} bytes with sha256 "
        f"{hashlib.sha256(b'not qwen' * wheels.count).hexdigest()}, not the pinned 491,400,064 bytes "
        f"with sha256 {wheels.sha256}; refused and deleted"
    )
    assert list((tmp_path / "qwen").iterdir()) == []
    with pytest.raises(
        ValueError, match=r"^'qwen9' is not a published model; known: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b$"
    ):
        build_published_model("qwen9", tmp_path / "other")
