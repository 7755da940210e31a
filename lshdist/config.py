"""One typed configuration for every job: the CLI flags and the YAML of ``lshdist run``.

Each section is a frozen dataclass whose fields carry their default, their help text and the
rule that checks them (`Rule`).  From these alone:

* `add_options` adds the argparse options of a section (help lines with the default);
* `from_args` builds a section from parsed flags, remembering which were given;
* `from_mapping` builds a section from a YAML mapping — an unknown key, or a value of the
  wrong type or range, is an `InputError` naming the key and what is allowed.

Defaults live here and nowhere else.  This module imports nothing of lshdist but its errors
and the bounds of `lshdist.limits`, so every layer may use it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from lshdist.errors import InputError
from lshdist.limits import MAX_BITS, MAX_PERMUTATIONS

T = TypeVar("T", bound="Section")


# --------------------------------------------------------------------------------------------
# rules: how a value is parsed from a flag, checked from YAML, and described in messages


@dataclass(frozen=True)
class Rule:
    """How one option's value is read (from text or from YAML) and checked."""

    describe: str
    check: Callable[[Any], Any]
    parse: Callable[[str], Any] | None = None  # text -> value (CLI); default: YAML scalar
    choices: tuple[str, ...] = ()

    def from_text(self, text: str) -> Any:
        if self.parse is not None:
            return self.check(self.parse(text))
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        return self.check(value)


class _Bad(Exception):
    """A value outside its rule (turned into a message naming the option)."""


def _int(lo: int | None = None, hi: int | None = None) -> Rule:
    span = (f">= {lo}" if hi is None else f"in {lo}..{hi}") if lo is not None else "any integer"
    desc = f"an integer {span}" if lo is not None else "an integer"

    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _Bad(desc)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise _Bad(desc)
        return int(v)

    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise _Bad(desc) from None

    return Rule(desc, check, parse)


def _float(lo: float = 0.0, hi: float | None = None, *, open_lo: bool = True) -> Rule:
    desc = (f"a number > {lo:g}" if open_lo else f"a number >= {lo:g}") + (
        f" and <= {hi:g}" if hi is not None else "")

    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Bad(desc)
        if not (v > lo if open_lo else v >= lo) or (hi is not None and v > hi) or v != v:
            raise _Bad(desc)
        return float(v)

    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise _Bad(desc) from None

    return Rule(desc, check, parse)


def _choice(*values: str) -> Rule:
    desc = "one of " + ", ".join(values)

    def check(v: Any) -> str:
        if v not in values:
            raise _Bad(desc)
        return str(v)

    return Rule(desc, check, str, values)


def _kind_name() -> Rule:
    """``--method``: permutation, subspace, or the name of an index kind added as a plug-in
    (`lshdist.cluster.kinds`, which refuses a name no installed kind has)."""
    desc = "permutation, subspace or the name of an installed index-kind plug-in"
    pattern = re.compile(r"[a-z][a-z0-9_-]{0,63}")

    def check(v: Any) -> str:
        if not isinstance(v, str) or not pattern.fullmatch(v):
            raise _Bad(desc)
        return v

    return Rule(desc, check, str)


def _optional(rule: Rule) -> Rule:
    def check(v: Any) -> Any:
        return None if v is None else rule.check(v)

    return Rule(rule.describe + " (or null)", check, rule.parse, rule.choices)


def _string() -> Rule:
    def check(v: Any) -> str:
        if not isinstance(v, str) or not v:
            raise _Bad("a non-empty string")
        return v

    return Rule("a non-empty string", check, str)


def _flag() -> Rule:
    def check(v: Any) -> bool:
        if not isinstance(v, bool):
            raise _Bad("true or false")
        return v

    return Rule("true or false", check)


def _int_list() -> Rule:
    desc = "a list of integers >= 1 (CLI: comma-separated)"

    def check(v: Any) -> tuple[int, ...]:
        if isinstance(v, (int, str)) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, (list, tuple)) or not v:
            raise _Bad(desc)
        out = []
        for x in v:
            if isinstance(x, str):
                try:
                    x = int(x)
                except ValueError:
                    raise _Bad(desc) from None
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise _Bad(desc)
            out.append(int(x))
        return tuple(out)

    def parse(text: str) -> list[str]:
        return [t.strip() for t in text.split(",") if t.strip()]

    return Rule(desc, check, parse)


def _percentiles() -> Rule:
    desc = "'code' (5th/95th), 'paper' (1st/99th) or two numbers LO,HI with 0 <= LO < HI <= 100"

    def check(v: Any) -> str | tuple[float, float]:
        if v in ("code", "paper"):
            return str(v)
        if isinstance(v, str):
            v = v.split(",")
        try:
            lo, hi = (float(x) for x in v)
        except (TypeError, ValueError):
            raise _Bad(desc) from None
        if not 0 <= lo < hi <= 100:
            raise _Bad(desc)
        return (lo, hi)

    return Rule(desc, check, str)


def _rows() -> Rule:
    desc = "two integers [START, STOP] with 0 <= START < STOP"

    def check(v: Any) -> tuple[int, int]:
        if isinstance(v, str):
            v = v.split(":")
        try:
            a, b = v
        except (TypeError, ValueError):
            raise _Bad(desc) from None
        if any(isinstance(x, bool) or not isinstance(x, (int, str)) for x in (a, b)):
            raise _Bad(desc)
        try:
            a, b = int(a), int(b)
        except ValueError:
            raise _Bad(desc) from None
        if not 0 <= a < b:
            raise _Bad(desc)
        return (a, b)

    return Rule(desc, check, str)


