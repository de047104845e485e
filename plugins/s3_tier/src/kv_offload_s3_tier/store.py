"""The S3 requests the tier makes, each bounded, each through the endpoint's circuit breaker.

Two clients, each where it measured or checks best (README, "Client"):

* every block's request (PUT, multipart upload, GET, HEAD, batch DELETE) goes through
  ``obstore`` (Rust's ``object_store``: the GIL released for the whole request, 1.3-2.5x
  boto3's throughput at a quarter to a half of its CPU per GB in ``benchmarks/s3_tier.py``),
  with ``max_attempts`` attempts of jittered exponential backoff on a 5xx, a ``SlowDown``/503,
  a timeout or a dropped connection, each bounded by ``connect_timeout_s`` and ``timeout_s``;
* what runs once, at build (the checks of :mod:`.probe`, listing the prefix), goes through
  boto3: its errors carry S3's exact codes (``NoSuchBucket``, ``AccessDenied`` per operation,
  412 / 501 of a conditional PUT) that the build's ``ConfigError`` names, and boto3's
  credential chain (environment, ``profile``, SSO, instance role) signs both clients' requests.

What still fails after the retries is classified:

* the endpoint down, hung or overloaded (connection errors, timeouts, 5xx): the breaker
  opens and later requests fail at once (:class:`Unavailable`) until a trial succeeds;
* a refusal (403, a missing bucket, a quota): that request fails (:class:`Refused`), the
  breaker is not touched (the store answered).

boto3's own request checksums are off (``when_required``): every object carries the tier's
XXH3 checksum or MAC, checked on every read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import obstore
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from kv_offload.tiering import CircuitBreaker
from obstore.exceptions import BaseError, NotFoundError, PermissionDeniedError, UnauthenticatedError
from obstore.store import S3Store as ObjectStore

from .settings import S3TierSettings

if TYPE_CHECKING:
    from obstore.store import ClientConfig

__all__ = ["Listed", "Refused", "S3Store", "StoreFailed", "Unavailable", "error_code"]

logger = logging.getLogger("kv_offload.s3_tier")

#: obstore's "not there" (a builtin FileNotFoundError, its deprecated NotFoundError) and
#: "refused" (403 and 401; a builtin PermissionError in some operations).
MISSING_ERRORS = (FileNotFoundError, NotFoundError)
REFUSED_ERRORS = (PermissionError, PermissionDeniedError, UnauthenticatedError)
#: Error codes that mean "this object is not there".
MISSING = frozenset({"NoSuchKey", "404", "NotFound"})


class StoreFailed(Exception):
    """A request failed after the client's bounded retries; the message says why."""


class Unavailable(StoreFailed):
    """The endpoint is down, hung or overloaded (the breaker is open or just opened)."""


class Refused(StoreFailed):
    """The store answered and refused the request (permission, quota, missing bucket)."""


def error_code(exc: ClientError) -> tuple[str, int]:
    """The S3 error code and HTTP status of ``exc``."""
    response: dict[str, Any] = exc.response
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


@dataclass(frozen=True)
class Listed:
    """One object found by listing the prefix."""

    name: str
    size: int
    modified: float  # seconds since the epoch (the store's LastModified)


class _SessionCredentials:
    """obstore's credential provider: boto3's chain (environment, profile, SSO, role), its
    temporary credentials asked again every few minutes (boto3 refreshes them)."""

    REFRESH = timedelta(minutes=5)

    def __init__(self, session: boto3.session.Session) -> None:
        self._session = session

    def __call__(self) -> Any:
        credentials = self._session.get_credentials()
        if credentials is None:
            raise RuntimeError("no AWS credentials (environment, profile or role)")
        frozen = credentials.get_frozen_credentials()
        temporary = frozen.token is not None
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.now(timezone.utc) + self.REFRESH if temporary else None,
        }


