#!/usr/bin/env python3
"""Memory of a JupyterLab server while a learner works through every notebook, one after another.

    python scripts/measure_open_notebooks.py [--scale 60] [--json FILE]

A Jupyter server starts with the course's settings (binder/jupyter_server_config.json: a kernel idle
for 20 minutes is shut down). Then, for each exercise notebook in order, as a learner would: open it
(a new kernel), run every cell (Run All), and work on it for as long as the schedule says the notebook
takes, never closing an earlier notebook. Time is compressed by ``--scale`` (60: a minute of the
learner's time is a second here), the idle time-out with it. Every half second it records the memory
(RSS) of the server and of every kernel, and it reports the peak of the total and how many kernels
were alive then. Binder's limit for all of it together is 2 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import psutil
from jupyter_client import BlockingKernelClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(url: str, token: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(f"{url}{path}", method="POST" if body is not None else "GET",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"{}")


def _rss(process: psutil.Process) -> tuple[int, int, int]:
    """(server RSS, all kernels' RSS, number of kernels)."""
    server = process.memory_info().rss
    kernels = [p for p in process.children(recursive=True) if "ipykernel" in " ".join(p.cmdline())]
    total = 0
    for kernel in kernels:
        try:
            total += kernel.memory_info().rss
        except psutil.Error:
            pass
    return server, total, len(kernels)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=60.0, help="learner seconds per measured second (default 60)")
    parser.add_argument("--json", metavar="FILE", help="write the measurements as JSON")
    args = parser.parse_args(argv)

    from attn_course import registry
    from attn_course.tools.links import _minutes

    minutes = _minutes(ROOT)
    config = json.loads((ROOT / "binder" / "jupyter_server_config.json").read_text())
    cull = config["MappingKernelManager"]["cull_idle_timeout"] / args.scale
    port, token = _port(), "measure"
    work = Path(tempfile.mkdtemp(prefix="open-notebooks-"))
    for nb in registry.NOTEBOOKS:
        (work / nb.filename).write_bytes((ROOT / "notebooks" / nb.filename).read_bytes())
    runtime = work / ".runtime"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(runtime), MPLBACKEND="module://matplotlib_inline.backend_inline")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--allow-root",
         f"--MappingKernelManager.cull_idle_timeout={cull:.0f}", "--MappingKernelManager.cull_interval=2",
         f"--MappingKernelManager.cull_connected={str(config['MappingKernelManager']['cull_connected'])}",
         "--MappingKernelManager.cull_busy=False"],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            _api(url, token, "/api/status")
            break
        except Exception:
            time.sleep(0.5)
    proc = psutil.Process(server.pid)
    samples: list[dict] = []
    peak = {"total": 0}

    def sample(label: str) -> None:
        server_rss, kernels_rss, count = _rss(proc)
        row = {"t": round(time.monotonic() - start, 1), "at": label, "server_mb": round(server_rss / 2**20),
               "kernels_mb": round(kernels_rss / 2**20), "kernels": count, "total_mb": round((server_rss + kernels_rss) / 2**20)}
        samples.append(row)
        if row["total_mb"] > peak["total"]:
            peak.update(total=row["total_mb"], row=row)

    start = time.monotonic()
    try:
        for nb in registry.NOTEBOOKS:
            session = _api(url, token, "/api/sessions", {"path": nb.filename, "type": "notebook",
                                                         "kernel": {"name": "python3"}})
            kernel_id = session["kernel"]["id"]
            client = BlockingKernelClient(connection_file=str(runtime / f"kernel-{kernel_id}.json"))
            client.load_connection_file()
            client.start_channels()
            client.wait_for_ready(timeout=120)
            notebook = nbformat.read(work / nb.filename, as_version=4)
            for cell in notebook.cells:
                if cell.cell_type == "code":
                    client.execute_interactive(cell.source, timeout=600, output_hook=lambda msg: None)
                    sample(f"{nb.number} running")
            client.stop_channels()  # the tab stays open: the server keeps the kernel until it is culled
            working = minutes.get(nb.slug, 30) * 60 / args.scale
            until = time.monotonic() + working
            while time.monotonic() < until:
                sample(f"{nb.number} working")
                time.sleep(0.5)
            row = samples[-1]
            print(f"{nb.number}: {row['kernels']} kernel(s) alive, {row['total_mb']} MB in all", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    row = peak["row"]
    print(f"peak: {row['total_mb']} MB (server {row['server_mb']} MB + {row['kernels']} kernels {row['kernels_mb']} MB) "
          f"at {row['at']}; idle kernels culled after {cull:.0f} s (20 min at scale {args.scale:g})")
    if args.json:
        Path(args.json).write_text(json.dumps({"peak": row, "samples": samples}, indent=1))
    return 0 if row["total_mb"] < 2048 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
