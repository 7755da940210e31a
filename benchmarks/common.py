"""Shared helpers for lshdist's benchmarks (see /work/shared/BENCHMARKS.md).

Import this module FIRST in every benchmark script, before numpy, faiss, hnswlib or lshdist:
it pins the thread count of every BLAS / OpenMP / numba pool through environment variables,
which only take effect if they are set before those libraries load.

Environment
-----------
BENCH_THREADS     thread count (default 2, the calibration machines' core count)
LSHDIST_DATA_DIR  data directory (read by lshdist.datasets; default ../shared/datasets
                  beside the checkout, i.e. /work/shared/datasets)
BENCH_NUMBA_CACHE "fresh" (default): numba's on-disk cache goes to a new temporary directory,
                  so the first call of every kernel pays the real compile, which is then
                  reported apart; "keep": numba's default cache location.
"""

from __future__ import annotations

import os
import sys
import tempfile

N_THREADS = int(os.environ.get("BENCH_THREADS", "2"))
# Worker processes that a benchmark spawns (Dask's LocalCluster, multiprocessing "spawn")
# re-import the script, and with it this module.  There the environment the spawner gave must
# stand: the thread counts it chose for the workers' BLAS / OpenMP / numba pools (Dask's own
# 1-thread defaults yield to variables already set in the parent, so a benchmark sets the
# workers' values itself around the spawn; see bench_distributed.worker_environment) and its
# numba cache (shared, not a new empty one per worker, removed at the worker's exit).  Only the
# benchmark process itself pins threads and picks the cache.
_BENCH_PID_VAR = "LSHDIST_BENCH_PID"
IN_SPAWNED_CHILD = os.environ.get(_BENCH_PID_VAR, str(os.getpid())) != str(os.getpid())
if not IN_SPAWNED_CHILD:
    os.environ[_BENCH_PID_VAR] = str(os.getpid())
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                 "NUMBA_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ[_var] = str(N_THREADS)
    # faiss-cpu 1.15.1's bundled OpenBLAS 0.3.15 does not know this machine's CPU (Xeon with
    # AVX-512) and falls back to its "Prescott" (SSE3) kernels: FAISS's sgemm ran 5-7x slower
    # (IndexFlatL2 on Fashion-MNIST 27-75 s instead of ~6 s).  Name the core type its newest
    # kernels support; numpy's own OpenBLAS detects "SkylakeX" itself, so lshdist is unchanged.
    if "OPENBLAS_CORETYPE" not in os.environ:
        try:
            with open("/proc/cpuinfo") as _f:
                _flags = next((ln for ln in _f if ln.startswith("flags")), "").split()
        except OSError:
            _flags = []
        if "avx512f" in _flags:
            os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
        elif "avx2" in _flags:
            os.environ["OPENBLAS_CORETYPE"] = "Haswell"
    if os.environ.get("BENCH_NUMBA_CACHE", "fresh") == "fresh":
        # a cold cache outside the source tree: compile time is measured for real, and nothing
        # is written under lshdist/
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="lshdist-bench-numba-")
        import atexit
        import shutil
        atexit.register(shutil.rmtree, os.environ["NUMBA_CACHE_DIR"], ignore_errors=True)

if "numpy" in sys.modules and not IN_SPAWNED_CHILD:  # pragma: no cover - misuse guard
    print("warning: numpy was imported before benchmarks/common.py; thread pinning may not hold",
          file=sys.stderr)

import datetime as _dt  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
LOADAVG_AT_START = os.getloadavg() if hasattr(os, "getloadavg") else None
RESULTS_DIR = BENCH_DIR / "results"


# --------------------------------------------------------------------------- threads

def pin_threads(n: int = N_THREADS) -> dict:
    """Pin the peers' thread pools (FAISS, numba) to ``n``; return what was set.

    hnswlib takes its thread count per index: call ``index.set_num_threads(n)`` (see
    `hnsw_pin`).
    """
    done = {"env": n}
    try:
        import faiss
        faiss.omp_set_num_threads(n)
        done["faiss"] = faiss.omp_get_max_threads()
    except ImportError:
        pass
    try:
        import numba
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        done["numba"] = numba.get_num_threads()
    except ImportError:
        pass
    return done


def hnsw_pin(index, n: int = N_THREADS):
    index.set_num_threads(n)
    return index


# --------------------------------------------------------------------------- data
# The datasets come from `lshdist.datasets` (the readers ``lshdist ingest`` uses; they honour
# LSHDIST_DATA_DIR): call ``lshdist.datasets.load_letter()`` / ``load_fashion_mnist()`` directly.
# Each returns a `Split` (X_train, y_train, X_test, y_test, classes) that unpacks as the 4-tuple;
# features float32 C-contiguous, labels int32 codes into ``classes``.

