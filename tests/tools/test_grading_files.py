"""Reading submissions safely and accounting for every entry of a class folder
(attn_course.tools.grading.files)."""

from __future__ import annotations

import os
import threading

import pytest

from attn_course.tools.grading import files


def test_read_file_reads_a_regular_file(tmp_path):
    (tmp_path / "a.ipynb").write_bytes(b"{}")
    assert files.read_file(tmp_path / "a.ipynb") == b"{}"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_named_like_a_notebook_never_blocks(tmp_path):
    fifo = tmp_path / "01_dot_product.ipynb"
    os.mkfifo(fifo)
    result = {}
    reader = threading.Thread(target=lambda: result.update(error=_error(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading a FIFO hung"
    assert "FIFO" in result["error"]


def _error(path) -> str:
    try:
        files.read_file(path)
    except files.Unreadable as exc:
        return str(exc)
    return "read"


def test_links_and_devices_are_refused_before_reading(tmp_path):
    (tmp_path / "zero.ipynb").symlink_to("/dev/zero")
    assert "symbolic link" in _error(tmp_path / "zero.ipynb")
    if os.path.exists("/dev/zero"):
        assert "device" in _error("/dev/zero")


def test_size_is_checked_before_reading(tmp_path):
    big = tmp_path / "big.ipynb"
    with big.open("wb") as fh:
        fh.truncate(3 * 2**20)  # a sparse file: large, costs nothing
    with pytest.raises(files.Unreadable, match="too large"):
        files.read_file(big, limit=2**20)


def _class(tmp_path):
    root = tmp_path / "home" / "backups" / "class"  # an absolute path with a folder named backups in it
    (root / "ada").mkdir(parents=True)
    (root / "ada" / "05_attention.ipynb").write_text("{}")
    (root / "ada" / "notebooks" / "backups").mkdir(parents=True)
    (root / "ada" / "notebooks" / "backups" / "05_attention-20250101-1200.ipynb").write_text("{}")
    (root / "ada" / ".ipynb_checkpoints").mkdir()
    (root / "ada" / ".ipynb_checkpoints" / "05_attention-checkpoint.ipynb").write_text("{}")
    (root / "ada" / "notes.txt").write_text("hi")
    (root / "bob").mkdir()  # empty
    (root / "cy").mkdir()
    (root / "cy" / "03_SOFTMAX.IPYNB").write_text("{}")
    (root / "cy" / "work.zip").write_bytes(b"PK")
    (root / "dee" / ".ipynb_checkpoints").mkdir(parents=True)
    (root / "dee" / ".ipynb_checkpoints" / "03_softmax-checkpoint.ipynb").write_text("{}")
    (root / "eve.ipynb").write_text("{}")
    (root / "class.zip").write_bytes(b"PK")
    (root / "README.txt").write_text("x")
    (root / "link").symlink_to(tmp_path)
    (root / "cy" / "solution.ipynb").symlink_to(root / "eve.ipynb")
    if hasattr(os, "mkfifo"):
        os.mkfifo(root / "cy" / "pipe.ipynb")
    return root


def test_every_entry_of_a_class_folder_is_a_notebook_or_a_named_warning(tmp_path):
    scan = files.scan_class(_class(tmp_path))
    assert sorted(scan.learners) == ["ada", "bob", "cy", "dee", "eve"]
    where = {f.rel: f.where for f in scan.learners["ada"]}
    assert where == {"ada/05_attention.ipynb": "notebook",
                     "ada/notebooks/backups/05_attention-20250101-1200.ipynb": "backup",
                     "ada/.ipynb_checkpoints/05_attention-checkpoint.ipynb": "checkpoint"}
    assert [f.rel for f in scan.learners["cy"]] == ["cy/03_SOFTMAX.IPYNB"]
    assert [f.where for f in scan.learners["dee"]] == ["checkpoint"]
    text = "\n".join(scan.warnings)
    for expected in ("bob: no notebook", "cy/work.zip: an archive", "class.zip: an archive", "README.txt: not a notebook",
                     "link: a symbolic link", "cy/solution.ipynb: a symbolic link", "ada: ignored what is not a notebook: notes.txt"):
        assert expected in text, text
    if hasattr(os, "mkfifo"):
        assert "cy/pipe.ipynb: a FIFO" in text


def test_snapshot_changes_name_created_changed_and_deleted_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("1")
    (tmp_path / "a" / "gone").write_text("1")
    before = files.snapshot(tmp_path)
    (tmp_path / "a" / "x").write_text("22")
    (tmp_path / "a" / "gone").unlink()
    (tmp_path / "a" / "planted.ipynb").write_text("{}")
    assert files.changes(before, files.snapshot(tmp_path)) == [
        ("a/gone", "deleted"), ("a/planted.ipynb", "created"), ("a/x", "changed")]