def _str_list() -> Rule:
    desc = "a list of paths"

    def check(v: Any) -> tuple[str, ...]:
        if isinstance(v, str):
            v = [v]
        if (not isinstance(v, (list, tuple)) or not v
                or not all(isinstance(x, str) and x for x in v)):
            raise _Bad(desc)
        return tuple(v)

    return Rule(desc, check)


POSITIVE = _int(1)
NONNEG = _int(0)
SEED = _int(0, 2**63 - 1)
POSITIVE_FLOAT = _float()
INT_LIST = _int_list()
#: where a Dask job runs (`ClusterConfig.kind`)
CLUSTER_KINDS = ("local", "slurm", "kubernetes")
#: how a k-NN index answers: its hashed search at an operating point, or the exact scan
SEARCH_MODES = ("hash", "scan")
#: what a k-NN query may ask for: "auto" is the mode the index's calibration chose
KNN_MODES = ("auto", *SEARCH_MODES)
#: how a hyperplane index answers: "rank" re-ranks the keys of smallest angle score
HYPERPLANE_MODES = ("hash", "rank", "scan")
#: `QueryConfig.mode`: every mode some index answers in
QUERY_MODES = (*KNN_MODES, "rank")


def check_mode(mode: str, modes: Sequence[str]) -> str:
    """``mode`` if it is one of ``modes``, else an `InputError` naming them."""
    if mode not in modes:
        raise InputError(f"mode={mode!r}; choose one of {list(modes)}")
    return mode


def opt(default: Any, rule: Rule, help: str, *, metavar: str | None = None,
        flag: str | None = None, cli: bool = True) -> Any:
    """A config field: its default, rule and help line (and its CLI flag, ``--field-name``)."""
    return field(default=default, metadata={"rule": rule, "help": help, "metavar": metavar,
                                            "flag": flag, "cli": cli})


# --------------------------------------------------------------------------------------------
# the sections


@dataclass(frozen=True)
class Section:
    """Base of the option sections: ``given_`` names the fields set by a flag or a YAML key."""

    given_: frozenset[str] = field(default=frozenset(), compare=False, repr=False)


@dataclass(frozen=True)
class LearnConfig(Section):
    """ITML on the driver (``lshdist learn``, the ``learn:`` section)."""

    kind: str | None = opt(None, _optional(_choice("explicit", "implicit")),
                           "explicit d x d (default for dense data) or kernelized over c basis "
                           "points (default for sparse data)")
    basis: int = opt(300, POSITIVE, "implicit: number c of basis points", metavar="c")
    route: str = opt("span", _choice("span", "basis"),
                     "implicit: constraints among any points via span coordinates, or among "
                     "basis points via Lemma 2")
    constraints: int | None = opt(None, _optional(POSITIVE),
                                  "pairs drawn from labels (default 10000 explicit, 2000 implicit)",
                                  metavar="n")
    strategy: str = opt("neighbors", _choice("neighbors", "random"),
                        "how pairs are drawn from labels")
    neighbors: int = opt(10, POSITIVE, "neighbors strategy: neighbours per anchor", metavar="k")
    gamma: float = opt(1.0, _float(), "ITML slack gamma")
    percentiles: str | tuple[float, float] = opt(
        "code", _percentiles(), "bounds u, l: 'code' = 5th/95th, 'paper' = 1st/99th, or LO,HI")
    max_iter: int | None = opt(None, _optional(POSITIVE),
                               "passes over the constraints (default 1000 explicit, 100 implicit)")
    tol: float = opt(1e-3, _float(), "convergence tolerance")
    prior: str = opt("identity", _choice("identity", "inverse-covariance"), "explicit: prior A0")
    seed: int = opt(0, SEED, "seed of the constraints and the basis")
    validation: float = opt(0.2, _float(0.0, 0.5),
                            "metric selection: round(1/validation) stratified folds (2 to 10) "
                            "over the labelled rows (at most 20,000), each held out once to "
                            "compare the learned metric with the prior")
    validation_k: int = opt(10, POSITIVE, "held-out k-NN accuracy is reported at k=1 and this k")
    no_search: bool = opt(False, _flag(), "fit the given ITML setting only (no grid search)")
    budget: float = opt(120.0, _float(), "seconds the grid search may take (the given setting "
                                         "is always tried)", metavar="SECONDS")
    force_learned: bool = opt(False, _flag(),
                              "keep the learned metric even when it does not beat the prior on "
                              "the held-out rows")
    grid_threads: int | None = opt(None, _optional(POSITIVE),
                                   "settings of the metric-selection grid fitted at once on the "
                                   "driver (default: the cores available to it; the same settings "
                                   "tried give the same choice — a binding --budget lets more "
                                   "threads try more of them)", metavar="n")
    sample: int = opt(20_000, POSITIVE,
                      "labelled rows read to learn from (stratified; a larger dataset is "
                      "sampled shard by shard, never loaded whole)", metavar="n")
    kernel: str | None = opt(None, _optional(_choice("pmk", "pdk")),
                             "point-set datasets: the set kernel the metric is learned over, "
                             "pyramid match or proximity distribution (the model embeds sets "
                             "with it; index and query take it from the model)")
    levels: int = opt(6, _int(1, 255), "pmk: pyramid levels L", metavar="L")
    pca: int = opt(8, NONNEG, "pmk: project the local features on their top principal "
                              "directions before binning (0: no projection)", metavar="k")
    spatial: float = opt(1.0, _float(0.0, open_lo=False),
                         "pmk: weight of the points' image coordinates, appended to their "
                         "features (0: features alone)", metavar="w")
    finest_side: float | None = opt(None, _optional(_float()),
                                    "pmk: bin side at the finest level (default: twice the "
                                    "features' largest range / 2^(L-1))", metavar="s")
    codebook: int = opt(64, _int(1, 1 << 20), "pdk: visual words (k-means codebook size)",
                        metavar="n")
    spatial_neighbors: int = opt(8, _int(1, 255),
                                 "pdk: R, nearest neighbours in the image counted per point",
                                 metavar="R")
    unnormalized: bool = opt(False, _flag(),
                             "set kernels: the raw intersection instead of the normalised "
                             "k(Y,Z)/sqrt(k(Y,Y)k(Z,Z))")


