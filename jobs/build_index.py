#!/usr/bin/env python3
"""Build an index from a job config: `python jobs/build_index.py configs/jobs/build.yaml`.

A thin entry point for schedulers and cluster submission; the work is in the library
(`lshdist.jobs.batch.build_index`).  Exit codes: 0 done or nothing to do; 2 bad input or config, a
lock held by another run, an unreachable or stalled cluster (one-line message); 130
interrupted; 1 unexpected error.
"""

import sys

from lshdist.jobs.batch import build_index

if __name__ == "__main__":
    sys.exit(build_index())
