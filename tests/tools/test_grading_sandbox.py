"""Confinement primitives (attn_course.tools.grading.sandbox): limits that cannot break the grader,
Landlock, capabilities, and killing every process a submission started."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from attn_course.tools.grading import sandbox

LINUX = sys.platform.startswith("linux")


def _child(code: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          **kwargs)


def test_clamp_never_asks_for_more_than_the_hard_limit():
    inf = resource.RLIM_INFINITY
    assert sandbox.clamp(8 << 30, (inf, inf)) == (8 << 30, 8 << 30)
    assert sandbox.clamp(8 << 30, (2 << 30, 2 << 30)) == (2 << 30, 2 << 30)  # a shell's lower limit wins
    assert sandbox.clamp(8 << 30, (inf, 4 << 30)) == (4 << 30, 4 << 30)
    assert sandbox.clamp(None, (inf, 4 << 30)) == (4 << 30, 4 << 30)
    assert sandbox.clamp(1 << 20, (2 << 30, inf)) == (1 << 20, 1 << 20)


def test_limits_apply_under_a_shell_with_a_lower_address_space_limit():
    """The old grader turned every submission into "Exception occurred in preexec_fn" here."""
    lowered = 6 << 30

    def lower():
        resource.setrlimit(resource.RLIMIT_AS, (lowered, lowered))

    done = _child("""
        import resource
        from attn_course.tools.grading import sandbox
        problems = sandbox.apply_rlimits(sandbox.Limits(address_space_mb=8192))
        print(problems, resource.getrlimit(resource.RLIMIT_AS))
    """, preexec_fn=lower)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[] ({lowered}, {lowered})"


@pytest.mark.skipif(sandbox.landlock_abi() < 1, reason="Landlock is not available here")
def test_landlock_confines_writes_to_the_folder_for_subprocesses_too(tmp_path):
    inside, outside = tmp_path / "work", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    done = _child(f"""
        import os, subprocess
        from pathlib import Path
        from attn_course.tools.grading import sandbox
        print(sandbox.confine(Path({str(inside)!r})))
        Path({str(inside)!r}, "ok.txt").write_text("fine")
        for attempt in (lambda: Path({str(outside)!r}, "py.txt").write_text("no"),
                        lambda: os.rename({str(inside)!r} + "/ok.txt", {str(outside)!r} + "/moved.txt")):
            try:
                attempt()
                print("ESCAPED")
            except OSError:
                print("refused")
        subprocess.run(["sh", "-c", "echo no > {outside}/sh.txt"], stderr=subprocess.DEVNULL)
    """)
    assert done.returncode == 0, done.stderr
    assert "landlock ABI" in done.stdout and done.stdout.count("refused") == 2, done.stdout
    assert (inside / "ok.txt").read_text() == "fine"
    assert list(outside.iterdir()) == []  # nor by a shell started from it


def test_readable_roots_leave_out_every_protected_folder_and_the_way_to_it(tmp_path):
    """A readable folder that holds a protected one is replaced by its other entries, level by level; a
    link to a protected folder does not open it; a folder named readable inside a protected one stays."""
    shared = tmp_path / "shared"
    for sub in ("x/class/ada", "x/other", "y", "course/.venv/lib"):
        (shared / sub).mkdir(parents=True)
    (shared / "y" / "to-class").symlink_to(shared / "x" / "class")
    (shared / "x" / "notes.txt").write_text("n")
    protect = [shared / "x" / "class", shared / "course"]
    roots = sandbox.readable_roots([shared, shared / "course" / ".venv"], protect=protect)
    mine = sorted(r for r in roots if r.startswith(str(shared)))
    assert mine == [str(shared / "course" / ".venv"), str(shared / "x" / "notes.txt"), str(shared / "x" / "other"),
                    str(shared / "y")], mine
    assert all(not r.startswith(str(protect[0])) for r in roots)
    assert set(sandbox.SYSTEM_READABLE) & set(roots) >= {"/usr", "/etc", "/proc"}
    assert any(os.path.realpath(sys.prefix) == r or os.path.realpath(sys.prefix).startswith(r + "/") for r in roots)


@pytest.mark.skipif(sandbox.landlock_abi() < 1, reason="Landlock is not available here")
def test_landlock_confines_reads_to_the_system_python_and_the_folder(tmp_path):
    """With ``readable``, a classmate's file and the course's solutions can be neither read nor listed, by
    Python or by a program it starts; Python's own files (a module imported only now) still can."""
    inside, secret = tmp_path / "work", tmp_path / "class"
    inside.mkdir()
    (secret / "ada").mkdir(parents=True)
    (secret / "ada" / "answer.py").write_text("ADA'S ANSWER")
    readable = sandbox.readable_roots([], protect=[secret])
    done = _child(f"""
        import os, subprocess
        from pathlib import Path
        from attn_course.tools.grading import sandbox
        print(sandbox.confine(Path({str(inside)!r}), readable={readable!r}))
        Path({str(inside)!r}, "ok.txt").write_text("mine")
        print(Path({str(inside)!r}, "ok.txt").read_text())
        import fractions, json  # modules imported after confining: Python's own files are readable
        for attempt in (lambda: open({str(secret / "ada" / "answer.py")!r}).read(),
                        lambda: os.listdir({str(secret)!r})):
            try:
                print("ESCAPED", attempt())
            except OSError:
                print("refused")
        shown = subprocess.run(["cat", {str(secret / "ada" / "answer.py")!r}], capture_output=True, text=True)
        print("cat:", shown.returncode != 0 and "ANSWER" not in shown.stdout)
    """, cwd=str(inside))
    assert done.returncode == 0, done.stderr
    assert "reads only in it" in done.stdout and done.stdout.count("refused") == 2, done.stdout
    assert "mine" in done.stdout and "cat: True" in done.stdout and "ESCAPED" not in done.stdout, done.stdout


