"""Artefacts on object storage, against a real S3 server on 127.0.0.1 (moto's): the stores
read and write ``s3://`` as they do local paths; conditional writes commit an index's manifest;
a damaged object is refused; a missing bucket, wrong credentials or a missing back end are one
line, with nothing written anywhere."""

import json
import threading

import numpy as np
import pytest

from lshdist.errors import FormatError, InputError, OutputExistsError
from lshdist.store.atomic import artefact_kind, check_output
from lshdist.store.dataset import Dataset, write_dataset
from lshdist.store.index import ABSENT, read_manifest_tagged
from lshdist.store.objects import (
    CommitConflict,
    ObjectPath,
    as_path,
    check_bucket,
    is_url,
)


def _fs():
    return ObjectPath("s3://x/y").fs


def test_urls_and_paths(bucket, tmp_path):
    p = as_path(f"{bucket}/run/tr")
    assert isinstance(p, ObjectPath) and str(p) == f"{bucket}/run/tr"
    assert p.name == "tr" and str(p.parent) == f"{bucket}/run"
    assert str(p / "zarr.json") == f"{bucket}/run/tr/zarr.json"
    assert as_path(f"file://{tmp_path}") == tmp_path and not is_url(str(tmp_path))
    with pytest.raises(InputError, match="this operation needs a local path"):
        open(p)  # noqa: SIM115 -- an os call on an object path fails loudly


def test_a_dataset_round_trips_bit_for_bit(bucket, tmp_path):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(1000, 7)).astype(np.float32)
    y = rng.integers(0, 4, 1000)
    write_dataset(f"{bucket}/d", X, y=y, shard_rows=300)
    write_dataset(tmp_path / "d", X, y=y, shard_rows=300)
    remote, local = Dataset(f"{bucket}/d"), Dataset(tmp_path / "d")
    assert remote.attrs == local.attrs  # same checksums, shard for shard
    for i in range(remote.n_shards):
        np.testing.assert_array_equal(remote.read_shard(i), local.read_shard(i))
    assert artefact_kind(f"{bucket}/d") == "lshdist-dataset"


