"""The command line's parser is light: `lshdist --help` and `lshdist JOB --help` import no Dask."""

import subprocess
import sys

import pytest

HEAVY = ("dask", "distributed", "numba", "zarr")

PROBE = """
import sys
import lshdist.cli
lshdist.cli.build_parser()
print(" ".join(m for m in {heavy!r} if m in sys.modules))
"""


def test_building_the_parser_imports_no_dask_numba_or_zarr():
    """Every job module imports its heavy dependencies where it runs, not with the module: a
    job that imports, say, `lshdist.cluster.pipeline` at the top puts Dask, numba and Zarr
    (more than a second on this machine) in front of every ``--help``."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY)], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == []


@pytest.mark.parametrize("job", ["ingest", "learn", "index", "query", "info", "run"])
def test_a_jobs_help_imports_no_dask(job):
    code = ("import sys\nimport lshdist.cli\ntry:\n    lshdist.cli.main([sys.argv[1], '--help'])\n"
            "except SystemExit:\n    pass\n"
            f"print('HEAVY', *[m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code, job], capture_output=True, text=True,
                         check=True).stdout
    assert "usage: lshdist " + job in out
    assert out.strip().splitlines()[-1] == "HEAVY"


def test_the_ingest_parsers_lists_are_their_owners():
    """`lshdist.jobs.ingest` shows copies of the format registry, the weightings, the feature
    kinds and the default shard size (their owners import numba and Zarr); a format added to
    the registry without its copy fails here."""
    from lshdist.embed.features import FEATURES
    from lshdist.inputs import REGISTRY, WEIGHTINGS
    from lshdist.jobs import ingest
    from lshdist.store.dataset import DEFAULT_SHARD_ROWS

    assert {name: f.title for name, f in REGISTRY.items()} == ingest.FORMAT_TITLES
    assert list(ingest.FORMAT_TITLES) == list(REGISTRY)  # detection order, as shown
    assert ingest.WEIGHTINGS == WEIGHTINGS
    assert ingest.FEATURES == FEATURES
    assert ingest.DEFAULT_SHARD_ROWS == DEFAULT_SHARD_ROWS