def test_without_landlock_an_audit_hook_refuses_python_reads_of_protected_folders(tmp_path):
    inside, secret = tmp_path / "work", tmp_path / "class"
    (secret / "ada").mkdir(parents=True)
    (secret / "ada" / "answer.py").write_text("ADA'S ANSWER")
    (secret / "env").mkdir()
    (secret / "env" / "lib.py").write_text("LIBRARY")
    inside.mkdir()
    done = _child(f"""
        import os
        from pathlib import Path
        from attn_course.tools.grading import sandbox
        sandbox.audit_guard(Path({str(inside)!r}), protect=[Path({str(secret)!r})],
                            readable=[{str(secret / "env")!r}])
        print(open({str(secret / "env" / "lib.py")!r}).read())  # named readable inside a protected folder
        own = os.open(".", os.O_RDONLY)  # its own folder's descriptor may be opened (and used below)
        for attempt in (lambda: open({str(secret / "ada" / "answer.py")!r}).read(),
                        lambda: Path({str(secret / "ada")!r}).iterdir().__next__(),
                        lambda: os.scandir({str(secret)!r}),
                        # a path relative to a folder's descriptor (dir_fd), which the hook is not shown, could name
                        # the protected file: no other folder's descriptor, and no climbing with '..' from its own
                        lambda: os.open({str(secret.parent)!r}, os.O_RDONLY),
                        lambda: os.read(os.open("../class/ada/answer.py", os.O_RDONLY, dir_fd=own), 99),
                        lambda: os.open({str(secret / "env")!r}, os.O_RDONLY),  # any folder but its own
                        lambda: os.link({str(secret / "ada" / "answer.py")!r}, "linked.py")):  # a new name for it
            try:
                print("ESCAPED", attempt())
            except PermissionError:
                print("refused")
    """, cwd=str(inside))
    assert done.stdout.split() == ["LIBRARY"] + ["refused"] * 7, done.stdout + done.stderr


@pytest.mark.skipif(sandbox.landlock_abi() < 6, reason="signal scoping needs Landlock ABI 6")
def test_landlock_forbids_signalling_processes_outside(tmp_path):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        done = _child(f"""
            import os, signal
            from pathlib import Path
            from attn_course.tools.grading import sandbox
            sandbox.confine(Path({str(tmp_path)!r}))
            try:
                os.kill({victim.pid}, signal.SIGKILL)
                print("killed")
            except PermissionError:
                print("refused")
        """)
        assert done.stdout.strip() == "refused", done.stderr
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.skipif(sandbox.landlock_abi() < 4, reason="TCP rules need Landlock ABI 4 (Linux 6.7)")
def test_landlock_forbids_tcp_connections(tmp_path):
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    try:
        done = _child(f"""
            import socket
            from pathlib import Path
            from attn_course.tools.grading import sandbox
            sandbox.confine(Path({str(tmp_path)!r}))
            try:
                socket.create_connection(("127.0.0.1", {server.getsockname()[1]}), timeout=5)
                print("connected")
            except PermissionError:
                print("refused")
        """)
        assert done.stdout.strip() == "refused", done.stderr
    finally:
        server.close()


