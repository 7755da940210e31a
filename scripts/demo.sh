#!/usr/bin/env bash
# make demo: ingest the real datasets, then learn + evaluate (L2/ML x scan/hash) on them.
set -euo pipefail
OUT=${1:-out/demo}
BIN=.venv/bin
rm -rf "$OUT"; mkdir -p "$OUT"
run() { echo "+ lshdist $*"; "$BIN/lshdist" "$@"; }

if [ -n "${LSHDIST_DATA_DIR:-}" ] && [ -d "$LSHDIST_DATA_DIR" ]; then
  D=$LSHDIST_DATA_DIR
  run ingest "$D/letter/letter-recognition.data" --format letter --rows 0:16000 --out "$OUT/letter-train"
  run ingest "$D/letter/letter-recognition.data" --format letter --rows 16000:20000 --out "$OUT/letter-test"
  run ingest "$D/fashion-mnist/train-images-idx3-ubyte.gz" "$D/fashion-mnist/train-labels-idx1-ubyte.gz" \
      --shard-rows 10000 --out "$OUT/fashion-train"
  run ingest "$D/fashion-mnist/t10k-images-idx3-ubyte.gz" "$D/fashion-mnist/t10k-labels-idx1-ubyte.gz" \
      --shard-rows 10000 --out "$OUT/fashion-test"
  run ingest "$D/20newsgroups/20newsgroups-train.tab.gz" --out "$OUT/news-train"
  run ingest "$D/20newsgroups/20newsgroups-test.tab.gz" --idf-from "$OUT/news-train" --out "$OUT/news-test"
  for ds in letter-train letter-test fashion-train fashion-test news-train news-test; do
    run info "$OUT/$ds"
  done
  run evaluate --train "$OUT/letter-train" --test "$OUT/letter-test" --out "$OUT/eval-letter" \
      --bits 64 --permutations 40 --window 4 --threads 2
  run evaluate --train "$OUT/fashion-train" --test "$OUT/fashion-test" --out "$OUT/eval-fashion" \
      --constraints 2000 --max-iter 20 --bits 256 --permutations 200 --window 8 --hamming-keep 800 \
      --k 1,10 --recall-k 10 --threads 2 --no-plots
else
  echo "LSHDIST_DATA_DIR is not set: running on scikit-learn's digits instead"
  "$BIN/python" - "$OUT" <<'PY'
import sys, numpy as np
from lshdist.datasets import load_digits
s = load_digits()
np.savez(f"{sys.argv[1]}/digits-train.npz", X=s.X_train, y=s.y_train)
np.savez(f"{sys.argv[1]}/digits-test.npz", X=s.X_test, y=s.y_test)
PY
  run ingest "$OUT/digits-train.npz" --out "$OUT/digits-train"
  run ingest "$OUT/digits-test.npz" --out "$OUT/digits-test"
  run info "$OUT/digits-train"
  run evaluate --train "$OUT/digits-train" --test "$OUT/digits-test" --out "$OUT/eval-digits" \
      --constraints 2000 --bits 64 --permutations 20 --window 4 --sweep-bits 16,32,64
fi
echo "results in $OUT/eval-*/summary.json and the PNG plots beside them"
