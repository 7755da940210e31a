#!/usr/bin/env python3
"""Bulk k-NN queries from a job config: `python jobs/bulk_query.py configs/jobs/query.yaml`.

A thin entry point for schedulers and cluster submission; the work is in the library
(`lshdist.jobs.batch.bulk_query`).  Exit codes: 0 done or nothing to do; 2 bad input or config, a
lock held by another run, an unreachable or stalled cluster (one-line message); 130
interrupted; 1 unexpected error.
"""

import sys

from lshdist.jobs.batch import bulk_query

if __name__ == "__main__":
    sys.exit(bulk_query())
