"""The bias constant of hyperplane keys and centring, measured.

Fashion-MNIST, the first 20,000 training images in [0, 1]; 10 binary one-vs-all LinearSVCs
(balanced, C = 1) on 15 labelled images per class, fitted on the rows as given or on the rows
at unit RMS norm (as `lshdist active` fits them); H-Hash 1,024 bits, mode rank, 500 rows
re-ranked.  Per setting (keys of the rows as given or centred; bias constant c = 1 or the
default of `HyperplaneIndex`): the nearest margin found, averaged over the 10 hyperplanes,
against 500 random rows and the exact nearest.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_hyperplane_bias.py
"""

import common  # noqa: I001  (first: pins threads before numpy loads)

import numpy as np
from sklearn.svm import LinearSVC

from lshdist.datasets import load_fashion_mnist
from lshdist.index.hyperplane import HyperplaneIndex, rms_norm


def main():
    split = load_fashion_mnist()
    X = (split.X_train[:20_000] / 255.0).astype(np.float32)
    y = split.y_train[:20_000]
    rng = np.random.default_rng(0)
    lab = np.concatenate([rng.choice(np.flatnonzero(y == c), 15, replace=False)
                          for c in range(10)])
    rows = []
    for svm in ("as given", "unit RMS norm"):
        s = 1.0 if svm == "as given" else 1.0 / np.sqrt(
            np.einsum("ij,ij->", X, X, dtype=np.float64) / len(X))
        planes = []
        for c in range(10):
            clf = LinearSVC(class_weight="balanced", dual="auto", max_iter=5000)
            clf.fit(X[lab] * s, y[lab] == c)
            planes.append((s * clf.coef_.ravel().astype(np.float64), float(clf.intercept_[0])))
        W = np.stack([p[0] for p in planes])
        b = np.array([p[1] for p in planes])
        M = np.abs(X.astype(np.float64) @ W.T + b) / np.linalg.norm(W, axis=1)
        rnd = float(np.mean([M[rng.choice(len(X), 500, replace=False), q].min()
                             for q in range(10)]))
        for center in (False, True):
            R = rms_norm(X, X.astype(np.float64).mean(axis=0) if center else None)
            for given in (1.0, R):
                idx = HyperplaneIndex(family="h-hash", bits=1024, bias=True, center=center,
                                      bias_scale=given, seed=1).fit(X)
                dist, _ = idx.query(W, 10, offsets=b, mode="rank", candidates=500)
                rows.append({"SVMs on rows": svm, "keys": "centred" if center else "as given",
                             "c": ("1" if given == 1.0 else f"R = {R:.3g}")
                             + (" (default)" if (given == 1.0) == (not center) else ""),
                             "nearest margin": float(f"{dist[:, 0].mean():.3g}"),
                             "500 random rows": float(f"{rnd:.3g}"),
                             "exact nearest": float(f"{M.min(0).mean():.3g}"),
                             "distance from origin": float(np.mean(np.abs(b)
                                                                   / np.linalg.norm(W, axis=1)))})
    common.write_results("hyperplane_bias", {"bias": rows},
                         title="Hyperplane keys: the bias constant and centring "
                               "(Fashion-MNIST 20k, H-Hash 1,024 bits, 500 re-ranked)")


if __name__ == "__main__":
    main()