#: r, bits per group code of a subspace index when --bits is not given (the permutation
#: index's default b is far more than a k-dimensional group needs)
SUBSPACE_BITS = 32
#: b of a permutation index when --bits is not given (`default_key_bits`): a build followed by
#: its queries under an explicit metric where hashing is most of the job, and any other
SHORT_KEY_BITS = 256
DEFAULT_KEY_BITS = 512
#: options of one method only (given with the other method: an error)
SUBSPACE_OPTIONS = frozenset({"rank", "eta", "alpha", "max_rounds", "krylov_iters", "probe",
                              "candidates"})
PERMUTATION_OPTIONS = frozenset({"epsilon", "permutations", "window",
                                 "hamming_keep", "calibration_queries", "baseline", "family",
                                 "eh_samples", "k", "segment_rows"})


@dataclass(frozen=True)
class IndexConfig(Section):
    """The hashed index (``lshdist index``, the ``index:`` section)."""

    target_recall: float = opt(0.9, _float(0.0, 1.0),
                               "recall@k against the exact scan that calibration chooses M, W "
                               "and H for (the options below, when given, stay fixed); "
                               "--method subspace: the recall a query calibrates --probe and "
                               "--candidates for, on a sample of its queries",
                               metavar="R")
    k: int = opt(10, POSITIVE, "the k of the calibrated recall@k")
    bits: int | None = opt(None, _optional(_int(1, MAX_BITS)),
                           "b, bits per hash key (default 512; 256 for a build followed by its "
                           "queries under an explicit metric where rows + queries >= 2 x "
                           "queries x segments)", metavar="b")
    epsilon: float | None = opt(None, _optional(_float()),
                                "M = ceil(2 n^(1/(1+e))) permutations for n rows per segment "
                                "(fixes M; default: calibrated)", metavar="e")
    permutations: int | None = opt(None, _optional(_int(1, MAX_PERMUTATIONS)),
                                   "M, permutation-sorted lists per segment (fixes M; default: "
                                   "calibrated)", metavar="M")
    window: int | None = opt(None, _optional(POSITIVE),
                             "W, list entries taken on each side of a query (fixes W; "
                             "default: calibrated)", metavar="W")
    hamming_keep: int | None = opt(None, _optional(NONNEG),
                                   "re-rank only the H candidates nearest in Hamming distance "
                                   "per segment, 0: all (fixes H; default: calibrated)",
                                   metavar="H")
    calibration_queries: str | None = opt(
        None, _optional(_string()),
        "a dataset of rows like the real queries, sampled to calibrate with (default: the "
        "database's own rows, leave-one-out; give one when the database holds near-copies of "
        "its rows, e.g. augmented data)", metavar="DATASET")
    segment_rows: int = opt(100_000, POSITIVE,
                            "rows per segment (rounded down to whole dataset shards, at least one)",
                            metavar="n")
    baseline: bool = opt(False, _flag(),
                         "Charikar's random hyperplanes instead of the learned hash functions")
    family: str | None = opt(None, _optional(_choice("h-hash", "eh-hash")),
                             "an index for hyperplane queries (`lshdist query --hyperplanes`): "
                             "H-Hash or EH-Hash keys, candidates re-ranked by |w^T x|/||w|| "
                             "(the model only fixes d and dense/sparse; no calibration: M, W, H "
                             "as given, default M=64, W=8, H=0)")
    eh_samples: int | None = opt(None, _optional(POSITIVE),
                                 "eh-hash: t samples of the query embedding (NIPS 2010 Lemma "
                                 "3.4; t = 1/eps'^2); default exact", metavar="t")
    seed: int = opt(0, SEED, "seed of the hash functions and permutations")
    method: str = opt("permutation", _kind_name(),
                      "permutation: b-bit keys in permutation-sorted lists (the options "
                      "above); subspace: the spectral subspace-partition index (dense data, "
                      "an explicit or L2 model; the options below, --bits = r bits per group "
                      f"code, default {SUBSPACE_BITS})")
    rank: int = opt(16, POSITIVE, "subspace: k, the dimension of every group's subspace",
                    metavar="K")
    eta: float = opt(0.1, _float(0.0, open_lo=False),
                     "subspace: slack of the capture threshold sqrt(2)(1+eta) alpha")
    alpha: float | None = opt(None, _optional(_float()),
                              "subspace: the noise scale alpha (default: estimated per round, "
                              "median distance / sqrt(2))")
    max_rounds: int = opt(32, POSITIVE, "subspace: partition rounds at most")
    krylov_iters: int = opt(4, NONNEG, "subspace: q, block Krylov iterations", metavar="q")
    probe: int = opt(1, POSITIVE, "subspace: groups searched per query (nearest subspaces)",
                     metavar="N")
    candidates: int = opt(100, POSITIVE,
                          "subspace: members re-ranked per probed group (nearest in Hamming "
                          "distance)", metavar="H")

    def __post_init__(self) -> None:
        if self.epsilon is not None and self.permutations is not None:
            raise InputError("give epsilon or permutations (M), not both")
        if (self.method == "subspace" and "target_recall" in self.given_
                and {"probe", "candidates"} & self.given_):
            raise InputError("--target-recall chooses --probe and --candidates of a subspace "
                             "index; give the target or fix them, not both")
        own = SUBSPACE_OPTIONS if self.method == "permutation" else PERMUTATION_OPTIONS
        other = "subspace" if self.method == "permutation" else "permutation"
        # (a plug-in kind reads what it needs of either method's options)
        clash = sorted(own & self.given_) if self.method in ("permutation", "subspace") else []
        if clash:
            flags = ", ".join("--" + c.replace("_", "-") for c in clash)
            raise InputError(f"{flags}: only for --method {other}, but the method is "
                             f"{self.method}; drop {'them' if len(clash) > 1 else 'it'} or give "
                             f"--method {other}")

    def key_bits(self, explicit: bool, *, rows: int = 0, queries: int | None = None,
                 segments: int = 1) -> int:
        """b of a permutation index: ``bits`` when given, else `default_key_bits`."""
        return (self.bits if self.bits is not None
                else default_key_bits(explicit, rows=rows, queries=queries, segments=segments))

    @property
    def code_bits(self) -> int:
        """r of a subspace index: ``bits`` when given, else `SUBSPACE_BITS`."""
        return self.bits if self.bits is not None else SUBSPACE_BITS


