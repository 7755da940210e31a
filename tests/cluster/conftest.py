import numpy as np
import pytest

from lshdist.metric.itml import ITML
from lshdist.store.dataset import write_dataset
from lshdist.store.model import save_model


@pytest.fixture(scope="session")
def letter_job(letter, tmp_path_factory):
    """Letter train in two shard sizes (segments of 4,000 rows are the same runs of rows in
    both: segments are runs of whole shards), the test split as queries, and a learned model."""
    root = tmp_path_factory.mktemp("letter_job")
    Xtr, ytr, Xte, yte = letter
    write_dataset(root / "train-a", Xtr, ytr, classes=letter.classes, shard_rows=2000)
    write_dataset(root / "train-b", Xtr, ytr, classes=letter.classes, shard_rows=4000)
    write_dataset(root / "first", Xtr[:8000], ytr[:8000], classes=letter.classes, shard_rows=2000)
    write_dataset(root / "second", Xtr[8000:], ytr[8000:], classes=letter.classes,
                  ids=np.arange(8000, 16000), shard_rows=2000)
    write_dataset(root / "queries", Xte, yte, classes=letter.classes, ids=np.arange(16000, 20000),
                  shard_rows=1000)
    metric = ITML(n_constraints=2000).fit(Xtr, ytr).metric()
    save_model(root / "model", metric)
    return root