def data_dir() -> Path:
    """The data directory in use (``lshdist.datasets.data_dir``: LSHDIST_DATA_DIR, else
    ``../shared/datasets`` beside the checkout)."""
    from lshdist.datasets import data_dir as _lshdist_data_dir
    return _lshdist_data_dir()


# --------------------------------------------------------------------------- timing

def timed(fn, repeats: int = 3, warmup: int = 1):
    """``(median_seconds, last_result)`` of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def hnsw_sweep(hnswlib, Xdb, Xq, true_ids, *, k: int, threads: int, m: int, ef_construction: int,
               efs, flat_seconds: float, repeats: int = 3, warmup: int = 1):
    """hnswlib: build once (timed), query at every ef (timed), recall@k against ``true_ids``.

    Returns ``(build median s, build runs dict, rows)``; one row per ef with recall@10, build /
    query / total seconds, queries/s and FAISS flat time / total.
    """
    from lshdist.evaluation import recall_at_k

    def build():
        ix = hnswlib.Index(space="l2", dim=Xdb.shape[1])
        ix.init_index(max_elements=len(Xdb), M=m, ef_construction=ef_construction, random_seed=100)
        hnsw_pin(ix, threads)
        ix.add_items(Xdb, np.arange(len(Xdb)), num_threads=threads)
        return ix

    t_build, index, runs = timed_all(build, repeats, warmup)
    print(f"hnswlib build (M={m}, efC={ef_construction}): median {t_build:.2f} s {runs['runs']}",
          flush=True)
    rows = []
    for ef in efs:
        index.set_ef(ef)
        t_q, (ids, _), _ = timed_all(lambda: index.knn_query(Xq, k=k, num_threads=threads),
                                     repeats, warmup)
        rec = recall_at_k(ids.astype(np.int64), true_ids, k)
        rows.append({"ef": ef, "recall@10": rec, "build s": t_build, "query s": t_q,
                     "total s": t_build + t_q, "queries/s": len(Xq) / t_q,
                     "flat / total": flat_seconds / (t_build + t_q)})
        print(f"hnswlib ef={ef}: recall@10 {rec:.4f}, query {t_q:.3f} s", flush=True)
    return t_build, runs, rows


def timed_all(fn, repeats: int = 3, warmup: int = 1):
    """Like `timed`, but also returns the warm-up times and every timed run:
    ``(median, last_result, {"warmup": [...], "runs": [...]})``."""
    warm, times, out = [], [], None
    for _ in range(warmup):
        t0 = time.perf_counter()
        out = fn()
        warm.append(time.perf_counter() - t0)
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out, {"warmup": warm, "runs": times}


def once(fn):
    """``(seconds, result)`` of a single call."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


#: rows per inverted list an IVFFlat peer is trained on
IVF_TRAIN_PER_LIST = 40


def ivf_flat(faiss, Xdb: np.ndarray, nlist: int, train_order: np.ndarray,
             per_list: int = IVF_TRAIN_PER_LIST):
    """FAISS ``IVFFlat`` of ``nlist`` lists trained on the rows ``train_order[:per_list *
    nlist]`` (a fixed random order, taken sorted), every row of ``Xdb`` added."""
    ix = faiss.IndexIVFFlat(faiss.IndexFlatL2(Xdb.shape[1]), Xdb.shape[1], nlist)
    ix.train(Xdb[np.sort(train_order[:min(len(Xdb), per_list * nlist)])])
    ix.add(Xdb)
    return ix


# --------------------------------------------------------------------------- quality
# recall@k: use `lshdist.evaluation.recall_at_k(found, truth, k)` (-1 padding never matches).

def faiss_flat(faiss, Xdb: np.ndarray, Xq: np.ndarray, k: int):
    """FAISS ``IndexFlatL2``: ``(build s, query s, ids (Q, k))`` — the exact peer and the ground
    truth of the k-NN benchmarks."""
    t0 = time.perf_counter()
    ix = faiss.IndexFlatL2(Xdb.shape[1])
    ix.add(Xdb)
    tb = time.perf_counter() - t0
    _, ids = ix.search(Xq, k)
    return tb, time.perf_counter() - t0 - tb, ids


