"""Which segments compaction merges: those *below* the segment size."""

from lshdist.cluster.compact import compaction_groups


def test_a_segment_of_exactly_the_segment_size_is_not_small():
    """A full segment (rows == segment_rows) is neither merged nor counted as small, and it
    does not cut a run of small ones.  Mutant caught: ``rows < segment_rows`` written ``<=``
    (the full segment joined the small ones: [0, 2] were no longer merged, and the count of
    small segments reached min_segments one segment early)."""
    e = [{"rows": r} for r in (100, 500, 100)]
    assert compaction_groups(e, min_segments=2, segment_rows=500) == [[0, 2]]
    assert compaction_groups(e, min_segments=3, segment_rows=500) == []  # two small, not three
    assert compaction_groups(e, min_segments=2, segment_rows=501) == []  # 100+500 > 501
    assert compaction_groups([{"rows": 499}, {"rows": 1}], min_segments=2,
                             segment_rows=500) == [[0, 1]]
