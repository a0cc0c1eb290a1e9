"""Checkpoints are atomic and verified: a broken one is skipped, a failed write keeps the last."""

import errno

import pytest

from rlvr.checkpoint.store import CheckpointError, CheckpointStore, read_state


def _write(text):
    def parts(folder):
        (folder / "trainer").mkdir()
        (folder / "trainer" / "shard.bin").write_text(text)

    return parts


def test_save_then_latest_returns_the_newest_and_prunes(tmp_path):
    store = CheckpointStore(tmp_path, keep=2, log=lambda m: None)
    for step in (10, 20, 30):
        store.save(step, {"step": step}, _write(f"w{step}"))
    assert [p.name for p in sorted((tmp_path / "checkpoints").iterdir())] == ["step_000020", "step_000030"]
    assert read_state(store.latest()) == {"step": 30}


def test_corrupt_and_partial_checkpoints_are_skipped_with_a_message(tmp_path):
    messages = []
    store = CheckpointStore(tmp_path, keep=5, log=messages.append)
    store.save(10, {"step": 10}, _write("good"))
    newest = store.save(20, {"step": 20}, _write("good"))
    (newest / "trainer" / "shard.bin").write_text("flipped")
    partial = tmp_path / "checkpoints" / "step_000030"
    partial.mkdir()
    assert store.latest().name == "step_000010"
    assert messages == [
        f"skipping checkpoint {partial}: no manifest (partial write)",
        f"skipping checkpoint {newest}: trainer/shard.bin does not match its checksum",
    ]


def test_a_full_disk_while_writing_keeps_the_previous_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path, keep=2, log=lambda m: None)
    store.save(10, {"step": 10}, _write("good"))

    def disk_full(folder):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointError) as err:
        store.save(20, {"step": 20}, disk_full)
    assert str(err.value) == (
        f"checkpoint of step 20 failed in {tmp_path / 'checkpoints'}: No space left on device; "
        "the previous checkpoint step_000010 is intact"
    )
    assert store.latest().name == "step_000010"
    assert not list((tmp_path / "checkpoints").glob(".*tmp"))