def default_key_bits(explicit: bool, *, rows: int = 0, queries: int | None = None,
                     segments: int = 1) -> int:
    """b when none is given: `SHORT_KEY_BITS` (256) for a build of ``rows`` rows in
    ``segments`` segments followed by a known number of ``queries`` under an explicit metric,
    where ``rows + queries >= 2 queries segments``; else `DEFAULT_KEY_BITS` (512).

    Under an explicit metric a row's bits are one float32 product, 2 d b flops for each of
    the rows + queries, and 256 bits halve them; the price is paid per query and segment
    searched: a blunter Hamming cut, which the calibration widens to keep the target (about
    twice the rows re-ranked in each segment).  Whole jobs, 256 against 512 bits, paired on a
    warm 2-worker cluster (`benchmarks/bench_bits.py`): Fashion-MNIST, (rows + queries) /
    (queries segments) = 3.5, 1.08-1.14x faster; 240,000 shifted images, 8.3, 1.06-1.13x;
    1,020,000 rows and 100,000 queries in 11 segments, 1.0, 0.93-1.01x (the query stage 20 %
    slower).  The threshold 2 lies between them.  An index built without its queries
    (``queries`` None) keeps 512: it is queried again and again.  A kernelized metric's
    re-rank costs kernel evaluations per candidate, and a sharper cut saves more of them: on
    pyramid-match kernels over Fashion-MNIST's local features (6,000 rows) 256 bits
    re-ranked 10.7 % of the rows or more, 512 about 5 %."""
    if explicit and queries and rows + queries >= 2 * queries * max(1, segments):
        return SHORT_KEY_BITS
    return DEFAULT_KEY_BITS


@dataclass(frozen=True)
class QueryConfig(Section):
    """Bulk queries (``lshdist query``, the ``query:`` section)."""

    k: int = opt(10, POSITIVE, "neighbours per query")
    mode: str = opt("auto", _choice(*QUERY_MODES),
                    "auto: what the index's calibration chose (hashed, or the exact scan where "
                    "that is no slower); hash; or scan, the exact distributed linear scan; "
                    "rank (--hyperplanes only): every key's angle score, the --candidates "
                    "smallest re-ranked (default 500, shared by the segments in proportion "
                    "to their rows)")
    target_recall: float | None = opt(None, _optional(_float(0.0, 1.0)),
                                      "another operating point of the index's calibration "
                                      "curve (default: the one chosen at build time)",
                                      metavar="R")
    check_recall: bool = opt(True, _flag(),
                             "measure the recall@k of a hashed search on a seeded sample of the "
                             "queries (2 %, 50 to 500 of them, answered by the exact scan too; "
                             "in results.json and `lshdist info`), and with --mode auto, where it "
                             "falls short of the target, calibrate again on the queries or answer "
                             "by the scan; --no-check-recall trusts the calibration's estimate")
    query_chunk: int = opt(10_000, POSITIVE, "at most this many queries per task, fewer for a "
                           "large k (a segment's partial answer kept under 16 MiB; a shard of "
                           "the queries is split into equal pieces; with two chunks in flight "
                           "per worker, this bounds the query memory)", metavar="n")
    probe: int | None = opt(None, _optional(POSITIVE),
                            "subspace index: groups searched per query (default: the index's)",
                            metavar="N")
    candidates: int | None = opt(None, _optional(POSITIVE),
                                 "subspace index: members re-ranked per probed group (default: "
                                 "the index's); --mode rank: rows re-ranked per hyperplane, "
                                 "shared by the segments in proportion to their rows (default "
                                 "500)", metavar="H")


