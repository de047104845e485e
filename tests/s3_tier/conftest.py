"""Fixtures of the S3 tier tests: one real Ceph RADOS Gateway for the session, stopped after.

The cluster starts on first use (about 3 s on 2 cores) and is shared by every S3 test; each
test writes under a prefix of its own. Tests that kill or stop ``radosgw`` bring it back
before they end (:func:`rgw_faults`). Without the Ceph programs the tests skip (fail under
``CI``), see :func:`_ceph.need_ceph`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from _ceph import ACCESS_KEY, SECRET_KEY, CephS3


@pytest.fixture(scope="session")
def ceph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CephS3]:
    cluster = CephS3(tmp_path_factory.mktemp("ceph"))
    print(f"\nceph: mon + memstore osd + radosgw up in {cluster.start_seconds:.1f} s")
    yield cluster
    cluster.stop()


@pytest.fixture
def s3_env(ceph: CephS3, monkeypatch: pytest.MonkeyPatch) -> CephS3:
    """The test user's credentials in the standard AWS variables (as a deployment sets them)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/kvo-tests")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/kvo-tests")
    return ceph


@pytest.fixture
def prefix() -> str:
    """A prefix of the test's own in the shared bucket."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def rgw_faults(ceph: CephS3) -> Iterator[CephS3]:
    """The cluster, for a test that kills or stops radosgw: running again afterwards."""
    yield ceph
    ceph.ensure_rgw()
