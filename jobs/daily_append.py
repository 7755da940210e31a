#!/usr/bin/env python3
"""Append one day's data to an index (cron/systemd: deploy/schedule/):
`python jobs/daily_append.py configs/jobs/daily.yaml [--day YYYY-MM-DD]`.

A thin entry point for schedulers and cluster submission; the work is in the library
(`lshdist.jobs.batch.daily_append`).  Exit codes: 0 done or nothing to do; 2 bad input or config, a
lock held by another run, an unreachable or stalled cluster (one-line message); 130
interrupted; 1 unexpected error.
"""

import sys

from lshdist.jobs.batch import daily_append

if __name__ == "__main__":
    sys.exit(daily_append())