@dataclass(frozen=True)
class ClusterConfig(Section):
    """Where the job runs (the ``cluster:`` section; the cluster options of every Dask job)."""

    scheduler: str | None = opt(None, _optional(_string()),
                                "an existing Dask scheduler (default: start a LocalCluster)",
                                metavar="tcp://HOST:PORT")
    workers: int = opt(2, POSITIVE, "LocalCluster worker processes, one thread each")
    connect_timeout: float = opt(10.0, _float(), "seconds to wait for --scheduler",
                                 metavar="SECONDS")
    in_process: bool = opt(False, _flag(), "run the LocalCluster's workers as threads of "
                                           "this process")
    stall_timeout: float = opt(600.0, _float(),
                               "fail the job when no task finishes for this many seconds "
                               "(a frozen worker; a frozen scheduler: --heartbeat-timeout)",
                               metavar="SECONDS")
    heartbeat_timeout: float = opt(30.0, _float(),
                                   "fail the job when the Dask scheduler has not answered for "
                                   "this many seconds (asked every 5 s; a frozen scheduler is "
                                   "found without waiting for --stall-timeout, while long tasks "
                                   "on a scheduler that answers run on)", metavar="SECONDS")
    kind: str | None = opt(None, _optional(_choice(*CLUSTER_KINDS)),
                           "local: a LocalCluster on this machine; slurm: worker jobs submitted "
                           "through dask-jobqueue (`pip install lshdist[deploy]`); kubernetes: "
                           "the scheduler of the DaskJob this runs in ($DASK_SCHEDULER_ADDRESS) "
                           "(default: local, or the --scheduler given)", flag="--cluster")
    listen: str = opt("127.0.0.1", _string(),
                      "the address a LocalCluster's scheduler, workers and dashboard listen on "
                      "(loopback: nothing is reachable from other machines)", metavar="HOST")
    jobqueue: str | None = opt(None, _optional(_string()),
                               "--cluster slurm: a dask-jobqueue YAML file (its jobqueue.slurm "
                               "section; default: dask's own config, ~/.config/dask/)",
                               metavar="YAML")
    tls_ca_file: str | None = opt(None, _optional(_string()),
                                  "tls:// schedulers: the CA certificate that signed the "
                                  "cluster's certificates (default: dask config "
                                  "distributed.comm.tls.ca-file)", metavar="PEM")
    tls_cert: str | None = opt(None, _optional(_string()),
                               "tls:// schedulers: this client's certificate (default: dask "
                               "config distributed.comm.tls.client.cert)", metavar="PEM")
    tls_key: str | None = opt(None, _optional(_string()),
                              "tls:// schedulers: this client's private key (default: dask "
                              "config distributed.comm.tls.client.key, or in --tls-cert)",
                              metavar="PEM")

    def __post_init__(self) -> None:
        if self.scheduler and self.kind not in (None, "local"):
            raise InputError(f"--scheduler connects to an existing cluster and --cluster "
                             f"{self.kind} starts one; give one of them")

    @property
    def resolved_kind(self) -> str:
        """``scheduler`` (an existing one), ``local``, ``slurm`` or ``kubernetes``."""
        return "scheduler" if self.scheduler else (self.kind or "local")


@dataclass(frozen=True)
class EvaluateConfig(Section):
    """What ``lshdist run`` reports (the ``evaluate:`` section)."""

    ks: tuple[int, ...] = opt((1, 4), _int_list(), "k of the k-NN accuracies", cli=False)
    recall_k: int = opt(10, POSITIVE, "recall@K", cli=False)
    plots: bool = opt(False, _flag(), "write the accuracy and recall plots", cli=False)


