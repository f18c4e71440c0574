import numpy as np
import pytest

from streaming.samples import SampleQueue


def test_reads_cross_the_pieces_they_were_pushed_in() -> None:
    q = SampleQueue(max_samples=100)
    q.push(np.arange(3, dtype=np.float32))
    q.push(np.arange(3, 8, dtype=np.float32))
    out = np.zeros(4, dtype=np.float32)
    assert q.pop_into(out) == 4 and out.tolist() == [0, 1, 2, 3]
    assert len(q) == 4
    out = np.full(6, -1.0, dtype=np.float32)
    assert q.pop_into(out) == 4 and out.tolist() == [4, 5, 6, 7, -1, -1], "the rest of out is left as it was"
    assert len(q) == 0 and q.pop_into(out) == 0


def test_the_bound_drops_the_oldest_and_counts_them() -> None:
    q = SampleQueue(max_samples=5)
    assert q.push(np.arange(4, dtype=np.float32)) == 0
    assert q.push(np.arange(4, 7, dtype=np.float32)) == 2
    assert q.dropped == 2 and len(q) == 5
    out = np.zeros(5, dtype=np.float32)
    q.pop_into(out)
    assert out.tolist() == [2, 3, 4, 5, 6]
    q.push(np.ones(3, dtype=np.float32))
    assert q.clear() == 3 and len(q) == 0 and q.dropped == 2, "clear() is not an overrun"


def test_empty_pushes_and_bad_bounds() -> None:
    q = SampleQueue(max_samples=1)
    assert q.push(np.zeros(0, dtype=np.float32)) == 0 and len(q) == 0
    with pytest.raises(ValueError):
        SampleQueue(max_samples=-1)
