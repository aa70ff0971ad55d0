"""All of the course's GPU work in one prepared run (docs/gpu-results.md): ``python scripts/gpu_finale.py``.

On a machine with a CUDA GPU it

1. prints the device, NVIDIA driver, CUDA, torch and Triton versions (``environment.json``);
2. runs the Triton kernels' tests (tests/test_triton.py) natively, in float16 and bfloat16
   (``triton-tests.json``, ``triton-tests.xml``);
3. runs ``python -m attn_course bench`` in pieces — notebook 09's configurations first — each in its
   own process with a time limit (:data:`PIECE_TIMEOUT_S`), and stops starting pieces when the
   total budget (:data:`TOTAL_BUDGET_S`) would be passed;
4. merges the pieces into ``docs/results/<gpu-name>/attention-bench.{json,csv}`` and one figure per
   dtype and mode, every row stamped (GPU model, driver, CUDA, torch, Triton, dtype, shapes). No
   number is ever written by hand.

``--dry-run`` runs the same path on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``, set
by the script) on tiny shapes, writing to a temporary folder (never docs/results/); CI runs it so that
the script cannot rot. ``--out DIR`` overrides the output folder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIECE_TIMEOUT_S = 180  # each piece: ≤ 3 minutes on an H100 (a piece that takes longer is cut and reported)
TOTAL_BUDGET_S = 450  # all pieces: under 8 minutes; a piece is not started when it could pass this
TESTS_TIMEOUT_S = 300

# Notebook 09's configurations: its GPU cell first (n = 4096, d_k 64 and 128, float16, B·n = 8192,
# A·d_k = 1024), then its "full sweep" (n = 512 … 16384, float16 and bfloat16, forward and
# forward + backward), split so that each piece is small; torch.compile last (it compiles per point).
GPU_PIECES: list[tuple[str, list[str]]] = [
    ("nb09-gpu-cell", ["--n", "4096", "--head-dims", "64", "128", "--dtypes", "float16", "--causal", "both",
                       "--modes", "fwd", "--impls", "naive", "sdpa-math", "sdpa-flash", "sdpa-efficient",
                       "sdpa-cudnn", "triton", "--tokens", "8192", "--hidden", "1024", "--min-run-time", "0.1"]),
    ("fwd-float16", ["--n", "512", "1024", "2048", "4096", "8192", "16384", "--head-dims", "64", "128",
                     "--dtypes", "float16", "--modes", "fwd", "--impls", "naive", "sdpa-flash", "sdpa-efficient",
                     "sdpa-cudnn", "triton"]),
    ("fwd+bwd-float16", ["--n", "512", "1024", "2048", "4096", "8192", "16384", "--head-dims", "64", "128",
                         "--dtypes", "float16", "--modes", "fwd+bwd", "--impls", "naive", "sdpa-flash",
                         "sdpa-efficient", "sdpa-cudnn", "triton"]),
    ("bfloat16", ["--n", "1024", "4096", "16384", "--head-dims", "64", "128", "--dtypes", "bfloat16",
                  "--modes", "fwd", "fwd+bwd", "--impls", "sdpa-flash", "sdpa-cudnn", "triton"]),
    ("tiled-and-compile", ["--n", "1024", "4096", "--head-dims", "64", "--dtypes", "float16", "--causal", "no",
                           "--modes", "fwd", "fwd+bwd", "--impls", "tiled", "compile"]),
]
# The dry run: the same pieces' path on tiny CPU shapes (float32, the interpreter for triton).
DRY_PIECES: list[tuple[str, list[str]]] = [
    ("nb09-gpu-cell", ["--n", "40", "--head-dims", "16", "--dtypes", "float32", "--causal", "both",
                       "--modes", "fwd", "fwd+bwd", "--impls", "naive", "sdpa-flash", "triton",
                       "--tokens", "40", "--hidden", "16", "--min-run-time", "0.002", "--max-run-time", "0.02",
                       "--roofline-size", "128", "--threads", "1"]),
    ("tiled", ["--n", "32", "--head-dims", "16", "--dtypes", "float32", "--causal", "no", "--modes", "fwd",
               "--impls", "tiled", "--tokens", "32", "--hidden", "16", "--tiled-block", "16",
               "--min-run-time", "0.002", "--max-run-time", "0.02", "--roofline-size", "128", "--threads", "1"]),
]


def slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' → 'nvidia-h100-80gb-hbm3': the folder name under docs/results/."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-gpu"


def environment(dry_run: bool) -> dict:
    """Device, driver, CUDA, torch, Triton and Python versions (what gets printed and stamped)."""
    import torch

    from attn_course import timing

    device = "cpu" if dry_run else "cuda"
    info = timing.stamp(device)
    driver = None
    if not dry_run:
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            driver = None
    info["driver"] = driver
    info["gpu_name"] = torch.cuda.get_device_name(0) if not dry_run else "cpu-dry-run"
    info["dry_run"] = dry_run
    return info


def run_tests(out: Path, env: dict) -> dict:
    """tests/test_triton.py, natively on the GPU (float16 and bfloat16) or in the interpreter (dry run)."""
    xml = out / "triton-tests.xml"
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:randomly", "-p", "no:cacheprovider", "-q",
           "tests/test_triton.py", f"--junitxml={xml}", "-o", "addopts="]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TESTS_TIMEOUT_S)
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:]
        code = done.returncode
    except subprocess.TimeoutExpired:
        tail, code = [f"timed out after {TESTS_TIMEOUT_S} s"], None
    summary = {"exit_code": code, "last_line": tail[0] if tail else "", "wall_s": round(time.perf_counter() - started, 1),
               "passed": 0, "failed": 0, "skipped": 0, "tests": []}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            kind = ("failed" if case.find("failure") is not None or case.find("error") is not None else
                    "skipped" if case.find("skipped") is not None else "passed")
            summary[kind] += 1
            summary["tests"].append({"name": case.get("name"), "outcome": kind, "seconds": float(case.get("time", 0))})
    summary["dtypes"] = sorted({d for t in summary["tests"] if t["outcome"] == "passed"
                                for d in ("float16", "bfloat16", "float32") if d in (t["name"] or "")})
    return summary


def run_pieces(pieces, out: Path, env: dict, device: str) -> list[dict]:
    """Each piece as `python -m attn_course bench` in its own process, with a time limit each and overall."""
    log = []
    started = time.perf_counter()
    for name, args in pieces:
        spent = time.perf_counter() - started
        if spent + PIECE_TIMEOUT_S > TOTAL_BUDGET_S and log:
            log.append({"piece": name, "status": "not started", "reason": f"total budget {TOTAL_BUDGET_S} s"})
            print(f"[gpu_finale] {name}: not started (the total budget of {TOTAL_BUDGET_S} s could be passed)")
            continue
        folder = out / "pieces" / name
        cmd = [sys.executable, "-m", "attn_course", "bench", "--device", device, *args, "--out", str(folder),
               "--no-progress", "--no-plot"]
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=PIECE_TIMEOUT_S)
            status = {0: "ok", 1: "a WRONG result"}.get(done.returncode, f"exit code {done.returncode}")
            (out / "pieces").mkdir(parents=True, exist_ok=True)
            (out / "pieces" / f"{name}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
        except subprocess.TimeoutExpired:
            status = f"cut at {PIECE_TIMEOUT_S} s"
        wall = round(time.perf_counter() - t0, 1)
        print(f"[gpu_finale] {name}: {status} in {wall} s")
        log.append({"piece": name, "status": status, "wall_s": wall, "args": args})
    return log


def merge(out: Path, env_info: dict, pieces_log: list[dict], tests: dict) -> list[Path]:
    """One attention-bench.json/.csv (and figures) from the pieces, every row from a piece's own file."""
    from attn_course import benchmark
    from attn_course.tools.bench import write_results

    rows, stamp = [], None
    for entry in pieces_log:
        path = out / "pieces" / entry["piece"] / "attention-bench.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        for r in data["results"]:
            r["note"] = (r.get("note") or "") + ("; " if r.get("note") else "") + f"piece {entry['piece']}"
            rows.append(benchmark.Result(**r))
        stamp = stamp or data["stamp"]
        entry["stamp_options"] = data["stamp"].get("options")
    stamp = dict(stamp or {})
    stamp.update(driver=env_info.get("driver"), pieces=pieces_log, dtypes=sorted({r.dtype for r in rows}),
                 shapes={"pieces": {e["piece"]: e.get("stamp_options") for e in pieces_log}},
                 triton_tests={k: tests[k] for k in ("passed", "failed", "skipped", "dtypes")})
    return write_results(rows, stamp, out) if rows else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/gpu_finale.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="the same path on the CPU with Triton's interpreter and tiny shapes (under a minute); "
                             "writes to a temporary folder")
    parser.add_argument("--out", help="output folder (default: docs/results/<gpu-name>, or a temporary folder "
                                      "with --dry-run)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    env = dict(os.environ)
    if args.dry_run:
        env["TRITON_INTERPRET"] = "1"
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports Triton in this process
    else:
        import torch

        if not torch.cuda.is_available():
            print("No CUDA GPU here. `--dry-run` runs the same steps on the CPU (Triton's interpreter, tiny shapes).")
            return 2
    info = environment(args.dry_run)
    if args.out:
        out = Path(args.out)
    elif args.dry_run:
        out = Path(tempfile.mkdtemp(prefix="gpu-finale-dry-run-")) / "cpu-dry-run"
    else:
        out = ROOT / "docs" / "results" / slug(info["gpu_name"])
    if out.resolve().is_relative_to((ROOT / "docs" / "results").resolve()) and args.dry_run:
        print("a dry run never writes to docs/results/: pass another --out")
        return 2
    out.mkdir(parents=True, exist_ok=True)
    print(f"[gpu_finale] {info['gpu_name']} · driver {info['driver']} · CUDA {info.get('cuda')} · torch {info['torch']} "
          f"· triton {info['triton']} · Python {info['python']}")
    (out / "environment.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")

    tests = run_tests(out, env)
    (out / "triton-tests.json").write_text(json.dumps(tests, indent=1) + "\n", encoding="utf-8")
    print(f"[gpu_finale] Triton tests: {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped "
          f"in {tests['wall_s']} s ({', '.join(tests['dtypes']) or 'no dtype passed'})")

    pieces = run_pieces(DRY_PIECES if args.dry_run else GPU_PIECES, out, env, "cpu" if args.dry_run else "cuda")
    written = merge(out, info, pieces, tests)
    if not args.dry_run:
        shutil.rmtree(out / "pieces", ignore_errors=True)  # merged: the pieces' own files are not kept
    wall = round(time.perf_counter() - started, 1)
    print(f"[gpu_finale] wrote {', '.join(p.name for p in written)} and triton-tests.json, environment.json to {out} "
          f"in {wall} s")
    ok = tests["failed"] == 0 and tests["passed"] > 0 and all(p["status"] == "ok" for p in pieces) and written
    if not args.dry_run:
        print("Next: commit docs/results/ and open a pull request (docs/gpu-results.md).")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