def exact_knn_l2(Xdb: np.ndarray, Xq: np.ndarray, k: int, chunk: int = 2048):
    """Exact L2 k-NN by brute force in float64: ``(sq_dists, ids)``, ascending, (Q, k)."""
    Xdb = np.asarray(Xdb, np.float64)
    nd = np.einsum("ij,ij->i", Xdb, Xdb)
    D_out, I_out = [], []
    for s in range(0, len(Xq), chunk):
        q = np.asarray(Xq[s:s + chunk], np.float64)
        D = nd[None, :] - 2 * q @ Xdb.T + np.einsum("ij,ij->i", q, q)[:, None]
        I = np.argpartition(D, k - 1, axis=1)[:, :k]
        Dk = np.take_along_axis(D, I, 1)
        o = np.argsort(Dk, axis=1, kind="stable")
        I_out.append(np.take_along_axis(I, o, 1))
        D_out.append(np.maximum(np.take_along_axis(Dk, o, 1), 0.0))
    return np.concatenate(D_out), np.concatenate(I_out)


def knn_accuracy(Ztr, ytr, Zte, yte, ks=(1, 4), n_classes: int | None = None) -> dict:
    """k-NN accuracy on transformed vectors with exact L2 neighbours, for each k.

    The vote is `lshdist.metric.knn.knn_predict` (majority, a tie to the tied class of the
    nearest neighbour); labels must be codes 0..n_classes-1 (default: max label + 1).
    """
    from lshdist.metric.knn import knn_predict

    ytr, yte = np.asarray(ytr), np.asarray(yte)
    if n_classes is None:
        n_classes = int(max(ytr.max(), yte.max())) + 1
    kmax = max(ks)
    _, I = exact_knn_l2(Ztr, Zte, kmax)
    lab = ytr[I]
    return {k: float(np.mean(knn_predict(lab, k, n_classes) == yte)) for k in ks}


# --------------------------------------------------------------------------- reporting

def machine_info() -> dict:
    info = {
        "cpus_logical": os.cpu_count(),
        "cpus_available":
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def versions(*modules: str) -> dict:
    out = {}
    for name in ("lshdist", "numpy", "numba", *modules):
        try:
            mod = __import__(name)
        except ImportError:
            out[name] = None
            continue
        v = getattr(mod, "__version__", None)
        if v is None:
            import importlib.metadata as md
            dist = {"faiss": "faiss-cpu", "sklearn": "scikit-learn",
                    "metric_learn": "metric-learn"}.get(name, name)
            try:
                v = md.version(dist)
            except md.PackageNotFoundError:
                v = "?"
        out[name] = v
    return out


def md_table(rows: list[dict], columns: list[str] | None = None) -> str:
    if not rows:
        return "_(no rows)_\n"
    cols = columns or list(dict.fromkeys(c for r in rows for c in r))

    def fmt(v):
        if v is None:
            return "–"
        if isinstance(v, float):
            if v != v:
                return "nan"
            a = abs(v)
            if a == 0:
                return "0"
            if a >= 100:
                return f"{v:,.1f}"
            if a >= 1:
                return f"{v:.2f}" if a < 10 else f"{v:.1f}"
            return f"{v:.3f}" if a >= 1e-3 else f"{v:.2e}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _jsonable(o):
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, float) and (o != o or o in (float("inf"), float("-inf"))):
        return str(o)
    return o


