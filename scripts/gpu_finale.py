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
   number is ever written by hand;
5. after notebook 09's piece, measures the course's kernels with a few other block sizes, warps and
   stages against the best fused PyTorch backend (``triton-tuning.json``): where the kernels stand,
   and what another choice of tiles would give.

``--dry-run`` runs the same path on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``, set
by the script) on tiny shapes, writing to a temporary folder (never docs/results/); CI runs it so that
the script cannot rot. ``--out DIR`` overrides the output folder.
"""

from __future__ import annotations

import argparse
import importlib.util
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
TUNE_TIMEOUT_S = 150  # the tuning step (a process of its own)

# The tuning step: forward (BLOCK_M, BLOCK_N, num_warps, num_stages) and backward ({kernel: (BLOCK_M,
# BLOCK_N)}, num_warps, num_stages), the kernels' own choice first; float16, B·n = 16384 tokens,
# A·d_head = 1024, non-causal and causal.
FORWARD_CONFIGS = [None, (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3),
                   (128, 32, 4, 3), (64, 128, 4, 3), (128, 64, 4, 4)]
BACKWARD_CONFIGS = [None, ({"dk_dv": (64, 64), "dq": (64, 64)}, 4, 2), ({"dk_dv": (64, 128), "dq": (128, 64)}, 8, 2),
                    ({"dk_dv": (32, 128), "dq": (128, 32)}, 4, 3), ({"dk_dv": (64, 128), "dq": (128, 64)}, 8, 3)]
TUNE_SHAPES = [(4096, 64), (4096, 128), (16384, 64), (16384, 128)]  # (n, d_head)
CHECK_N, CHECK_TOL = 512, 2e-2  # each configuration's check: n, and its largest error relative to max |reference|
DRY_TUNE = {"forward": [None, (16, 16, 1, 1), (32, 16, 1, 1)],
            "backward": [None, ({"dk_dv": (16, 32), "dq": (32, 16)}, 1, 1)],
            "shapes": [(48, 16)], "tokens": 48, "hidden": 32}

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


def run_pieces(pieces, out: Path, env: dict, device: str, *, budget_s: float = TOTAL_BUDGET_S,
               piece_timeout_s: float = PIECE_TIMEOUT_S, started: float | None = None) -> list[dict]:
    """Each piece as `python -m attn_course bench` in its own process, with a time limit each and overall
    (the overall one counted from ``started``)."""
    log = []
    started = time.perf_counter() if started is None else started
    for name, args in pieces:
        spent = time.perf_counter() - started
        if spent + piece_timeout_s > budget_s and log:
            log.append({"piece": name, "status": "not started", "reason": f"total budget {budget_s:g} s"})
            print(f"[gpu_finale] {name}: not started (the total budget of {budget_s:g} s could be passed)")
            continue
        folder = out / "pieces" / name
        cmd = [sys.executable, "-m", "attn_course", "bench", "--device", device, *args, "--out", str(folder),
               "--no-progress", "--no-plot"]
        t0 = time.perf_counter()
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=piece_timeout_s)
            status = {0: "ok", 1: "a WRONG result"}.get(done.returncode, f"exit code {done.returncode}")
            (out / "pieces").mkdir(parents=True, exist_ok=True)
            (out / "pieces" / f"{name}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
        except subprocess.TimeoutExpired:
            status = f"cut at {piece_timeout_s:g} s"
        wall = round(time.perf_counter() - t0, 1)
        print(f"[gpu_finale] {name}: {status} in {wall} s")
        log.append({"piece": name, "status": status, "wall_s": wall, "args": args})
    return log


def _ms(fn, cuda: bool) -> float:
    """Median milliseconds of ``fn()``: ``triton.testing.do_bench`` on a GPU, the best of three calls otherwise."""
    if cuda:
        import triton

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return min(times)


def tune(dry_run: bool, path: Path) -> dict:
    """The course's Triton kernels with other tiles, warps and stages, and the best fused PyTorch backend,
    on the same inputs: forward TFLOP/s, and backward TFLOP/s (2.5 × the forward's FLOPs, as FlashAttention-2
    counts; causal halves both). The backends' backward time is their forward + backward minus their forward.
    ``path`` (``triton-tuning.json``) is rewritten after every shape, so a step cut short keeps what it measured."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attn_course import triton_attention

    cuda = not dry_run
    device, dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.float32)
    forward_configs = DRY_TUNE["forward"] if dry_run else FORWARD_CONFIGS
    backward_configs = DRY_TUNE["backward"] if dry_run else BACKWARD_CONFIGS
    shapes = DRY_TUNE["shapes"] if dry_run else TUNE_SHAPES
    tokens, hidden = (DRY_TUNE["tokens"], DRY_TUNE["hidden"]) if dry_run else (16384, 1024)
    backends = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
                "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}
    rows = []
    result = {"device": device, "dtype": str(dtype).replace("torch.", ""),
              "timing": "triton.testing.do_bench, median" if cuda else "best of three calls (dry run)", "rows": rows}
    for n, d in shapes:
        for causal in (False, True):
            b, a = max(1, tokens // n), max(1, hidden // d)  # (B, A): B·n tokens, A·d_head = hidden
            g = torch.Generator().manual_seed(0)
            q, k, v, dout = (torch.randn(b, a, n, d, generator=g).to(device=device, dtype=dtype) for _ in range(4))
            fwd_flops = 4 * b * a * n * n * d / (2 if causal else 1)
            # Each configuration is first checked on a small input against float64 (a wrong kernel is not timed).
            small = [t[:1, :4, :min(n, CHECK_N)].contiguous() for t in (q, k, v, dout)]
            leaves64 = [t.double().requires_grad_(True) for t in small[:3]]
            o64 = F.scaled_dot_product_attention(*leaves64, is_causal=causal)
            want = (o64.detach(), *torch.autograd.grad(o64, leaves64, small[3].double()))

            def rel_error(got, want=want):
                return max((g.double() - w).abs().max().item() / w.abs().max().item() for g, w in zip(got, want))

            row = {"n": n, "d_head": d, "B": b, "A": a, "dtype": str(dtype).replace("torch.", ""), "causal": causal,
                   "forward_flops": fwd_flops, "backward_flops": 2.5 * fwd_flops, "backends": {}, "forward": [],
                   "backward": []}
            for name, backend in backends.items():
                leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]

                def fwd(leaves=leaves, backend=backend):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(*leaves, is_causal=causal)

                def fwd_bwd(leaves=leaves, fwd=fwd):
                    return torch.autograd.grad(fwd(), leaves, dout)

                try:
                    f_ms = _ms(lambda fwd=fwd: fwd(), cuda)
                    fb_ms = _ms(fwd_bwd, cuda)
                    row["backends"][name] = {"forward_ms": f_ms, "backward_ms": max(fb_ms - f_ms, 1e-9),
                                             "forward_tflops": fwd_flops / f_ms / 1e9,
                                             "backward_tflops": 2.5 * fwd_flops / max(fb_ms - f_ms, 1e-9) / 1e9}
                except Exception as exc:  # noqa: BLE001 - a backend this GPU or dtype lacks: say so
                    row["backends"][name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            for config in forward_configs:
                entry = {"config": "the kernel's own choice" if config is None else
                         dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), config))}
                kwargs = {} if config is None else dict(zip(("block_m", "block_n", "num_warps", "num_stages"), config))
                try:
                    error = rel_error(triton_attention.forward(*small[:3], causal=causal, **kwargs)[:1])
                    entry.update(max_rel_error=error, correct=error < CHECK_TOL)
                    if entry["correct"]:
                        ms = _ms(lambda kwargs=kwargs: triton_attention.forward(q, k, v, causal=causal, **kwargs), cuda)
                        entry.update(ms=ms, tflops=fwd_flops / ms / 1e9)
                except Exception as exc:  # noqa: BLE001 - out of shared memory or registers: recorded
                    entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                row["forward"].append(entry)
            o, lse = triton_attention.forward(q, k, v, causal=causal)
            o_small, lse_small = triton_attention.forward(*small[:3], causal=causal)
            for config in backward_configs:
                entry = {"config": "the kernel's own choice" if config is None else
                         {"blocks": config[0], "num_warps": config[1], "num_stages": config[2]}}
                kwargs = {} if config is None else {"blocks": config[0], "num_warps": config[1],
                                                    "num_stages": config[2]}
                try:
                    grads = triton_attention.backward(*small[:3], o_small, lse_small, small[3], causal=causal, **kwargs)
                    error = rel_error((o_small, *grads))
                    entry.update(max_rel_error=error, correct=error < CHECK_TOL)
                    if entry["correct"]:
                        ms = _ms(lambda kwargs=kwargs: triton_attention.backward(q, k, v, o, lse, dout, causal=causal,
                                                                                 **kwargs), cuda)
                        entry.update(ms=ms, tflops=2.5 * fwd_flops / ms / 1e9)
                except Exception as exc:  # noqa: BLE001
                    entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                row["backward"].append(entry)
            for part in ("forward", "backward"):
                measured = [b[f"{part}_tflops"] for b in row["backends"].values() if f"{part}_tflops" in b]
                best = max(measured, default=None)
                row[f"best_backend_{part}_tflops"] = best
                for entry in row[part]:
                    if best and "tflops" in entry:
                        entry["share_of_best_backend"] = entry["tflops"] / best
            rows.append(row)
            path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
            shares = [row[part][0].get("share_of_best_backend") for part in ("forward", "backward")]
            print(f"[gpu_finale] tuning n={n} d={d} causal={causal}: the kernels' own choice at "
                  + ", ".join(f"{'?' if x is None else f'{x:.0%}'} ({part})"
                              for x, part in zip(shares, ("forward", "backward")))
                  + " of the best backend", flush=True)
    return result


