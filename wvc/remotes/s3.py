"""An object-storage bucket as a remote (``s3://bucket/prefix``): AWS S3, MinIO, Cloudflare
R2, Ceph, or anything else that speaks the S3 protocol.

The layout under the prefix is the one every remote has (remotes/interface.py). Endpoint,
region and credentials come from the standard AWS configuration (``AWS_ENDPOINT_URL``,
``AWS_REGION``, ``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``, the shared config files), read by
boto3 itself, which is imported only when an s3 remote is used. boto3 also retries 5xx
and throttling answers with exponential back-off ("standard" retry mode).

Refs move by compare-and-swap with S3 conditional writes: a new ref is written with
``If-None-Match: *``, an existing one with ``If-Match: <the ETag read with the state>``,
and a deleted one deleted with ``If-Match``. Each ref is its own compare-and-swap (as in
git); a push moves one. An endpoint that rejects conditional writes is refused with a
message: without them two pushers could silently overwrite each other.

Objects are written before refs and are immutable (named by their hash), so an
interrupted push leaves the remote valid and the next push finishes it. Packs above
``MULTIPART_THRESHOLD`` go up as multipart uploads with parts sent in parallel; an upload
interrupted by a kill is found again by its key (a pack's name is its checksum, so a
retried push writes the same key) and only its missing parts are sent.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .. import settings
from ..errors import RemoteChanged, RemoteError, RemoteFileTooLarge
from .interface import (Listing, Backend, TransientError, content_size, local_write_errors, retries_reads,
                        upload_progress)

MULTIPART_THRESHOLD = 64 << 20
PART_BYTES = 16 << 20  # S3 wants parts of at least 5 MiB (but the last) and at most 10,000 of them
PART_WORKERS = 4
MIN_PART = 5 << 20  # S3's smallest part but the last
FIRST_PAGE = 16  # a listing's first page: the keys before the attic's (README.md), then where it starts
MAX_COPY_PART = 5 << 30  # S3's largest part
MAX_ATTEMPTS = 8  # per request, with boto3's exponential back-off between them
_CONDITIONAL_UNSUPPORTED = {"NotImplemented", "InvalidArgument", "InvalidRequest"}


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" or "some/prefix/"


def _client():
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise RemoteError("s3:// remotes need boto3: pip install 'wvc[s3]'") from exc
    # The standard AWS settings win where the user gave them (AWS_MAX_ATTEMPTS,
    # AWS_RETRY_MODE, or the config file); otherwise back off and retry a few more times
    # than boto3's default, since a push is worth finishing.
    retries = {"mode": settings.text("AWS_RETRY_MODE", "standard")}
    if not settings.is_set("AWS_MAX_ATTEMPTS"):
        retries["max_attempts"] = MAX_ATTEMPTS
    return boto3.client("s3", config=Config(retries=retries, max_pool_connections=2 * PART_WORKERS + 2))


@contextlib.contextmanager
def s3_errors(what: str):
    """Client and transport failures as one RemoteError line (never a credential)."""
    from botocore import exceptions as bx

    try:
        yield
    except bx.ClientError as exc:
        raise _client_error(what, exc) from exc
    except bx.NoCredentialsError as exc:
        raise RemoteError(f"{what}: no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                          "or AWS_PROFILE)") from exc
    except (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError, bx.ConnectionClosedError,
            bx.ResponseStreamingError, bx.IncompleteReadError) as exc:
        raise TransientError(f"{what}: cannot reach the S3 endpoint, or it broke off ({type(exc).__name__})") from exc
    except bx.BotoCoreError as exc:
        raise RemoteError(f"{what}: S3 client error ({type(exc).__name__})") from exc


class S3RequestError(RemoteError):
    """An S3 request the endpoint refused; ``code`` and ``status`` are what it answered."""

    def __init__(self, message: str, code: str = "", status: int | None = None):
        super().__init__(message)
        self.code, self.status = code, status


class _NotFound(S3RequestError):
    pass


def _client_error(what: str, exc) -> RemoteError:
    code = exc.response.get("Error", {}).get("Code", "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code == "PreconditionFailed" or status == 412:
        return RemoteChanged(f"{what}: the remote changed while pushing (another push won); fetch and retry")
    if code in ("NoSuchKey", "404") or (status == 404 and code != "NoSuchBucket"):
        return _NotFound(f"{what}: not found", code, status)
    if code == "NoSuchBucket":
        message = f"{what}: the bucket does not exist (wvc does not create buckets)"
    elif code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled") or status == 403:
        message = f"{what}: access denied (HTTP {status}, {code}); check the credentials and the bucket policy"
    elif code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException") \
            or status == 301:
        message = f"{what}: the bucket is in another region ({code}); set AWS_REGION to the bucket's region"
    else:
        message = f"{what}: S3 error HTTP {status} {code}".rstrip()
    return S3RequestError(message, code, status)


class _CopyMismatch(Exception):
    """A server-side copy did not hold the client's bytes (see S3Backend.compose)."""


