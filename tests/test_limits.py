"""`lshdist.limits.one_blas_thread`: one holder sets and restores the limit; others neither
wait nor touch it."""

import threading

from threadpoolctl import threadpool_info, threadpool_limits

from lshdist.limits import one_blas_thread


def _blas_threads() -> int:
    return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")


def test_nested_and_child_sections_neither_wait_nor_restore_the_limit():
    """A section inside a section (same thread), and one in a thread the holder waits for,
    run at once with BLAS at one thread, and only the outer one restores the limit.  Bug
    caught: a section waiting for the lock its own caller holds (the threaded exact scan inside
    a section deadlocked)."""
    seen: list[int] = []
    done = threading.Event()

    def child() -> None:
        with one_blas_thread():
            seen.append(_blas_threads())

    def outer() -> None:
        with threadpool_limits(2, user_api="blas"):
            with one_blas_thread():
                with one_blas_thread():
                    seen.append(_blas_threads())
                seen.append(_blas_threads())  # the inner one restored nothing
                t = threading.Thread(target=child)
                t.start()
                t.join()
            seen.append(_blas_threads())  # the holder restored the limit
        done.set()

    worker = threading.Thread(target=outer, daemon=True)
    worker.start()
    assert done.wait(60), "a section waited for one its caller holds"
    assert seen == [1, 1, 1, 2]


def test_driver_malloc_applied_unless_the_user_set_it(monkeypatch):
    """`keep_freed_memory` applies `DRIVER_MALLOC` through glibc's mallopt — the mmap threshold
    first, 32 MiB (older glibc's largest) where a larger one is refused, nothing else where
    that is refused too — and changes nothing where the user set any variable of `MALLOC_ENV`;
    the command line calls it before any job.  (A fake C library: this process's malloc is
    left alone; the real one is tried in a child process.)"""
    import ctypes
    import platform
    import subprocess
    import sys

    from lshdist import cli, limits

    for k in limits.MALLOC_ENV:
        monkeypatch.delenv(k, raising=False)
    seen: list[tuple[int, int]] = []
    largest = [2**62]

    class FakeLibc:
        def __init__(self, *_):
            self.mallopt = self

        def __call__(self, param, value):
            seen.append((param, value))
            return int(param != -3 or value <= largest[0])

    monkeypatch.setattr(ctypes, "CDLL", FakeLibc)
    assert limits.keep_freed_memory() is True
    want = dict(limits.DRIVER_MALLOC)
    assert seen[0] == (-3, want.pop("M_MMAP_THRESHOLD"))  # the threshold first
    assert seen[1:] == [(limits._MALLOPT[k], v) for k, v in want.items()]
    assert seen[0][1] >= 63 * 2**20  # a 20,000 x 784 float32 shard stays on the heap
    seen.clear()
    largest[0] = 32 << 20  # glibc before the limit was lifted
    assert limits.keep_freed_memory() is True
    assert seen[:2] == [(-3, limits.DRIVER_MALLOC["M_MMAP_THRESHOLD"]), (-3, 32 << 20)]
    seen.clear()
    largest[0] = 0
    assert limits.keep_freed_memory() is False and seen == [(-3, seen[0][1]), (-3, 32 << 20)]
    seen.clear()
    largest[0] = 2**62
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limits.keep_freed_memory() is False and seen == []
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    called: list[int] = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: called.append(1) or True)
    assert cli.main(["info", "/nonexistent-lshdist-index"]) == 2
    assert called == [1]
    monkeypatch.undo()
    env = {k: v for k, v in __import__("os").environ.items() if k not in limits.MALLOC_ENV}
    got = subprocess.run([sys.executable, "-c", "from lshdist.limits import keep_freed_memory;"
                          "print(keep_freed_memory())"], capture_output=True, text=True,
                         env=env, check=True).stdout.strip()
    assert got == str(platform.libc_ver()[0] == "glibc")


def test_available_memory_reads_meminfo_and_a_cgroup_limit(tmp_path):
    """MemAvailable in bytes, lowered to the tightest limit of the process's cgroups: v2 with
    the process's group below the mount point (a batch job step without a cgroup namespace:
    every level up to the root is read), v1's memory controller; the inactive page cache is
    not counted as used; "max" and v1's huge number mean no limit; nothing readable: None.
    Bugs caught: kB taken as bytes, the limit taken without what is in use, reclaimable cache
    counted as used (a container that has just read its data refused), only the mount
    point's limit read (a job's own limit missed), an unlimited group read as a number."""
    from lshdist.limits import available_memory

    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\n"
                    "MemAvailable:   20000000 kB\n")
    root = tmp_path / "cg"
    job = root / "slurm" / "job_7" / "step_0"
    job.mkdir(parents=True)
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/slurm/job_7/step_0\n")
    full = 20_000_000 * 1024
    assert available_memory(str(info), str(root), str(proc)) == full  # no limit files
    (root / "slurm" / "job_7" / "memory.max").write_text(f"{8 << 30}\n")
    (root / "slurm" / "job_7" / "memory.current").write_text(f"{3 << 30}\n")
    (root / "slurm" / "job_7" / "memory.stat").write_text(
        f"anon 100\nfile {2 << 30}\ninactive_file {1 << 30}\nactive_file 5\n")
    assert available_memory(str(info), str(root), str(proc)) == 6 << 30  # 8 - (3 - 1)
    (job / "memory.max").write_text("max\n")
    (job / "memory.current").write_text("123\n")
    assert available_memory(str(info), str(root), str(proc)) == 6 << 30
    (root / "memory.max").write_text(f"{5 << 30}\n")  # a tighter limit higher up
    (root / "memory.current").write_text(f"{1 << 30}\n")
    assert available_memory(str(info), str(root), str(proc)) == 4 << 30
    assert available_memory(str(tmp_path / "none"), str(root), str(proc)) == 4 << 30
    # cgroup v1: the memory controller's own hierarchy
    v1 = tmp_path / "v1"
    (v1 / "memory" / "docker" / "abc").mkdir(parents=True)
    proc.write_text("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    grp = v1 / "memory" / "docker" / "abc"
    (grp / "memory.limit_in_bytes").write_text(f"{4 << 30}\n")
    (grp / "memory.usage_in_bytes").write_text(f"{3 << 30}\n")
    (grp / "memory.stat").write_text(f"cache 9\ntotal_inactive_file {2 << 30}\n")
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert available_memory(str(info), str(v1), str(proc)) == 3 << 30  # 4 - (3 - 2)
    assert available_memory(str(tmp_path / "none"), str(tmp_path / "none"),
                            str(tmp_path / "none")) is None
    real = available_memory()
    assert real is None or real > 0