def run_tune(out: Path, env: dict, dry_run: bool) -> dict:
    """:func:`tune` in a process of its own, with a time limit; its result in ``triton-tuning.json``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--tune-only", "--out", str(out)]
    cmd += ["--dry-run"] if dry_run else []
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TUNE_TIMEOUT_S)
        status = "ok" if done.returncode == 0 else f"exit code {done.returncode}"
        (out / "tuning.log").write_text(done.stdout + done.stderr, encoding="utf-8")
        print(done.stdout, end="")
    except subprocess.TimeoutExpired:
        status = f"cut at {TUNE_TIMEOUT_S} s"
    wall = round(time.perf_counter() - started, 1)
    print(f"[gpu_finale] tuning: {status} in {wall} s")
    return {"piece": "tuning", "status": status, "wall_s": wall}


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
    parser.add_argument("--budget", type=float, default=TOTAL_BUDGET_S,
                        help="seconds for the benchmark pieces and the tuning step together (default "
                             f"{TOTAL_BUDGET_S}); "
                             "a piece that could pass it is not started, and says so")
    parser.add_argument("--piece-timeout", type=float, default=PIECE_TIMEOUT_S,
                        help=f"seconds at most for one piece (default {PIECE_TIMEOUT_S})")
    parser.add_argument("--keep-logs", action="store_true", help="keep each piece's log next to the results")
    parser.add_argument("--pieces", nargs="+", metavar="NAME",
                        help="run only these benchmark pieces (default: all; 'none' for the tests and tuning alone)")
    parser.add_argument("--no-tuning", action="store_true", help="leave out the tuning step")
    parser.add_argument("--tune-only", action="store_true", help=argparse.SUPPRESS)  # run_tune's own process
    args = parser.parse_args(argv)
    if args.tune_only:
        if args.dry_run:
            os.environ["TRITON_INTERPRET"] = "1"
        Path(args.out).mkdir(parents=True, exist_ok=True)
        tune(args.dry_run, Path(args.out) / "triton-tuning.json")
        return 0
    if importlib.util.find_spec("triton") is None:
        print("Triton is not installed here, and this script tests, times and tunes the course's Triton kernels: "
              "`python -m pip install -e \".[gpu-dev]\"` installs it (about 1 GB; learners never need it).")
        return 2
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

    # Notebook 09's piece first, then the tuning step, then the other pieces, all within one budget.
    all_pieces = DRY_PIECES if args.dry_run else GPU_PIECES
    if args.pieces:
        unknown = set(args.pieces) - {name for name, _ in all_pieces} - {"none"}
        if unknown:
            parser.error(f"no piece named {', '.join(sorted(unknown))}: {', '.join(name for name, _ in all_pieces)}")
        all_pieces = [(name, a) for name, a in all_pieces if name in args.pieces]
    device = "cpu" if args.dry_run else "cuda"
    budget = dict(budget_s=args.budget, piece_timeout_s=args.piece_timeout, started=time.perf_counter())
    pieces = run_pieces(all_pieces[:1], out, env, device, **budget)
    tuning = {"status": "ok"} if args.no_tuning else run_tune(out, env, args.dry_run)
    pieces += run_pieces(all_pieces[1:], out, env, device, **budget)
    written = merge(out, info, pieces, tests)
    if not args.dry_run:
        for folder in (out / "pieces").glob("*/"):  # merged: the pieces' own result files are not kept
            shutil.rmtree(folder, ignore_errors=True)
        if not args.keep_logs:
            shutil.rmtree(out / "pieces", ignore_errors=True)
            (out / "tuning.log").unlink(missing_ok=True)
    wall = round(time.perf_counter() - started, 1)
    print(f"[gpu_finale] wrote {', '.join(p.name for p in written)} and triton-tests.json, triton-tuning.json, "
          f"environment.json to {out} "
          f"in {wall} s")
    ok = (tests["failed"] == 0 and tests["passed"] > 0 and all(p["status"] == "ok" for p in pieces) and written
          and tuning["status"] == "ok")
    if not args.dry_run:
        print("Next: commit docs/results/ and open a pull request (docs/gpu-results.md).")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