@dataclass(frozen=True)
class ActiveConfig(Section):
    """Pool-based active learning with hashed hyperplane queries (``lshdist active``)."""

    methods: str = opt("h-hash,eh-hash,exhaustive,random", _string(),
                       "selection methods, comma-separated: h-hash, eh-hash, exhaustive, "
                       "random", metavar="LIST")
    rounds: int = opt(300, POSITIVE, "selection rounds per run")
    runs: int = opt(5, POSITIVE, "runs (different initial labelled sets)")
    initial: int = opt(5, POSITIVE, "labelled examples per class to start from", metavar="n")
    bits: int = opt(1024, _int(2, MAX_BITS), "b, bits per hash key (even for h-hash)",
                    metavar="b")
    search: str = opt("rank", _choice("rank", "lists"),
                      "how the hashing methods find candidates: rank (every key's angle score, "
                      "the --candidates smallest re-ranked) or lists (the permutation lists, "
                      "--permutations and --window)")
    candidates: int = opt(500, POSITIVE, "search rank: pool rows re-ranked per hyperplane (the "
                          "paper's N rho)", metavar="n")
    permutations: int = opt(64, _int(1, MAX_PERMUTATIONS), "search lists: M, permutation-sorted "
                            "lists", metavar="M")
    window: int = opt(8, POSITIVE, "search lists: W, list entries taken on each side of a "
                      "query", metavar="W")
    eh_samples: int | None = opt(None, _optional(POSITIVE),
                                 "eh-hash: t samples of the query embedding (default exact)",
                                 metavar="t")
    eh_terms: int | None = opt(None, _optional(_int(0)),
                               "eh-hash: every pool row and hyperplane normal hashed over its m "
                               "largest entries, at most m (m + 1) / 2 pairs x bits each (0: "
                               "every entry, nnz (nnz + 1) / 2 pairs; default 64 for sparse "
                               "pools, every entry for dense ones)", metavar="m")
    C: float = opt(1.0, _float(), "the linear SVMs' C", flag="--svm-c")
    svm_scale: str = opt("rms", _choice("rms", "none"),
                         "rows as the SVMs see them: rms (scaled by one factor to unit root-mean-"
                         "square norm over a pool sample, so C means the same on any data; "
                         "unit-norm tf-idf rows are unchanged) or none (as given)", metavar="S")
    class_weight: str = opt("balanced", _choice("balanced", "none"),
                            "the binary SVMs' class weights: balanced (positives weighted by "
                            "negatives/positives) or none", metavar="W")
    classes: int | None = opt(None, _optional(_int(2)),
                              "run the one-vs-all problems of the first n classes only "
                              "(default all)", metavar="n")
    eval_every: int = opt(1, POSITIVE, "evaluate the test AUROC and accuracy every n rounds "
                          "(and at the last); selection runs every round", metavar="n")
    center: bool = opt(True, _flag(), "hash the pool rows centred on the pool mean (dense "
                       "pools; sparse rows are hashed as given), with the bias feature at the "
                       "rows' RMS norm: pixels all lie in one narrow cone, which random "
                       "projections barely tell apart (CLI: --no-center hashes them as given)")
    seed: int = opt(0, SEED, "seed of the initial sets, hash functions and permutations")
    distributed: bool = opt(False, _flag(), "hash the pool on the cluster (the cluster options; "
                            "default a LocalCluster) and select with tasks, the pool's rows "
                            "held by the workers; dense pools.  Default: everything in this "
                            "process")

    def __post_init__(self) -> None:
        names = tuple(m.strip() for m in self.methods.split(","))
        known = ("h-hash", "eh-hash", "exhaustive", "random")
        if not all(names) or any(m not in known for m in names) or len(set(names)) < len(names):
            raise InputError(f"methods={self.methods!r}: a comma-separated list of distinct "
                             f"methods among {', '.join(known)}")

    @property
    def method_list(self) -> tuple[str, ...]:
        return tuple(m.strip() for m in self.methods.split(","))


@dataclass(frozen=True)
class DataSpec(Section):
    """One split of the ``data:`` section: files to ingest, or a built-in dataset."""

    inputs: tuple[str, ...] | None = opt(None, _optional(_str_list()), "input files")
    format: str | None = opt(None, _optional(_string()), "input format (default: detected)")
    rows: tuple[int, int] | None = opt(None, _optional(_rows()), "rows [START, STOP] of the input")
    shard_rows: int = opt(10_000, POSITIVE, "rows per dataset shard")
    text: bool = opt(False, _flag(), "tab-separated text with a category column (tf-idf)")
    builtin: str | None = opt(None, _optional(_choice("digits")), "a built-in dataset")

    def __post_init__(self) -> None:
        if (self.inputs is None) == (self.builtin is None):
            raise InputError("a data split needs exactly one of 'inputs' (files) or 'builtin'")


def _date() -> Rule:
    desc = "a date YYYY-MM-DD"

    def check(v: Any) -> str:
        if isinstance(v, datetime.date) and not isinstance(v, datetime.datetime):
            return v.isoformat()  # YAML reads 2026-11-21 as a date
        try:
            return datetime.date.fromisoformat(str(v)).isoformat()
        except ValueError:
            raise _Bad(desc) from None

    return Rule(desc, check, str)


DATE = _date()


@dataclass(frozen=True)
class PathsConfig(Section):
    """The artefacts of a batch job (``jobs/*.py``, the ``paths:`` section).  Relative paths
    are relative to the job's workdir; outputs must stay inside it (`JobConfig.output`)."""

    model: str | None = opt(None, _optional(_string()), "the model (input)")
    data: str | None = opt(None, _optional(_string()), "the dataset to index (input)")
    index: str | None = opt(None, _optional(_string()), "the index (output of build_index and "
                                                       "daily_append, input of bulk_query)")
    queries: str | None = opt(None, _optional(_string()), "the queries dataset (input)")
    results: str | None = opt(None, _optional(_string()), "the query results (output)")


@dataclass(frozen=True)
class DailyConfig(Section):
    """The scheduled append (``jobs/daily_append.py``, the ``daily:`` section)."""

    input: str | None = opt(None, _optional(_string()),
                            "the day's input files: a path or glob with {day} (YYYY-MM-DD)")
    format: str | None = opt(None, _optional(_string()), "input format (default: detected)")
    shard_rows: int = opt(10_000, POSITIVE, "rows per shard of the day's dataset")
    epoch: str = opt("2020-01-01", DATE, "day 0 of the id numbering")
    id_stride: int = opt(10_000_000, POSITIVE,
                         "ids of day D are (D - epoch) * id_stride + row: unique per day, the "
                         "same on a re-run; a day may not have more rows than this")
    lock_timeout: float = opt(600.0, _float(0.0, open_lo=False),
                              "seconds a second run waits for a running one, then exits 2",
                              metavar="SECONDS")
    compact_min_segments: int = opt(20, NONNEG,
                                    "compact the index when it has at least this many small "
                                    "segments (0: never)")
    compact_segment_rows: int = opt(100_000, POSITIVE,
                                    "segments below this are small; compaction merges them "
                                    "into segments of at most this many rows")


