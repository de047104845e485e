"""The S3 requests the tier makes, each bounded, each through the endpoint's circuit breaker.

One boto3 client (thread-safe; its connection pool sized to the tier's threads) with the
SDK's ``standard`` retry mode: a 5xx, a ``SlowDown``/503, a throttle or a dropped connection
is retried with jittered exponential backoff, at most ``max_attempts`` attempts, each bounded
by ``connect_timeout_s`` and ``timeout_s``. What still fails after that is classified:

* the endpoint down, hung or overloaded (connection errors, timeouts, 5xx): the breaker
  opens and later requests fail at once (:class:`Unavailable`) until a trial succeeds;
* a refusal (403, a missing bucket, a quota): that request fails (:class:`Refused`), the
  breaker is not touched (the store answers).

The SDK's own request checksums are off (``when_required``): every object carries the
tier's XXH3 checksum or MAC, checked on every read, and a second checksum per PUT costs
CPU the cascade needs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .breaker import CircuitBreaker
from .settings import S3TierSettings

__all__ = ["Listed", "Refused", "S3Store", "StoreFailed", "Unavailable", "error_code"]

logger = logging.getLogger("kv_offload.s3_tier")

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


class S3Store:
    def __init__(self, settings: S3TierSettings, *, max_attempts: int | None = None) -> None:
        s = settings
        self.settings = s
        self.where = s.where
        session = boto3.session.Session(profile_name=s.profile)
        connections = s.io_threads + s.lookup_threads + 2
        self.client = session.client(
            "s3",
            endpoint_url=s.endpoint_url,
            region_name=s.region or session.region_name or "us-east-1",
            verify=s.verify,
            config=Config(
                s3={"addressing_style": s.addressing_style},
                retries={"mode": "standard", "max_attempts": max_attempts or s.max_attempts},
                connect_timeout=s.connect_timeout_s,
                read_timeout=s.timeout_s,
                max_pool_connections=connections,
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        self.breaker = CircuitBreaker(s.retry_after_s, s.max_retry_after_s)
        self._lock = threading.Lock()
        #: requests that failed after their retries, by kind
        self.unavailable_errors = 0
        self.refused_errors = 0

    # -- one request, classified ----------------------------------------------------------

    def _call(self, what: str, operation: str, **kwargs: Any) -> Any:
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

    def _down(self, what: str, why: str) -> None:
        with self._lock:
            self.unavailable_errors += 1
        if self.breaker.failure():
            logger.warning(
                "%s: %s failed (%s); failing fast until it answers", self.where, what, why
            )
        raise Unavailable(f"{what}: {self.where} did not answer ({why})")

    def _refused(self, what: str, exc: ClientError) -> Refused:
        code, status = error_code(exc)
        with self._lock:
            self.refused_errors += 1
        return Refused(f"{what}: {self.where} refused it ({code or status})")

    # -- the requests ---------------------------------------------------------------------

    def put(self, name: str, body: bytes) -> None:
        """One PUT of the whole object."""
        try:
            self._call("PUT", "put_object", Bucket=self.settings.bucket, Key=name, Body=body)
        except ClientError as exc:
            raise self._refused("PUT", exc) from None

    def put_multipart(self, name: str, parts: Sequence[bytes | memoryview]) -> None:
        """A multipart upload of ``parts`` in order; aborted (best effort) if a part fails."""
        bucket = self.settings.bucket
        try:
            upload = self._call(
                "multipart create", "create_multipart_upload", Bucket=bucket, Key=name
            )["UploadId"]
        except ClientError as exc:
            raise self._refused("multipart create", exc) from None
        try:
            done = []
            for number, part in enumerate(parts, start=1):
                answer = self._call(
                    "multipart part", "upload_part", Bucket=bucket, Key=name, UploadId=upload,
                    PartNumber=number, Body=bytes(part),
                )  # fmt: skip
                done.append({"ETag": answer["ETag"], "PartNumber": number})
            self._call(
                "multipart complete", "complete_multipart_upload", Bucket=bucket, Key=name,
                UploadId=upload, MultipartUpload={"Parts": done},
            )  # fmt: skip
        except (ClientError, StoreFailed) as exc:
            try:
                self.client.abort_multipart_upload(Bucket=bucket, Key=name, UploadId=upload)
            except (ClientError, BotoCoreError) as abort:
                logger.debug("%s: abort of upload %s failed: %s", self.where, name, abort)
            if isinstance(exc, ClientError):
                raise self._refused("multipart upload", exc) from None
            raise

    def get(self, name: str) -> bytes | None:
        """The object's bytes, or ``None`` if it is not there."""
        try:
            answer = self._call("GET", "get_object", Bucket=self.settings.bucket, Key=name)
            body = answer["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()
        except ClientError as exc:
            if error_code(exc)[0] in MISSING:
                return None
            raise self._refused("GET", exc) from None
        except BotoCoreError as exc:  # the body's read timed out or was cut
            self._down("GET body", f"{type(exc).__name__}: {exc}")
            raise  # pragma: no cover - _down raises

    def exists(self, name: str) -> bool:
        """HEAD: whether the object is there (a refusal counts as absent)."""
        try:
            self._call("HEAD", "head_object", Bucket=self.settings.bucket, Key=name)
        except ClientError as exc:
            if error_code(exc)[0] not in MISSING:
                logger.debug("%s: HEAD %s refused: %s", self.where, name, exc)
            return False
        return True

    def delete_many(self, names: Sequence[str]) -> list[str]:
        """Batch DELETE (1,000 names a request); the names that could not be deleted."""
        failed: list[str] = []
        for start in range(0, len(names), 1000):
            chunk = names[start : start + 1000]
            try:
                answer = self._call(
                    "DELETE", "delete_objects", Bucket=self.settings.bucket,
                    Delete={"Objects": [{"Key": n} for n in chunk], "Quiet": True},
                )  # fmt: skip
            except (ClientError, StoreFailed) as exc:
                logger.debug("%s: batch delete failed: %s", self.where, exc)
                failed.extend(chunk)
                continue
            failed.extend(str(e.get("Key")) for e in answer.get("Errors", ()))
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