class S3Store:
    """``data_path=False``: the boto3 client only (the build's checks, before credentials
    are known to work)."""

    def __init__(
        self, settings: S3TierSettings, *, max_attempts: int | None = None, data_path: bool = True
    ) -> None:
        s = settings
        self.settings = s
        self.where = s.where
        session = boto3.session.Session(profile_name=s.profile)
        region = s.region or session.region_name or "us-east-1"
        attempts = max_attempts or s.max_attempts
        connections = s.io_threads + s.lookup_threads + 2
        self.client = session.client(
            "s3",
            endpoint_url=s.endpoint_url,
            region_name=region,
            verify=s.verify,
            config=Config(
                s3={"addressing_style": s.addressing_style},
                retries={"mode": "standard", "max_attempts": attempts},
                connect_timeout=s.connect_timeout_s,
                read_timeout=s.timeout_s,
                max_pool_connections=connections,
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        self.objects: ObjectStore | None = None
        if data_path:
            self.objects = self._object_store(session, region, attempts, connections)
        self.breaker = CircuitBreaker(s.retry_after_s, s.max_retry_after_s)
        self._lock = threading.Lock()
        #: requests that failed after their retries, by kind
        self.unavailable_errors = 0
        self.refused_errors = 0

    def _object_store(
        self, session: boto3.session.Session, region: str, attempts: int, connections: int
    ) -> ObjectStore:
        s = self.settings
        options: ClientConfig = {
            "connect_timeout": timedelta(seconds=s.connect_timeout_s),
            "read_timeout": timedelta(seconds=s.timeout_s),
            "pool_max_idle_per_host": str(connections),
        }
        if s.endpoint_url is not None and s.endpoint_url.startswith("http://"):
            options["allow_http"] = True
        if s.verify is False:
            options["allow_invalid_certificates"] = True
        elif isinstance(s.verify, str):
            options["root_certificate"] = Path(s.verify).read_text()
        endpoint = {} if s.endpoint_url is None else {"endpoint": s.endpoint_url}
        # every attempt bounded: connect + a read timeout per read of a body, retries included
        budget = attempts * (s.connect_timeout_s + s.timeout_s) + attempts * 0.5
        return ObjectStore(
            s.bucket,
            region=region,
            virtual_hosted_style_request=s.addressing_style == "virtual",
            credential_provider=_SessionCredentials(session),
            client_options=options,
            retry_config={
                "max_retries": attempts - 1,
                "backoff": {
                    "init_backoff": timedelta(milliseconds=50),
                    "max_backoff": timedelta(seconds=0.5),
                    "base": 2,
                },
                "retry_timeout": timedelta(seconds=budget),
            },
            **endpoint,  # type: ignore[arg-type]
        )

    # -- one request, classified ----------------------------------------------------------

    def _call(self, what: str, operation: str, **kwargs: Any) -> Any:
        """One boto3 request (the build's and the listing's)."""
        if not self.breaker.allow():
            raise Unavailable(f"{self.where} is down; retrying later")
        try:
            answer = getattr(self.client, operation)(**kwargs)
        except ClientError as exc:
            code, status = error_code(exc)
            if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "RequestTimeout"):
                self._down(what, f"{code or status} after retries")
            self.breaker.success()  # it answered: the endpoint is up
            raise
        except BotoCoreError as exc:  # connection refused/reset, timeouts, DNS
            self._down(what, f"{type(exc).__name__}: {exc}")
        self.breaker.success()
        return answer

    def _request(self, what: str, call: Callable[[ObjectStore], Any]) -> Any:
        """One obstore request (a block's), classified: "not there" (:data:`MISSING_ERRORS`)
        passes through, a refusal is :class:`Refused`, anything else after the retries
        :class:`Unavailable`."""
        if self.objects is None:
            raise RuntimeError("this S3Store has no data path (data_path=False)")
        if not self.breaker.allow():
            raise Unavailable(f"{self.where} is down; retrying later")
        try:
            answer = call(self.objects)
        except MISSING_ERRORS:
            self.breaker.success()
            raise
        except REFUSED_ERRORS as exc:
            self.breaker.success()
            with self._lock:
                self.refused_errors += 1
            raise Refused(f"{what}: {self.where} refused it ({_first_line(exc)})") from None
        except (BaseError, OSError) as exc:  # connection, timeout, 5xx (after the retries)
            self._down(what, _first_line(exc))
        self.breaker.success()
        return answer

    def _down(self, what: str, why: str) -> None:
        with self._lock:
            self.unavailable_errors += 1
        if self.breaker.failure():
            logger.warning(
                "%s: %s failed (%s); failing fast until it answers", self.where, what, why
            )
        raise Unavailable(f"{what}: {self.where} did not answer ({why})")

    # -- the requests ---------------------------------------------------------------------

    def put(self, name: str, body: bytes) -> None:
        """One PUT of the whole object."""
        self._request("PUT", lambda o: obstore.put(o, name, body, use_multipart=False))

    def put_multipart(self, name: str, body: bytes, part_bytes: int) -> None:
        """A multipart upload of ``body`` in parts of ``part_bytes`` (obstore aborts the
        upload if a part fails)."""
        self._request(
            "multipart upload",
            lambda o: obstore.put(
                o, name, body, use_multipart=True, chunk_size=part_bytes, max_concurrency=2
            ),
        )

    def get(self, name: str) -> memoryview | None:
        """The object's bytes (a view of obstore's buffer: no copy), or ``None`` if it is
        not there."""
        try:
            return memoryview(self._request("GET", lambda o: obstore.get(o, name).bytes()))
        except MISSING_ERRORS:
            return None

    def exists(self, name: str) -> bool:
        """HEAD: whether the object is there (a refusal counts as absent)."""
        try:
            self._request("HEAD", lambda o: obstore.head(o, name))
        except MISSING_ERRORS:
            return False
        except Refused as exc:
            logger.debug("%s: HEAD %s refused: %s", self.where, name, exc)
            return False
        return True

    def delete_many(self, names: Sequence[str]) -> list[str]:
        """Batch DELETE (obstore sends S3's DeleteObjects, 1,000 names a request); the names
        that could not be deleted (all of a batch that failed)."""
        failed: list[str] = []
        for start in range(0, len(names), 1000):
            chunk = list(names[start : start + 1000])
            try:
                self._request("DELETE", lambda o, chunk=chunk: obstore.delete(o, chunk))  # type: ignore[misc]
            except MISSING_ERRORS:
                continue  # gone already
            except StoreFailed as exc:
                logger.debug("%s: batch delete failed: %s", self.where, exc)
                failed.extend(chunk)
        return failed

    def list_prefix(self, prefix: str) -> Iterator[Listed]:
        """Every object under ``prefix`` (ListObjectsV2, 1,000 a page)."""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.settings.bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call("LIST", "list_objects_v2", **kwargs)
            for item in page.get("Contents", ()):
                yield Listed(str(item["Key"]), int(item["Size"]), item["LastModified"].timestamp())
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    def close(self) -> None:
        self.client.close()


def _first_line(exc: BaseException) -> str:
    """obstore's messages carry the whole error chain over many lines; the first names it."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