@dataclass(frozen=True)
class JobConfig:
    """A batch job (``jobs/build_index.py``, ``daily_append.py``, ``bulk_query.py``)."""

    workdir: Path
    path: Path  # the config file itself (named in messages)
    allow_outside_workdir: bool = False
    paths: PathsConfig = field(default_factory=PathsConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    query: QueryConfig = field(default_factory=QueryConfig)
    daily: DailyConfig = field(default_factory=DailyConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def _given(self, name: str) -> str:
        value = getattr(self.paths, name)
        if value is None:
            raise InputError(f"config {str(self.path)!r}: this job needs paths.{name}")
        return str(value)

    def input(self, name: str) -> Path:
        """``paths.<name>`` (relative to the workdir)."""
        return self.workdir / self._given(name)

    def output(self, name: str) -> Path:
        """``paths.<name>`` inside the workdir; an absolute path or one that leaves the
        workdir (``..``, a symlink) is refused unless ``allow_outside_workdir: true``."""
        return self.inside(self._given(name), f"paths.{name}")

    def inside(self, rel: str | Path, what: str) -> Path:
        """``workdir / rel``, checked to stay in the workdir (see `output`)."""
        out = self.workdir / rel
        root = self.workdir.resolve()
        if not self.allow_outside_workdir and not out.resolve().is_relative_to(root):
            raise InputError(
                f"config {str(self.path)!r}: {what} {str(rel)!r} is outside the workdir "
                f"{str(self.workdir)!r}; give a path inside it, or set "
                "'allow_outside_workdir: true' to write there")
        return out


@dataclass(frozen=True)
class RunConfig:
    """A whole ``lshdist run`` job."""

    workdir: Path
    train: DataSpec
    test: DataSpec
    name: str = ""
    learn: LearnConfig = field(default_factory=LearnConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    query: QueryConfig = field(default_factory=QueryConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    #: an active-learning run (``active:`` section): the train split is the pool, the test
    #: split the test rows; learn, index, query and evaluate do not apply
    active: ActiveConfig | None = None


# --------------------------------------------------------------------------------------------
# building sections from flags and from mappings


def _fields(cls: type[Section]) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if "rule" in f.metadata]


def _flag_name(f: dataclasses.Field[Any]) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def _default_text(f: dataclasses.Field[Any]) -> str:
    d = f.default
    if d is None:
        return ""
    if isinstance(d, bool):
        return ""
    if isinstance(d, tuple):
        d = ",".join(map(str, d))
    return f" (default {d})"


def add_options(parser: argparse.ArgumentParser, cls: type[Section], *, title: str | None = None,
                skip: Sequence[str] = ()) -> None:
    """Add the CLI options of section ``cls`` to ``parser`` (in an argument group if ``title``).

    Defaults are not set in argparse (`argparse.SUPPRESS`): `from_args` takes them from the
    dataclass, and knows which options the user gave.
    """
    target: argparse.ArgumentParser | argparse._ArgumentGroup = (
        parser.add_argument_group(title) if title else parser)
    for f in _fields(cls):
        if not f.metadata["cli"] or f.name in skip:
            continue
        rule: Rule = f.metadata["rule"]
        help_text = (f.metadata["help"] + _default_text(f)).replace("%", "%%")
        if rule.describe == "true or false":
            if f.default is True:  # on by default: the flag turns it off
                target.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name,
                                    action="store_false", default=argparse.SUPPRESS,
                                    help=help_text)
            else:
                target.add_argument(_flag_name(f), dest=f.name, action="store_true",
                                    default=argparse.SUPPRESS, help=help_text)
            continue
        target.add_argument(_flag_name(f), dest=f.name, type=cli_type(rule, _flag_name(f)),
                            default=argparse.SUPPRESS, help=help_text,
                            metavar=f.metadata["metavar"] or (
                                "{" + ",".join(rule.choices) + "}" if rule.choices
                                else f.name.upper()))


def cli_type(rule: Rule, flag: str) -> Callable[[str], Any]:
    """An argparse ``type=`` that reads and checks a flag's text with ``rule``."""
    def convert(text: str) -> Any:
        try:
            return rule.from_text(text)
        except _Bad as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {exc}") from None

    convert.__name__ = flag  # argparse names the type in its own messages
    return convert


def from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Section ``cls`` from parsed flags (options not given keep the dataclass defaults;
    ``given_`` names those the user gave)."""
    names = {f.name for f in _fields(cls)}
    values = {k: v for k, v in vars(args).items() if k in names}
    return cls(**values, given_=frozenset(values))


def from_mapping(cls: type[T], values: Any, *, where: str) -> T:
    """Section ``cls`` from a YAML mapping; unknown keys and bad values are `InputError`s."""
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise InputError(f"{where}: expected a mapping of options, got {type(values).__name__} "
                         f"{values!r}")
    fields_ = {f.name: f for f in _fields(cls)}
    unknown = sorted(set(values) - set(fields_))
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r}; allowed keys: "
                         f"{', '.join(sorted(fields_))}")
    out = {}
    for key, value in values.items():
        rule: Rule = fields_[key].metadata["rule"]
        try:
            out[key] = rule.check(value)
        except _Bad as exc:
            raise InputError(f"{where}.{key}: expected {exc}, got {value!r}") from None
    try:
        return cls(**out, given_=frozenset(out))
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


_RUN_SECTIONS = {"name", "workdir", "cluster", "data", "learn", "index", "query", "evaluate",
                 "active"}
_JOB_SECTIONS = {"workdir", "allow_outside_workdir", "paths", "index", "query", "daily",
                 "cluster"}


def _read_yaml(path: str | os.PathLike[str], sections: set[str]) -> tuple[dict[str, Any], str]:
    """A job file's top-level mapping (``${VAR}`` expanded from the environment) and its name
    for messages; unknown sections and a missing workdir are `InputError`s."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"config {str(p)!r} does not exist; give the path of a YAML file "
                         "(examples in configs/)")
    try:
        raw = yaml.safe_load(os.path.expandvars(p.read_text()))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise InputError(f"config {str(p)!r} is not valid YAML: {exc}") from None
    where = f"config {str(p)!r}"
    if not isinstance(raw, dict):
        raise InputError(f"{where} must be a mapping of sections "
                         f"({', '.join(sorted(sections))})")
    unknown = sorted(set(raw) - sections)
    if unknown:
        raise InputError(f"{where}: unknown sections {unknown}; known: {sorted(sections)}")
    if "workdir" not in raw:
        raise InputError(f"{where} needs a 'workdir' section")
    if not isinstance(raw["workdir"], str) or not raw["workdir"]:
        raise InputError(f"{where}.workdir: expected a directory path, got {raw['workdir']!r}")
    if "${" in raw["workdir"]:
        raise InputError(f"{where}.workdir: {raw['workdir']!r} uses an unset environment "
                         "variable; set it (configs/jobs/ use LSHDIST_WORKDIR)")
    return raw, where


def load_run_config(path: str | os.PathLike[str]) -> RunConfig:
    """A `RunConfig` from a YAML file; ``${VAR}`` is expanded from the environment."""
    raw, where = _read_yaml(path, _RUN_SECTIONS)
    if "data" not in raw:
        raise InputError(f"{where} needs a 'data' section")
    data = raw["data"]
    if not isinstance(data, dict) or set(data) != {"train", "test"}:
        got = sorted(data) if isinstance(data, dict) else data
        raise InputError(f"{where}.data: expected exactly the keys 'train' and 'test', got {got!r}")
    if "${" in yaml.safe_dump(data) or "$" in "".join(
            str(x) for s in data.values() if isinstance(s, dict) for x in (s.get("inputs") or [])):
        raise InputError(f"{where} uses an unset environment variable in data "
                         "(is LSHDIST_DATA_DIR set? `make demo` sets it)")
    name = raw.get("name", "")
    if not isinstance(name, str):
        raise InputError(f"{where}.name: expected a string, got {name!r}")
    if "active" in raw:
        other = sorted({"learn", "index", "query", "evaluate"} & set(raw))
        if other:
            raise InputError(f"{where}: an 'active' run takes no {other} section(s) (active "
                             "learning hashes the pool itself); remove them, or the 'active' "
                             "section for a k-NN run")
    return RunConfig(
        workdir=_workdir(raw["workdir"], where), name=name,
        train=from_mapping(DataSpec, data["train"], where=f"{where}.data.train"),
        test=from_mapping(DataSpec, data["test"], where=f"{where}.data.test"),
        learn=from_mapping(LearnConfig, raw.get("learn"), where=f"{where}.learn"),
        index=from_mapping(IndexConfig, raw.get("index"), where=f"{where}.index"),
        query=from_mapping(QueryConfig, raw.get("query"), where=f"{where}.query"),
        evaluate=from_mapping(EvaluateConfig, raw.get("evaluate"), where=f"{where}.evaluate"),
        cluster=from_mapping(ClusterConfig, raw.get("cluster"), where=f"{where}.cluster"),
        active=None if "active" not in raw else from_mapping(ActiveConfig, raw["active"],
                                                              where=f"{where}.active"),
    )


def _workdir(value: Any, where: str) -> Path:
    """A config's ``workdir``: a local (or shared) directory -- a run keeps its stages' state
    and plots there; an object-storage URL would become a local folder named ``s3:``."""
    text = str(value)
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:/", text) and not text.startswith("file:"):
        raise InputError(f"{where}.workdir: {text!r} is a URL; a run's workdir is a local or "
                         "shared directory (object storage serves the single jobs: ingest, "
                         "learn, index, query with s3://... paths)")
    return Path(text.removeprefix("file://"))


def load_job_config(path: str | os.PathLike[str]) -> JobConfig:
    """A `JobConfig` (a batch job of ``jobs/``) from a YAML file; ``${VAR}`` is expanded."""
    raw, where = _read_yaml(path, _JOB_SECTIONS)
    outside = raw.get("allow_outside_workdir", False)
    if not isinstance(outside, bool):
        raise InputError(f"{where}.allow_outside_workdir: expected true or false, got "
                         f"{outside!r}")
    return JobConfig(
        workdir=_workdir(raw["workdir"], where), path=Path(path), allow_outside_workdir=outside,
        paths=from_mapping(PathsConfig, raw.get("paths"), where=f"{where}.paths"),
        index=from_mapping(IndexConfig, raw.get("index"), where=f"{where}.index"),
        query=from_mapping(QueryConfig, raw.get("query"), where=f"{where}.query"),
        daily=from_mapping(DailyConfig, raw.get("daily"), where=f"{where}.daily"),
        cluster=from_mapping(ClusterConfig, raw.get("cluster"), where=f"{where}.cluster"),
    )
