"""Text to sparse rows: stable token ids, counts, and TF-IDF equal to scikit-learn's."""

import numpy as np

from lshdist.blocks import SparseBlock
from lshdist.inputs.text import bag_of_words, document_frequency, feature_ids, tokenize, weight_rows

DOCS = [
    "the moon and the orbit of the moon",
    "a car engine and a car wheel",
    "orbit launch rocket",
    "engine oil",
]


def test_token_ids_are_stable():
    # pinned: a change here re-numbers every stored text dataset
    assert feature_ids(["hello", "world"]).tolist() == [9022087748821825191, 1122476747036766552]
    assert tokenize("Hello, World_x 42né!") == ["hello", "world", "x", "42né"]


def test_tfidf_matches_scikit_learn():
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer(tokenizer=tokenize, lowercase=False, token_pattern=None)
    want = vec.fit_transform(DOCS).toarray()
    order = feature_ids(vec.get_feature_names_out())
    got = weight_rows(bag_of_words(DOCS), "tfidf").over(np.sort(order)).toarray()
    np.testing.assert_allclose(got[:, np.argsort(np.argsort(order))], want, rtol=1e-6)


def test_document_frequency_counts_rows_not_occurrences():
    block = bag_of_words(["a a a b", "a", "c"])
    features, df = document_frequency(block)
    assert dict(zip(features.tolist(), df.tolist())) == dict(
        zip(feature_ids(["a", "b", "c"]).tolist(), [2, 1, 1])
    )
    assert isinstance(block, SparseBlock) and block.matrix.sum() == 6
