import gzip
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

from lshdist.store.dataset import write_dataset


@pytest.fixture
def samples(tmp_path) -> dict[str, Path]:
    """One small valid input per format name (an IDX images file for ``idx``)."""
    d = tmp_path / "samples"
    d.mkdir()
    np.save(d / "x.npy", np.arange(6.0).reshape(3, 2))
    sp.save_npz(d / "s.npz", sp.csr_matrix(np.eye(3, 4)))
    pq.write_table(pa.table({"a": [1.0, 2.0], "label": ["u", "v"]}), d / "t.parquet")
    pixels = np.arange(12, dtype=np.uint8).reshape(3, 2, 2)
    header = bytes([0, 0, 0x08, 3]) + np.array(pixels.shape, ">i4").tobytes()
    (d / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + pixels.tobytes()))
    (d / "letter.data").write_text("T,2,8,3,5,1,8,13,0,6,6,10,8,0,8,0,8\n")
    lines = "Category\tText\nd\tstring\nclass\t\nsci.space\tthe moon\nrec.autos\ta car\n"
    (d / "ng.tab").write_text(lines)
    (d / "a.csv").write_text("f1,f2,label\n1,2,x\n3,4,y\n")
    write_dataset(d / "ds", np.ones((3, 2)), shard_rows=2)
    return {
        "npy": d / "x.npy",
        "npz": d / "s.npz",
        "parquet": d / "t.parquet",
        "idx": d / "train-images-idx3-ubyte.gz",
        "letter": d / "letter.data",
        "newsgroups": d / "ng.tab",
        "csv": d / "a.csv",
        "zarr": d / "ds",
    }
