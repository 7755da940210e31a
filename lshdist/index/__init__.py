"""One-process search: permutation-sorted key lists, exact scan, re-rank payloads."""

from lshdist.index.permutation import PermutationIndex
from lshdist.index.scan import scan_topk
from lshdist.index.searcher import MetricIndex

__all__ = ["MetricIndex", "PermutationIndex", "scan_topk"]