@pytest.mark.skipif(not LINUX or os.geteuid() != 0, reason="only root has capabilities to drop")
def test_root_gives_up_its_capabilities():
    done = _child("""
        import resource
        from attn_course.tools.grading import sandbox
        assert sandbox.drop_capabilities()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
            print("raised")
        except ValueError:
            print("refused")
    """)
    assert done.stdout.strip() == "refused", done.stderr


@pytest.mark.skipif(not LINUX, reason="process-tree containment is tested on Linux")
@pytest.mark.slow
def test_kill_tree_and_sweep_reach_double_forked_and_new_session_children(tmp_path):
    """A subreaper keeps escaped children in its tree; the token finds anything else."""
    token = f"test-{os.getpid()}-{time.time_ns()}"
    pids = tmp_path / "pids"
    server = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, subprocess, sys, time
        from attn_course.tools.grading import sandbox
        sandbox.become_subreaper()
        env = dict(os.environ, {sandbox.TOKEN_ENV}={token!r})
        code = "import os, sys, time\\nif os.fork(): sys.exit(0)\\nos.setsid()\\nopen({str(pids)!r}, 'a').write(str(os.getpid()) + '\\\\n')\\ntime.sleep(300)"
        subprocess.Popen([sys.executable, "-c", code], env=env).wait()
        subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True).wait()
        time.sleep(300)
    """)])
    try:
        for _ in range(600):
            if pids.exists() and len(pids.read_text().split()) == 2:
                break
            time.sleep(0.05)
        escaped = [int(p) for p in pids.read_text().split()]
        assert set(escaped) <= {d.pid for d in sandbox.descendants(server.pid)}  # still in the subreaper's tree
        sandbox.kill_tree(server.pid, include_root=False)
        time.sleep(0.2)
        for pid in escaped:
            assert not _alive(pid)
        assert sandbox.sweep(token) == 0  # nothing left that carries the token
    finally:
        server.kill()
        server.wait()


def _sleeper(token: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                            env=dict(os.environ, **{sandbox.TOKEN_ENV: token}), start_new_session=True)


@pytest.mark.skipif(not LINUX, reason="tokens are read from /proc")
def test_sweep_kills_what_carries_the_token_or_a_runs_token_and_nothing_else():
    token = f"sweep-{os.getpid()}-{time.time_ns()}"
    mine, my_run, other = _sleeper(token), _sleeper(f"{token}-3"), _sleeper(f"{token}0-3")  # other: another grader
    try:
        time.sleep(0.2)
        assert sandbox.sweep(token) == 2
        assert mine.wait(timeout=10) == my_run.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        for proc in (mine, my_run, other):
            proc.kill()
            proc.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def test_without_landlock_an_audit_hook_refuses_python_writes_outside(tmp_path):
    inside, outside = tmp_path / "work", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    (outside / "source.txt").write_text("library file")
    done = _child(f"""
        import shutil
        from pathlib import Path
        from attn_course.tools.grading import sandbox
        sandbox.audit_guard(Path({str(inside)!r}))
        shutil.copy({str(outside / "source.txt")!r}, {str(inside / "copy.txt")!r})  # reading from outside is fine
        for attempt in (lambda: Path({str(outside)!r}, "x.txt").write_text("no"),
                        lambda: shutil.copy({str(inside / "copy.txt")!r}, {str(outside / "back.txt")!r}),
                        lambda: Path({str(outside / "source.txt")!r}).unlink()):
            try:
                attempt()
                print("ESCAPED")
            except PermissionError:
                print("refused")
    """)
    assert done.stdout.split() == ["refused"] * 3, done.stdout + done.stderr
    assert (inside / "copy.txt").exists() and sorted(p.name for p in outside.iterdir()) == ["source.txt"]
