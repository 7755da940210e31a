"""Text to sparse rows: a bag of words over hashed 64-bit token ids, counts or TF-IDF.

No vocabulary is gathered or stored: a token's feature id is the first 8 bytes (little-endian)
of its BLAKE2b digest, so two corpora read apart (a train and a test split, two workers) give
the same id to the same word.  The IDF of a corpus is a function of its document frequencies,
which any stored bag-of-words dataset still holds in its sparsity pattern; that is how a test
split is weighted with the IDF of its training split (`Idf.from_dataset`).

Weighting follows scikit-learn's ``TfidfVectorizer`` defaults: ``idf = ln((1+n)/(1+df)) + 1``,
``tfidf = count * idf``, rows scaled to unit L2 norm; words absent from the IDF's corpus are
dropped.  ``counts`` keeps raw counts, also L2-normalised.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import scipy.sparse as sp

from lshdist.blocks import SparseBlock
from lshdist.errors import FormatError, InputError
from lshdist.store.dataset import Dataset

logger = logging.getLogger(__name__)

#: how tokens are found and hashed; stored in the dataset attributes so that a dataset whose
#: feature ids were made another way is refused as an IDF source
TOKENIZER = "lower-alnum"
FEATURE_HASH = "blake2b-64le"
WEIGHTINGS = ("tfidf", "counts")

_TOKEN = re.compile(r"[^\W_]+")  # runs of letters and digits, any script


def tokenize(doc: str) -> list[str]:
    """Lower-cased runs of letters and digits of ``doc``."""
    return _TOKEN.findall(doc.lower())


def feature_ids(tokens: Iterable[str]) -> np.ndarray:
    """Stable 64-bit ids of ``tokens``: uint64 array, one per token.

    The id is the first 8 bytes, little-endian, of the BLAKE2b digest of the UTF-8 token:
    identical in every process and Python version (unlike ``hash``).
    """
    digest = b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest() for t in tokens)
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


def bag_of_words(docs: Sequence[str]) -> SparseBlock:
    """Token counts of each document, over hashed feature ids.

    Parameters
    ----------
    docs : sequence of str, length n

    Returns
    -------
    SparseBlock, shape (n, f)
        float32 counts; an empty document is an empty row.
    """
    # ``local`` only memoises the hashing within this call; it is not kept anywhere
    local: dict[str, int] = {}
    columns: list[int] = []
    lengths = np.zeros(len(docs), dtype=np.int64)
    for i, doc in enumerate(docs):
        tokens = tokenize(doc)
        lengths[i] = len(tokens)
        columns.extend([local.setdefault(t, len(local)) for t in tokens])
    # distinct tokens whose ids collide become one feature, as they would in any other corpus
    features, column_of_token = np.unique(feature_ids(local), return_inverse=True)
    cols = column_of_token.ravel()[np.asarray(columns, dtype=np.int64)]
    rows = np.repeat(np.arange(len(docs), dtype=np.int64), lengths)
    counts = sp.csr_matrix(
        (np.ones(len(cols), dtype=np.float32), (rows, cols)), shape=(len(docs), len(features))
    )
    counts.sum_duplicates()
    return SparseBlock(counts, features)


def document_frequency(block: SparseBlock) -> tuple[np.ndarray, np.ndarray]:
    """Features of ``block`` and the number of rows holding each (nonzero entries).

    Returns
    -------
    features : uint64 array (f,), sorted
    df : int64 array (f,)
    """
    m = sp.csr_matrix(block.matrix, copy=True)
    m.sum_duplicates()
    m.eliminate_zeros()
    df = np.bincount(m.indices, minlength=len(block.features)).astype(np.int64)
    used = df > 0
    return block.features[used], df[used]


@dataclass(frozen=True)
class Idf:
    """Inverse document frequencies of a corpus.

    Attributes
    ----------
    features : uint64 array (f,), sorted feature ids seen in the corpus
    values : float64 array (f,), ``ln((1+n)/(1+df)) + 1``
    n_documents : int
    """

    features: np.ndarray
    values: np.ndarray
    n_documents: int

    @classmethod
    def from_counts(cls, block: SparseBlock) -> Idf:
        """IDF of the rows of ``block`` (any weighting: only the nonzero pattern counts)."""
        features, df = document_frequency(block)
        n = block.n_rows
        return cls(features, np.log((1.0 + n) / (1.0 + df)) + 1.0, n)

    @classmethod
    def from_dataset(cls, path: str | os.PathLike[str]) -> Idf:
        """IDF of a text dataset written by `lshdist ingest` (its stored rows' nonzeros)."""
        ds = Dataset(path)
        text = ds.attrs.get("text")
        if ds.kind != "sparse" or not isinstance(text, dict):
            raise FormatError(
                f"IDF source {str(path)!r} is a {ds.kind} dataset without text attributes; "
                "give the dataset ingested from the training split's text"
            )
        if text.get("tokenizer") != TOKENIZER or text.get("feature_hash") != FEATURE_HASH:
            raise FormatError(
                f"IDF source {str(path)!r} was tokenised with {text.get('tokenizer')!r}/"
                f"{text.get('feature_hash')!r}, this lshdist uses {TOKENIZER!r}/{FEATURE_HASH!r}; "
                "re-ingest the training split"
            )
        return cls.from_counts(cast(SparseBlock, ds.read_all()))  # kind checked above

    def lookup(self, features: np.ndarray) -> np.ndarray:
        """IDF of each of ``features`` (uint64); 0.0 for a feature the corpus never had."""
        pos = np.searchsorted(self.features, features)
        pos = np.minimum(pos, max(len(self.features) - 1, 0))
        out = np.zeros(len(features), dtype=np.float64)
        if len(self.features):
            hit = self.features[pos] == features
            out[hit] = self.values[pos[hit]]
        return out


def weight_rows(
    counts: SparseBlock, weighting: str = "tfidf", idf: Idf | None = None
) -> SparseBlock:
    """Weight token counts and scale every row to unit L2 norm.

    Parameters
    ----------
    counts : SparseBlock (n, f)
        Token counts, from `bag_of_words`.
    weighting : {'tfidf', 'counts'}
    idf : Idf, optional
        For ``'tfidf'``: the IDF to apply (default: that of ``counts`` itself).  Features the
        IDF's corpus never saw are dropped, as scikit-learn drops out-of-vocabulary words.

    Returns
    -------
    SparseBlock (n, f'), float32; a row left with no entry stays empty.
    """
    if weighting not in WEIGHTINGS:
        raise InputError(f"weighting={weighting!r}: expected one of {', '.join(WEIGHTINGS)}")
    m = sp.csr_matrix(counts.matrix, dtype=np.float64, copy=True)
    if weighting == "tfidf":
        if idf is None:
            idf = Idf.from_counts(counts)
        m = sp.csr_matrix(m @ sp.diags(idf.lookup(counts.features)))
        m.eliminate_zeros()
    norms = np.sqrt(np.asarray(m.multiply(m).sum(axis=1)).ravel())
    scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    m = sp.csr_matrix(sp.diags(scale) @ m)
    m.sort_indices()
    indptr, local, data = m.indptr, m.indices, m.data.astype(np.float32)
    return SparseBlock.from_arrays(indptr, counts.features[local], data)


def text_attrs(weighting: str, idf_source: str | None, n_documents: int | None) -> dict[str, Any]:
    """Dataset attributes recording how text rows were made (checked by `Idf.from_dataset`)."""
    return {
        "tokenizer": TOKENIZER,
        "feature_hash": FEATURE_HASH,
        "weighting": weighting,
        "idf_source": idf_source,
        "idf_documents": n_documents,
        "normalization": "l2",
    }