def git_state() -> dict:
    """Commit of the lshdist checkout and whether lshdist/ had uncommitted edits at start-up."""
    import subprocess
    root = BENCH_DIR.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "lshdist"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return {"commit": head or None, "lshdist_dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "lshdist_dirty": None}


GIT_AT_START = git_state()  # taken at import, i.e. when the lshdist code in use was loaded


def _exe() -> str:
    rel = os.path.relpath(sys.executable, os.getcwd())
    return rel if not rel.startswith("..") else sys.executable


def _fmt_load(la) -> str:
    return "n/a" if la is None else "/".join(f"{v:.1f}" for v in la)


def bounds_from_sample(X: np.ndarray, n: int = 200, seed: int = 1) -> tuple[float, float]:
    """u, l = 5th / 95th percentile of the nonzero squared L2 distances among n random rows."""
    rng = np.random.default_rng(seed)
    Z = X[rng.choice(len(X), n, replace=False)].astype(np.float64)
    D = ((Z[:, None, :] - Z[None, :, :]) ** 2).sum(-1)[np.triu_indices(n, 1)]
    u, l = np.percentile(D[D > 0], [5, 95])
    return float(u), float(l)


def write_results(name: str, tables: dict[str, list[dict]], *, title: str,
                  notes: list[str] | None = None, extra: dict | None = None,
                  peer_modules: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """Write ``benchmarks/results/<name>.json`` and ``.md``; return both paths."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [_exe(), *sys.argv]),
        "cwd": os.getcwd(),
        "threads": N_THREADS,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "numba_cache": os.environ.get("NUMBA_CACHE_DIR", "default"),
        "machine": machine_info(),
        "loadavg_start": LOADAVG_AT_START,
        "git_at_start": GIT_AT_START,
        "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "versions": versions(*peer_modules),
        "data_dir": str(data_dir()),
    }
    payload = {"name": name, "title": title, "meta": meta, "tables": tables,
               "notes": notes or [], "extra": extra or {}}
    jpath = RESULTS_DIR / f"{name}.json"
    jpath.write_text(json.dumps(_jsonable(payload), indent=2) + "\n")
    mpath = RESULTS_DIR / f"{name}.md"
    mpath.write_text(render_md(payload))
    return jpath, mpath


def render_md(payload: dict) -> str:
    """The markdown report of a results payload (as written to / read from the JSON)."""
    meta, title, tables, notes = (payload["meta"], payload["title"], payload["tables"],
                                  payload["notes"])
    m = meta["machine"]
    md = [f"# {title}", "",
          f"- date: {meta['date']}",
          f"- machine: {m.get('cpus_logical')} logical CPUs ({m.get('cpus_available')} available), "
          f"{m.get('ram_gib')} GiB RAM, {m.get('cpu_model', '?')}",
          f"- threads pinned: {meta['threads']}; OPENBLAS_CORETYPE="
          f"{meta.get('openblas_coretype')} (FAISS's bundled OpenBLAS misdetects this CPU)",
          f"- load average (1, 5, 15 min) at start {_fmt_load(meta['loadavg_start'])}, "
          f"at end {_fmt_load(meta['loadavg_end'])} (other processes share these cores)",
          f"- lshdist checkout at start: commit {meta['git_at_start']['commit']}"
          + (" + uncommitted edits under lshdist/" if meta['git_at_start']['lshdist_dirty'] else "")
          + " (another engineer edits lshdist concurrently)",
          "- versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
          f"- command: `cd {meta['cwd']} && {meta['command']}`",
          f"- data: {meta['data_dir']}", ""]
    for tname, rows in tables.items():
        md += [f"## {tname}", "", md_table(rows)]
    if notes:
        md += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(md)


if __name__ == "__main__":  # re-render the markdown of stored results: common.py results/x.json
    for arg in sys.argv[1:]:
        p = Path(arg)
        p.with_suffix(".md").write_text(render_md(json.loads(p.read_text())))
        print(f"rendered {p.with_suffix('.md')}")


# --------------------------------------------------------------------------- paired runs

def loadavg() -> list[float] | None:
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


def paired_rounds(systems: dict, ref: str, rounds: int = 3, warmup: int = 1,
                  log=print) -> dict:
    """Run every system once per round, alternating the order (even rounds as given, odd rounds
    reversed) so that load from other processes hits all alike; ``warmup`` rounds first
    (recorded, not counted).

    ``systems``: name -> callable returning a dict with at least ``"total s"`` (and any of
    ``"build s"``, ``"query s"``, ``"recall@10"``, ...).  Returns ``{"warmup": [...], "runs":
    [...]}``: per round, name -> that dict plus ``"load"`` (1-min load average after it).
    """
    names = list(systems)
    out: dict = {"warmup": [], "runs": []}
    for r in range(warmup + rounds):
        order = names if r % 2 == 0 else names[::-1]
        rec = {}
        for name in order:
            res = dict(systems[name]())
            res["load"] = loadavg()[0] if loadavg() else None
            rec[name] = res
            log(f"  round {r - warmup + 1 if r >= warmup else 'warm-up'}: {name}: "
                f"total {res['total s']:.2f} s" + (f", recall@10 {res['recall@10']:.4f}"
                                                   if "recall@10" in res else "")
                + f" (load {res['load']})", flush=True)
        (out["warmup"] if r < warmup else out["runs"]).append(rec)
    return out


def paired_summary(runs: list[dict], ref: str, keys=("build s", "query s", "total s")) -> dict:
    """Per system: median of each of ``keys`` and of recall; ratio ``total(peer) /
    total(ref)`` per round with its median, min and max."""
    out = {}
    for name in runs[0]:
        vals = {k: [r[name][k] for r in runs if r[name].get(k) is not None] for k in keys}
        ratios = [r[name]["total s"] / r[ref]["total s"] for r in runs]
        row = {k: (statistics.median(v) if v else None) for k, v in vals.items()}
        rec = [r[name]["recall@10"] for r in runs if "recall@10" in r[name]]
        row["recall@10"] = statistics.median(rec) if rec else None
        row["ratio median"] = statistics.median(ratios)
        row["ratio min"] = min(ratios)
        row["ratio max"] = max(ratios)
        row["runs total s"] = [round(r[name]["total s"], 3) for r in runs]
        out[name] = row
    return out


def fmt_ratio(row: dict) -> str:
    return f"{row['ratio median']:.2f} [{row['ratio min']:.2f}–{row['ratio max']:.2f}]"