def _md5_of(fh, length: int) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    while length > 0:
        block = fh.read(min(length, 1 << 20))
        if not block:
            break
        digest.update(block)
        length -= len(block)
    return digest.hexdigest()


def compose_parts(pieces: list, size: int, etags: dict) -> list[tuple]:
    """A multipart upload of a file made of ``pieces`` (Backend.compose): ``("copy", source,
    offset, length, position, etag)`` for a range of a source whose ETag is known (it was
    downloaded and checked) long enough to be a part, ``("send", start, end)`` for bytes sent
    from the client's copy. Every part but the last is at least MIN_PART bytes: a range sent
    between two copies borrows the head of the next copy to reach it (or absorbs the copy)."""
    parts: list[tuple] = []
    pending = position = 0  # [pending, position) is to be sent

    def flush(end: int, last: bool = False) -> None:
        nonlocal pending
        while end - pending > (0 if last else MIN_PART - 1):
            step = end - pending if end - pending < PART_BYTES + MIN_PART else PART_BYTES
            parts.append(("send", pending, pending + step))
            pending += step

    for piece in pieces:
        if isinstance(piece, bytes):
            position += len(piece)
            continue
        source, offset, length = piece
        owed = position - pending
        borrow = MIN_PART - owed if 0 < owed < MIN_PART else 0
        if source in etags and length - borrow >= MIN_PART:
            flush(position + borrow)
            copied, at = length - borrow, position + borrow
            count = -(-copied // MAX_COPY_PART)
            for k in range(count):  # even parts, each between MIN_PART and MAX_COPY_PART
                lo, hi = copied * k // count, copied * (k + 1) // count
                parts.append(("copy", source, offset + borrow + lo, hi - lo, at + lo, etags[source]))
            position += length
            pending = position
        else:
            position += length
    if position != size:
        raise RemoteError("a compaction recipe does not add up to its pack's size")
    flush(position, last=True)
    return parts


class S3Backend(Backend):
    def __init__(self, location: S3Location, layout):
        self.location, self.layout = location, layout
        self.url = f"s3://{location.bucket}/{location.prefix}".rstrip("/")
        self.client = _client()
        self._count_lock = threading.Lock()  # parts are sent from several threads
        self._downloaded: dict = {}  # handle -> ETag of each file download() fetched whole

    def _key(self, path: str) -> str:
        return self.location.prefix + path

    def _what(self, path: str = "") -> str:
        return f"{self.url}/{path}" if path else self.url

    # -- reading -----------------------------------------------------------------------------
    def _list(self) -> dict[str, str]:
        """path (under the prefix) -> ETag of every object but the attic's (``layout.attic``).
        Keys are listed in byte order, so the attic's come together, after the few that sort
        before "attic/" (README.md). The first page asks for FIRST_PAGE keys, so that where
        the attic starts is found without listing it (a first page of 1,000 held 1,000 of its
        keys whenever it held 1,000: ~300 KB a push, the grace hour's retired files); at its
        first key the listing goes on after its last (``StartAfter`` "attic0": "0" follows
        "/"): two requests, whatever the attic holds."""
        out = {}
        n, attic = len(self.location.prefix), self._key(self.layout.attic)
        where = {"Bucket": self.location.bucket, "Prefix": self.location.prefix}

        def pages(**after):
            return self.client.get_paginator("list_objects_v2").paginate(**where, **after)

        with s3_errors(self._what()):
            first = self.client.list_objects_v2(**where, MaxKeys=FIRST_PAGE)
            listing = iter(first.get("Contents", ()))
            if first.get("IsTruncated"):
                rest = (o for page in pages(ContinuationToken=first["NextContinuationToken"]) for o in page.get("Contents", ()))
                listing = itertools.chain(listing, rest)
            for obj in listing:
                if obj["Key"].startswith(attic):
                    out.update((o["Key"][n:], o["ETag"]) for page in pages(StartAfter=attic[:-1] + "0")
                               for o in page.get("Contents", ()))
                    break
                out[obj["Key"][n:]] = obj["ETag"]
        return out

    def _get(self, path: str, byte_range: str | None = None, handle=None):
        """GetObject; a retired pack or catalog (``handle``'s file) that moved since it was
        listed is read from the attic."""
        kwargs = {"Range": byte_range} if byte_range else {}
        try:
            with s3_errors(self._what(path)):
                return self.client.get_object(Bucket=self.location.bucket, Key=self._key(path), **kwargs)
        except _NotFound:
            if handle is None or not self.layout.movable(handle):
                raise
        with s3_errors(self._what(path)):
            return self.client.get_object(Bucket=self.location.bucket, Key=self._key(self.layout.attic_path(handle)),
                                          **kwargs)

    def _read_upto(self, path: str, n: int, handle=None) -> tuple[bytes, str]:
        """At most ``n`` bytes from the start of a file, and its ETag (the Range bounds what
        the endpoint sends, and the read bounds what is kept even if it ignores the Range)."""
        resp = self._get(path, f"bytes=0-{n - 1}", handle)
        with s3_errors(self._what(path)):
            data = resp["Body"].read(n)
            resp["Body"].close()
        if len(data) < min(n, resp.get("ContentLength", 0)):  # cut short: not the object's fault
            raise TransientError(f"{self._what(path)}: the body was cut short ({len(data)} of "
                                 f"{resp.get('ContentLength')} bytes)")
        self.bytes_downloaded += len(data)
        return data, resp.get("ETag", "")

    keeps_marker = True

    def write_new(self, handle, data: bytes) -> None:
        self._put(self.layout.path(handle), data, if_none_match=True, exist_ok=True)

    @retries_reads
    def listing(self) -> Listing:
        listing = self._list()
        files, tokens = {}, {}
        for path in self.layout.check_ref_count(self.url, listing):
            try:
                files[path], tokens[path] = self._read_upto(path, self.layout.max_ref_bytes + 1)
            except _NotFound:  # deleted since the listing (push --delete): not a ref any more
                continue
        refs = self.layout.parse_refs(files)
        # Listed again after the refs were read: a push uploads its catalog and pack before it
        # moves a ref, so a ref read here may name a commit whose catalog the first listing
        # predates (a pusher then saw "remote is missing commit" and, retrying against busy
        # pushers and gc, starved). Objects only appear before the refs that need them, so
        # this listing holds every catalog the refs read above rely on.
        listing = self._list()
        version = hashlib.sha256(repr(sorted(tokens.items())).encode()).hexdigest()
        return Listing(refs, version, frozenset(listing), {r: tokens[r] for r in refs})

    @retries_reads
    def read(self, handle, limit: int) -> bytes | None:
        path = self.layout.path(handle)
        try:
            data, _ = self._read_upto(path, limit + 1, handle)
        except _NotFound:
            return None
        if len(data) > limit:
            raise RemoteFileTooLarge(f"remote file {path} is larger than allowed")
        return data

    @retries_reads
    def download(self, handle, dest: Path, limit: int) -> None:
        path = self.layout.path(handle)
        resp = self._get(path, None, handle)
        if resp.get("ContentLength", 0) > limit:
            resp["Body"].close()
            raise RemoteFileTooLarge(f"remote file {path} is larger than allowed")
        total = 0
        with s3_errors(self._what(path)), local_write_errors(dest), open(dest, "wb") as fh:
            for block in resp["Body"].iter_chunks(1 << 20):
                total += len(block)
                if total > limit:
                    raise RemoteFileTooLarge(f"remote file {path} is larger than allowed")
                fh.write(block)
        if total != resp.get("ContentLength", total):
            raise TransientError(f"{self._what(path)}: the body was cut short ({total} of {resp['ContentLength']} bytes)")
        self.bytes_downloaded += total
        if resp.get("ETag"):
            self._downloaded[handle] = resp["ETag"]

    @retries_reads
    def read_range(self, handle, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        path = self.layout.path(handle)
        resp = self._get(path, f"bytes={offset}-{offset + length - 1}", handle)
        if not resp.get("ContentRange") and offset != 0:
            resp["Body"].close()
            raise RemoteError(f"{self._what(path)}: the endpoint ignored a range request; refusing to download "
                              f"the whole file for {length} bytes")
        with s3_errors(self._what(path)):
            data = resp["Body"].read(length)
            resp["Body"].close()
        if len(data) != length:
            if len(data) < resp.get("ContentLength", 0):
                raise TransientError(f"{self._what(path)}: the body was cut short")
            raise RemoteError(f"remote file {path} is shorter than its index says")
        self.bytes_downloaded += len(data)
        return data

    # -- writing -----------------------------------------------------------------------------
    def _put(self, path: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False,
             exist_ok: bool = False) -> None:
        kwargs = {}
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        try:
            with s3_errors(self._what(path)):
                self.client.put_object(Bucket=self.location.bucket, Key=self._key(path), Body=data, **kwargs)
        except RemoteChanged:
            if exist_ok:
                return
            raise
        except S3RequestError as exc:
            if kwargs and (exc.status == 501 or exc.code in _CONDITIONAL_UNSUPPORTED):
                raise RemoteError(f"{self.url}: the endpoint refuses conditional writes (If-Match / If-None-Match), "
                                  "which wvc needs to move refs safely; refusing to push (two pushers could "
                                  "overwrite each other's work)") from exc
            raise
        self.bytes_uploaded += len(data)

    def _exists(self, path: str, size: int | None) -> bool:
        try:
            with s3_errors(self._what(path)):
                head = self.client.head_object(Bucket=self.location.bucket, Key=self._key(path))
        except _NotFound:
            return False
        return size is None or head.get("ContentLength") == size

    def delete(self, handles, *, in_attic: bool = False) -> None:
        for handle in handles:
            path = (self.layout.attic_path if in_attic else self.layout.path)(handle)
            with s3_errors(self._what(path)):
                self.client.delete_object(Bucket=self.location.bucket, Key=self._key(path))

    moves_retired = True  # a server-side copy into the attic, then a delete: no byte sent

    def move_to_attic(self, handles) -> None:
        bucket = self.location.bucket
        for handle in handles:
            path = self.layout.path(handle)
            try:
                with s3_errors(self._what(path)):
                    # (CopyObject takes at most 5 GB: a larger pack stays listed, retired by its record)
                    self.client.copy_object(Bucket=bucket, Key=self._key(self.layout.attic_path(handle)),
                                            CopySource={"Bucket": bucket, "Key": self._key(path)})
            except _NotFound:
                continue  # moved already, or purged
            with s3_errors(self._what(path)):
                self.client.delete_object(Bucket=bucket, Key=self._key(path))

    def attic_names(self, kind: str) -> list[str]:
        under = self._key(self.layout.attic_folder(kind))
        with s3_errors(self._what()):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.location.bucket, Prefix=under)
            return [o["Key"][len(under):] for page in pages for o in page.get("Contents", ()) if "/" not in o["Key"][len(under):]]

    def publish(self, files, refs, expected: Listing, message: str, delete=(), progress=None) -> None:
        progress = upload_progress(progress, files)
        for handle, content in files.items():  # objects first: immutable, so an existing one is kept
            path = self.layout.path(handle)
            size = content_size(content)
            progress.advance(size)
            if self._exists(path, size):
                continue
            if isinstance(content, bytes):
                self._put(path, content)
            elif size > MULTIPART_THRESHOLD:
                self._multipart(path, Path(content), size)
            else:
                self._put(path, Path(content).read_bytes())
        progress.close()
        for ref, target in refs.items():  # then each ref, compare-and-swap against what we read
            token = expected.tokens.get(ref)
            if target is None:
                if token is None:
                    continue
                with s3_errors(self._what(ref)):
                    self.client.delete_object(Bucket=self.location.bucket, Key=self._key(ref), IfMatch=token)
            elif token is None:
                if ref in expected.refs:
                    raise RemoteChanged(f"{self._what(ref)}: no compare-and-swap token for an existing ref")
                self._put(ref, (target + "\n").encode(), if_none_match=True)
            else:
                self._put(ref, (target + "\n").encode(), if_match=token)

    def _multipart(self, path: str, source: Path, size: int) -> None:
        """Upload ``source`` in parts, in parallel; resume an upload of the same key that a
        killed push left, sending only the parts it lacks (compared by MD5)."""
        key, bucket = self._key(path), self.location.bucket
        part_bytes = max(PART_BYTES, -(-size // 10_000))
        count = -(-size // part_bytes)
        with s3_errors(self._what(path)):
            upload_id, done = self._resumable_upload(key)
            if upload_id is None:
                upload_id = self.client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]

            def send(number: int) -> dict:
                with open(source, "rb") as fh:
                    fh.seek((number - 1) * part_bytes)
                    data = fh.read(part_bytes)
                etag = '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'
                if done.get(number) == etag:
                    return {"PartNumber": number, "ETag": etag}
                with s3_errors(self._what(path)):
                    sent = self.client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                                   Body=data)
                with self._count_lock:
                    self.bytes_uploaded += len(data)
                return {"PartNumber": number, "ETag": sent["ETag"]}

            with ThreadPoolExecutor(PART_WORKERS, thread_name_prefix="wvc-s3-part") as pool:
                parts = list(pool.map(send, range(1, count + 1)))
            self.client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})

    # -- composing (compaction's merged packs, remotes/compaction.py) ---------------------------
    composes = True  # UploadPartCopy: ranges of the remote's own packs become parts without being sent

    def compose(self, handle, pieces: list, expected: tuple[str, int], local: Path) -> int | None:
        """See Backend.compose: a multipart upload whose parts are server-side copies
        (UploadPartCopy) of the ranges long enough to be a part (S3: at least 5 MiB but the
        last), the rest sent from ``local``. A copied part must come back with the ETag of
        the bytes the client has at that place (S3 and its clones give a copied part the MD5
        of its bytes); otherwise (a source changed, or an endpoint whose ETags are not MD5s:
        SSE-KMS) the upload is aborted and None returned, so the verified local file is sent
        whole. Copies are also made only if the source still has the ETag it was downloaded
        with (``CopySourceIfMatch``)."""
        size, path = expected[1], self.layout.path(handle)
        parts = compose_parts(pieces, size, dict(self._downloaded))
        if not any(kind == "copy" for kind, *_ in parts) or len(parts) > 10_000:
            return None
        if self._exists(path, size):
            return 0
        key, bucket = self._key(path), self.location.bucket
        with s3_errors(self._what(path)):
            upload_id = self.client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        sent = copied = 0

        def send(numbered) -> dict:
            nonlocal sent, copied
            number, (kind, *where) = numbered
            if kind == "send":
                start, end = where
                with open(local, "rb") as fh:
                    fh.seek(start)
                    data = fh.read(end - start)
                with s3_errors(self._what(path)):
                    etag = self.client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                                   Body=data)["ETag"]
                with self._count_lock:
                    sent += len(data)
                return {"PartNumber": number, "ETag": etag}
            source, offset, length, at, source_etag = where
            with open(local, "rb") as fh:  # what the copy must hold: the client's own bytes there
                fh.seek(at)
                want = _md5_of(fh, length)
            source_path = self.layout.path(source)
            try:
                with s3_errors(self._what(source_path)):
                    result = self.client.upload_part_copy(
                        Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                        CopySource={"Bucket": bucket, "Key": self._key(source_path)},
                        CopySourceRange=f"bytes={offset}-{offset + length - 1}", CopySourceIfMatch=source_etag)
            except RemoteChanged as exc:  # 412: the source is no longer what was downloaded
                raise _CopyMismatch(source) from exc
            etag = result["CopyPartResult"]["ETag"]
            if etag.strip('"') != want:
                raise _CopyMismatch(source)
            with self._count_lock:
                copied += length
            return {"PartNumber": number, "ETag": etag}

        try:
            with ThreadPoolExecutor(PART_WORKERS, thread_name_prefix="wvc-s3-part") as pool:
                done = list(pool.map(send, enumerate(parts, 1)))
            with s3_errors(self._what(path)):
                self.client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                                      MultipartUpload={"Parts": done})
        except _CopyMismatch:
            self._abort(key, upload_id)
            return None
        except BaseException:
            self._abort(key, upload_id)
            raise
        if not self._exists(path, size):
            raise RemoteError(f"remote pack {path} did not come out as composed (its size differs)")
        self.bytes_uploaded += sent
        self.bytes_copied += copied
        return sent

    def _abort(self, key: str, upload_id: str) -> None:
        with contextlib.suppress(Exception):  # best effort: an unfinished upload is invisible and expires
            self.client.abort_multipart_upload(Bucket=self.location.bucket, Key=key, UploadId=upload_id)

    def _resumable_upload(self, key: str) -> tuple[str | None, dict[int, str]]:
        uploads = self.client.list_multipart_uploads(Bucket=self.location.bucket, Prefix=key).get("Uploads", [])
        mine = [u for u in uploads if u["Key"] == key]
        if not mine:
            return None, {}
        upload_id = mine[-1]["UploadId"]
        done = {}
        for page in self.client.get_paginator("list_parts").paginate(Bucket=self.location.bucket, Key=key,
                                                                     UploadId=upload_id):
            done.update((p["PartNumber"], p["ETag"]) for p in page.get("Parts", ()))
        return upload_id, done