def test_a_flipped_byte_in_a_dataset_object_is_refused(bucket):
    X = np.random.default_rng(4).normal(size=(400, 5)).astype(np.float32)
    write_dataset(f"{bucket}/d", X, shard_rows=200)
    fs = _fs()
    key = f"{bucket.removeprefix('s3://')}/d/X/c/1/0"
    data = bytearray(fs.cat_file(key))
    data[len(data) // 2] ^= 0x10
    fs.pipe_file(key, bytes(data))
    ds = Dataset(f"{bucket}/d")
    ds.read_shard(0)
    with pytest.raises(FormatError, match=r"shard 1 .*does not match its checksum"):
        ds.read_shard(1)


def test_outputs_are_checked_before_anything_is_written(bucket, s3_server, monkeypatch):
    X = np.zeros((10, 2), np.float32)
    write_dataset(f"{bucket}/d", X)
    with pytest.raises(OutputExistsError, match="already exists; choose another path or pass"):
        check_output(f"{bucket}/d", False)
    with pytest.raises(OutputExistsError, match="it is an lshdist dataset, and this job writes an "
                                                "lshdist model"):
        check_output(f"{bucket}/d", True, kind="lshdist-model")
    _fs().pipe_file(f"{bucket.removeprefix('s3://')}/d/NOTES.txt", b"mine")
    with pytest.raises(OutputExistsError, match=r"it holds 'NOTES\.txt', which lshdist did not"):
        check_output(f"{bucket}/d", True, kind="lshdist-dataset")
    with pytest.raises(InputError, match="the bucket 'no-such-bucket' does not exist; create it"):
        check_bucket("s3://no-such-bucket/x")
    with pytest.raises(InputError, match="would overwrite the input"):
        check_output(f"{bucket}/d/sub", False, inputs=(f"{bucket}/d",))


@pytest.fixture(scope="module")
def s3_with_auth():
    """A second moto server that checks credentials (IAM on): its first requests, without
    credentials, make a user with full S3 access and its key; every later one must sign with a
    valid key.  Yields ``(endpoint, key, secret, bucket)``."""
    import os
    import socket
    import subprocess
    import sys
    import time

    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "5"}
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        kw = {"endpoint_url": endpoint, "region_name": "us-east-1",
              "aws_access_key_id": "any", "aws_secret_access_key": "any"}
        iam = boto3.client("iam", **kw)
        iam.create_user(UserName="lshdist")
        key = iam.create_access_key(UserName="lshdist")["AccessKey"]
        iam.put_user_policy(UserName="lshdist", PolicyName="all", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        boto3.client("s3", **{**kw, "aws_access_key_id": key["AccessKeyId"],
                              "aws_secret_access_key": key["SecretAccessKey"]}
                     ).create_bucket(Bucket="guarded")
        yield endpoint, key["AccessKeyId"], key["SecretAccessKey"], "guarded"
    finally:
        proc.terminate()
        proc.wait(10)


def test_wrong_credentials_are_one_line_and_right_ones_work(s3_with_auth, monkeypatch):
    endpoint, key, secret, name = s3_with_auth
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    check_bucket(f"s3://{name}/x")  # the right key passes
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(InputError, match=f"access to 's3://{name}' was denied .*check the "
                                         "credentials"):
        check_bucket(f"s3://{name}/x")
    with pytest.raises(InputError, match="was denied"):
        write_dataset(f"s3://{name}/d", np.zeros((4, 2), np.float32))


def test_an_unreachable_endpoint_is_one_line(monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("LSHDIST_STORAGE_OPTIONS", json.dumps({"config_kwargs": {
        "connect_timeout": 1, "retries": {"max_attempts": 1}}}))
    with pytest.raises(InputError, match=r"cannot reach the object store for 's3://b' .*"
                                         r"AWS_ENDPOINT_URL"):
        check_bucket("s3://b/x")


def test_storage_options_must_be_an_object(monkeypatch):
    from lshdist.store.objects import storage_options

    monkeypatch.setenv("LSHDIST_STORAGE_OPTIONS", "[1, 2]")
    with pytest.raises(InputError, match="is list, expected a JSON object"):
        storage_options()
    monkeypatch.setenv("LSHDIST_STORAGE_OPTIONS", "{nope")
    with pytest.raises(InputError, match="is not JSON"):
        storage_options()


def test_conditional_writes_let_one_writer_win(bucket):
    p = ObjectPath(f"{bucket}/obj")
    p.put(b"a", if_none_match=True)
    with pytest.raises(CommitConflict, match="was written by another job meanwhile"):
        p.put(b"b", if_none_match=True)
    tag = p.etag()
    p.put(b"c", if_match=tag)
    with pytest.raises(CommitConflict):
        p.put(b"d", if_match=tag)  # stale: another write landed
    assert p.read_bytes() == b"c"


def test_racing_manifest_commits_lose_nothing(bucket, monkeypatch):
    """Eight threads each add one entry to a shared list by read -- conditional write -- retry
    on conflict (what an append does with its segments): every entry is there at the end."""
    root = ObjectPath(f"{bucket}/log")
    (root / "list.json").put(b"[]", if_none_match=True)

    def add(i):
        while True:
            tag = (root / "list.json").etag()
            items = json.loads((root / "list.json").read_bytes())
            try:
                (root / "list.json").put(json.dumps([*items, i]).encode(), if_match=tag)
                return
            except CommitConflict:
                continue

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(json.loads((root / "list.json").read_bytes())) == list(range(8))


def test_manifest_tags_follow_commits(bucket):
    from lshdist.store.index import manifest_tag

    assert manifest_tag(f"{bucket}/idx") == ABSENT
    with pytest.raises(InputError, match="does not exist; build it with `lshdist index`"):
        read_manifest_tagged(f"{bucket}/idx")


def test_memory_urls_need_no_server():
    X = np.arange(12, dtype=np.float32).reshape(6, 2)
    write_dataset("memory://lshdist-test/d", X, shard_rows=4)
    np.testing.assert_array_equal(Dataset("memory://lshdist-test/d").read_shard(1), X[4:])
    ObjectPath("memory://lshdist-test/d").rmtree()
    assert not ObjectPath("memory://lshdist-test/d").exists()


def test_a_missing_dataset_or_a_foreign_prefix_is_named(bucket):
    with pytest.raises(InputError, match=r"dataset 's3://[^']+/none' does not exist"):
        Dataset(f"{bucket}/none")
    ObjectPath(f"{bucket}/other/file.txt").write_text("not a dataset")
    with pytest.raises(FormatError, match=r"is not a Zarr v3 group \(no zarr\.json\)"):
        Dataset(f"{bucket}/other")


def test_a_chunk_object_replaced_by_a_huge_one_is_refused_unread(bucket):
    """A chunk may hold its array's chunk bytes and what a codec adds: an object of 8 MiB in
    place of a 200 x 5 float32 chunk is refused after one ranged GET of that bound."""
    X = np.random.default_rng(5).normal(size=(400, 5)).astype(np.float32)
    write_dataset(f"{bucket}/d", X, shard_rows=200)
    _fs().pipe_file(f"{bucket.removeprefix('s3://')}/d/X/c/1/0", bytes(8 << 20))
    ds = Dataset(f"{bucket}/d")
    np.testing.assert_array_equal(ds.read_shard(0), X[:200])
    with pytest.raises(FormatError, match=r"X/c/1/0' holds more than the [\d,]+ bytes it may"):
        ds.read_shard(1)


def test_an_objects_age_is_read_from_what_each_back_end_says():
    import datetime

    from lshdist.store.objects import _written

    t = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc).timestamp()
    utc = datetime.timezone.utc
    assert _written({"LastModified": datetime.datetime.fromtimestamp(t, utc)}) == t
    assert _written({"updated": "2026-01-02T03:04:05Z"}) == t  # GCS
    assert _written({"last_modified": "2026-01-02T03:04:05+00:00"}) == t  # Azure
    assert _written({"mtime": t}) == t and _written({"size": 3}) is None
    p = ObjectPath("memory://lshdist-test/aged/x")
    p.write_bytes(b"1")
    assert 0 <= p.parent.age() < 60
    assert ObjectPath("memory://lshdist-test/none").age() is None
