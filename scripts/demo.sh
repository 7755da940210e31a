#!/usr/bin/env bash
# make demo: ingest the real datasets (and show them), then run the whole pipeline on Dask:
# learn -> index -> query (hashed and exact scan) -> evaluate, on Fashion-MNIST (digits when
# the data folder is absent).
set -euo pipefail
OUT=${1:-out/demo}
BIN=.venv/bin
rm -rf "$OUT"; mkdir -p "$OUT"
run() { echo "+ lshdist $*"; "$BIN/lshdist" "$@"; }

if [ -n "${LSHDIST_DATA_DIR:-}" ] && [ -d "$LSHDIST_DATA_DIR" ]; then
  D=$LSHDIST_DATA_DIR
  run ingest "$D/letter/letter-recognition.data" --format letter --rows 0:16000 --out "$OUT/letter-train"
  run ingest "$D/letter/letter-recognition.data" --format letter --rows 16000:20000 --out "$OUT/letter-test"
  run ingest "$D/20newsgroups/20newsgroups-train.tab.gz" --out "$OUT/news-train"
  run ingest "$D/20newsgroups/20newsgroups-test.tab.gz" --idf-from "$OUT/news-train" --out "$OUT/news-test"
  run info "$OUT/letter-train"
  run info "$OUT/news-test"
  run evaluate --train "$OUT/letter-train" --test "$OUT/letter-test" --out "$OUT/eval-letter" \
      --target-recall 0.9 --k 1,10 --threads 2 --no-plots
  run run configs/fashion-mnist.yaml --fresh
  echo "Fashion-MNIST: out/fashion-mnist/report.json, results-*/ (Parquet), *.png"
else
  echo "LSHDIST_DATA_DIR is not set: running on scikit-learn's digits instead"
  run run configs/digits.yaml --fresh
  echo "digits: out/digits/report.json, results-*/ (Parquet), *.png"
fi
