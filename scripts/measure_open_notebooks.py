#!/usr/bin/env python3
"""Memory of a JupyterLab server while a learner works through every notebook, one after another.

    python scripts/measure_open_notebooks.py [--scale 60] [--no-cull] [--speed-run] [--binder] [-v] [--json FILE]

A Jupyter server starts with the course's settings (binder/jupyter_server_config.json: a kernel idle
for 20 minutes is shut down). Then, for each exercise notebook in order, as a learner would: open it
(a new kernel), run every cell (Run All), and work on it for as long as the schedule says the notebook
takes, never closing an earlier notebook. Time is compressed by ``--scale`` (60: a minute of the
learner's time is a second here), the idle time-out with it. Every half second it records the memory
(RSS) of the server and of every kernel, and it reports the peak of the total and how many kernels
were alive then. Binder's limit for all of it together is 2 GB: over it, the script fails.

``--scale 240`` (CI: about 3 minutes of waiting plus the notebooks' run time) gives the same peak as 60,
since every notebook after 00 takes a learner longer than the 20-minute time-out: whatever the speed of
the machine, an earlier notebook's kernel is culled before the next notebook opens, except 00's (9
minutes), which is still alive while 01 runs. ``--no-cull`` measures the worst case instead — every kernel kept, as with culling turned off —
and only reports it.

``--speed-run``: a learner who opens 00–12 one after another within 10 minutes (real time, not scaled: each
notebook opens at its slot of 10 min / 13, or as soon as the one before has run if that takes longer), never
closing one; no kernel is idle for 20 minutes, so none is culled. It is not expected to fit in 2 GB: what it
checks is that the memory indicator warns before the limit.

``--binder``: the server runs as on Binder: ``MEM_LIMIT`` set to 2 GiB and the course's memory indicator
(jupyter-resource-usage, with binder/jupyter_server_config.json's warning threshold). Every two seconds the
script reads what JupyterLab's status bar shows (``/api/metrics/v1``: the memory, the limit, the warning) and
reports the memory at which the warning first appeared; a speed run fails if the memory reached the limit
without a warning first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
BUDGET_MB = 2048  # Binder's memory limit for the server and all its kernels together
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
    """(server RSS, RSS of all the server's descendants — kernels and anything they started —, number of kernels).
    A process that ends while it is being read (a kernel being culled) counts as gone."""
    server = process.memory_info().rss
    total = kernels = 0
    for child in process.children(recursive=True):
        try:
            rss = child.memory_info().rss
            is_kernel = "ipykernel" in " ".join(child.cmdline())
        except psutil.Error:
            continue
        total += rss
        kernels += is_kernel
    return server, total, kernels


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=60.0, help="learner seconds per measured second (default 60)")
    parser.add_argument("--json", metavar="FILE", help="write the measurements as JSON")
    parser.add_argument("--no-cull", action="store_true",
                        help="the worst case: no idle kernel is ever shut down and no time is spent working "
                             "(every notebook's kernel stays alive); reported, never failed")
    parser.add_argument("--speed-run", action="store_true",
                        help="00-12 opened within 10 minutes of real time, none closed (see above)")
    parser.add_argument("--binder", action="store_true",
                        help="MEM_LIMIT=2 GiB and the course's memory indicator, read as the status bar reads it")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per notebook")
    args = parser.parse_args(argv)
    if args.speed_run:
        args.no_cull = False

    from attn_course import registry
    from attn_course.tools.links import _minutes

    minutes = _minutes(ROOT)
    config = json.loads((ROOT / "binder" / "jupyter_server_config.json").read_text())
    cull = 0 if args.no_cull else config["MappingKernelManager"]["cull_idle_timeout"] / args.scale
    if args.speed_run:
        cull = config["MappingKernelManager"]["cull_idle_timeout"]  # real time: 20 minutes
    if not args.no_cull and not args.speed_run and cull < 2:
        parser.error(f"--scale {args.scale:g} would cull a kernel after {cull:.1f} s: use a scale of at most "
                     f"{config['MappingKernelManager']['cull_idle_timeout'] / 2:g}")
    port, token = _port(), "measure"
    work = Path(tempfile.mkdtemp(prefix="open-notebooks-"))
    server_log = open(work / "server.log", "w")
    for nb in registry.NOTEBOOKS:
        (work / nb.filename).write_bytes((ROOT / "notebooks" / nb.filename).read_bytes())
    runtime = work / ".runtime"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(runtime), MPLBACKEND="module://matplotlib_inline.backend_inline")
    binder_args = []
    if args.binder:
        env["MEM_LIMIT"] = str(BUDGET_MB * 2**20)  # what Binder sets; the indicator reads it
        binder_args = [f"--ResourceUseDisplay.{k}={v}" for k, v in config.get("ResourceUseDisplay", {}).items()]
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--allow-root",
         f"--MappingKernelManager.cull_idle_timeout={round(cull)}", "--MappingKernelManager.cull_interval=1",
         f"--MappingKernelManager.cull_connected={str(config['MappingKernelManager']['cull_connected'])}",
         "--MappingKernelManager.cull_busy=False", *binder_args],
        cwd=work, env=env, stdout=server_log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):  # a loaded machine can take a minute to start a server
        try:
            _api(url, token, "/api/status")
            break
        except Exception:
            if server.poll() is not None:
                break
            time.sleep(0.5)
    else:
        server.terminate()
    if server.poll() is not None:
        print(f"FAILED  the Jupyter server did not start:\n{(work / 'server.log').read_text()[-3000:]}")
        return 1
    proc = psutil.Process(server.pid)
    samples: list[dict] = []
    peak = {"total": 0}
    indicator: dict = {"first_warning": None, "last_read": 0.0, "read": 0}

    def read_indicator(row: dict) -> None:
        """What JupyterLab's status bar shows, from the memory indicator's own API (every 2 s at most)."""
        if not args.binder or time.monotonic() - indicator["last_read"] < 2:
            return
        indicator["last_read"] = time.monotonic()
        try:
            metrics = _api(url, token, "/api/metrics/v1")
        except Exception:  # noqa: BLE001 - a busy server may not answer in time: the next read will
            return
        indicator["read"] += 1
        memory = metrics.get("limits", {}).get("memory", {})
        row.update(shown_mb=round(metrics.get("rss", 0) / 2**20), limit_mb=round(memory.get("rss", 0) / 2**20),
                   warn=bool(memory.get("warn")))
        if row["warn"] and indicator["first_warning"] is None:
            indicator["first_warning"] = dict(row)

    def sample(label: str) -> None:
        server_rss, kernels_rss, count = _rss(proc)
        row = {"t": round(time.monotonic() - start, 1), "at": label, "server_mb": round(server_rss / 2**20),
               "kernels_mb": round(kernels_rss / 2**20), "kernels": count, "total_mb": round((server_rss + kernels_rss) / 2**20)}
        read_indicator(row)
        samples.append(row)
        if row["total_mb"] > peak["total"]:
            peak.update(total=row["total_mb"], row=row)

    start = time.monotonic()
    slot = 600 / len(registry.NOTEBOOKS)  # a speed run opens the 13 notebooks within 10 minutes
    try:
        for position, nb in enumerate(registry.NOTEBOOKS):
            session = _api(url, token, "/api/sessions", {"path": nb.filename, "type": "notebook",
                                                         "kernel": {"name": "python3"}})
            kernel_id = session["kernel"]["id"]
            client = BlockingKernelClient(connection_file=str(runtime / f"kernel-{kernel_id}.json"))
            client.load_connection_file()
            # No heartbeat channel: on a loaded machine a heartbeat missed for a second reads as a dead kernel.
            client.start_channels(hb=False)
            client.wait_for_ready(timeout=300)
            notebook = nbformat.read(work / nb.filename, as_version=4)
            for cell in notebook.cells:
                if cell.cell_type == "code":
                    client.execute_interactive(cell.source, timeout=600, output_hook=lambda msg: None)
                    sample(f"{nb.number} running")
            client.stop_channels()  # the tab stays open: the server keeps the kernel until it is culled
            working = 0 if args.no_cull else minutes.get(nb.slug, 30) * 60 / args.scale
            until = time.monotonic() + working
            if args.speed_run:  # the next notebook opens at its slot (or at once, when running this one took longer)
                until = start + (position + 1) * slot if position + 1 < len(registry.NOTEBOOKS) else time.monotonic() + 30
            while time.monotonic() < until:
                sample(f"{nb.number} working")
                time.sleep(0.5)
            sample(f"{nb.number} done")
            row = samples[-1]
            if args.verbose:
                print(f"{nb.number}: {row['kernels']} kernel(s) alive, {row['total_mb']} MiB in all", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
        server_log.close()
        shutil.rmtree(work, ignore_errors=True)
    row = peak["row"]
    within = row["total_mb"] < BUDGET_MB
    how = ("no kernel culled (worst case)" if args.no_cull else
           "speed run: 00-12 opened within 10 minutes, none idle for 20 minutes" if args.speed_run
           else f"idle kernels culled after {cull:.0f} s = 20 min at scale {args.scale:g}")
    warned = indicator["first_warning"]
    over = next((s for s in samples if s["total_mb"] >= BUDGET_MB), None)
    warned_in_time = warned is not None and (over is None or warned["t"] <= over["t"])
    if args.speed_run:
        ok = (warned_in_time or over is None) if args.binder else True
        verdict = (f"{'within' if within else 'OVER'} the budget; " + (
            f"the memory indicator warned first at {warned['shown_mb']} MiB of {warned['limit_mb']} MiB ({warned['at']})"
            if warned else "the memory indicator never warned") if args.binder else "reported only")
    else:
        ok = within or args.no_cull
        verdict = "reported only" if args.no_cull else ("OK" if within else "OVER the budget")
        if args.binder:
            verdict += "; " + (f"the memory indicator warned at {warned['shown_mb']} MiB" if warned
                               else "the memory indicator never warned")
    if args.binder and not indicator["read"]:
        ok, verdict = False, verdict + "; the memory indicator (jupyter-resource-usage) did not answer: is it installed?"
    print(f"{'Open notebooks' if ok else 'FAILED  open notebooks'}: peak {row['total_mb']} MiB "
          f"(server {row['server_mb']} MiB + {row['kernels']} kernel(s) {row['kernels_mb']} MiB) at {row['at']}, "
          f"budget {BUDGET_MB} MiB: {verdict}; {len(registry.NOTEBOOKS)} notebooks, {how}; "
          f"{time.monotonic() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"peak": row, "no_cull": args.no_cull, "speed_run": args.speed_run,
                                               "binder": args.binder, "scale": args.scale, "first_warning": warned,
                                               "samples": samples}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
