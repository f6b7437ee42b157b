"""The local Hub server's Xet CAS: xorbs and file reconstructions, kept on disk.

What the CAS service of the Xet protocol keeps (api.md): xorbs by hash (each verified against
its body on upload), and for each file uploaded through a shard, its reconstruction terms. A
shard is accepted only if every term names a xorb the CAS holds, within its chunks, with the
verification hash of those chunks, and if the file's chunks hash to its file hash; the file is
then rebuilt from the xorbs and its sha256 checked against the shard's metadata. The rebuilt
bytes are kept by sha256 (the Hub's commit names Xet files by sha256, as LFS did).
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from .xet_format import XetFormatError, file_hash, hash_hex, hex_hash, merkle_root, parse_shard, parse_xorb, \
    read_chunks, verification_hash


class XetStore:
    def __init__(self, root: Path, put_blob):
        self.root = Path(root) / "xet"
        for sub in ("xorbs", "files", "by-sha256"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.put_blob = put_blob  # (bytes) -> the blob record; the Hub's own store, by sha256
        self.lock = threading.Lock()

    # -- xorbs ---------------------------------------------------------------------------------
    def xorb_path(self, xorb: str) -> Path:
        return self.root / "xorbs" / f"{xorb}.xorb"

    def xorb_chunks(self, xorb: str) -> list[list] | None:
        """[chunk hash hex, byte start, byte end, size] for each chunk of a stored xorb."""
        index = self.root / "xorbs" / f"{xorb}.json"
        return json.loads(index.read_text()) if index.is_file() else None

    def put_xorb(self, xorb: str, body: bytes) -> bool:
        chunks = parse_xorb(body)
        got = hash_hex(merkle_root([(c.hash, c.size) for c in chunks]))
        if got != xorb:
            raise XetFormatError(f"xorb hash mismatch: the body hashes to {got}, the path says {xorb}")
        with self.lock:
            if self.xorb_chunks(xorb) is not None:
                return False
            tmp = self.xorb_path(xorb).with_suffix(f".{threading.get_ident()}.tmp")
            tmp.write_bytes(body)
            tmp.replace(self.xorb_path(xorb))
            index = [[hash_hex(c.hash), c.start, c.end, c.size] for c in chunks]
            _write_json(self.root / "xorbs" / f"{xorb}.json", index)  # last: a xorb is present once indexed
        return True

    def read_xorb(self, xorb: str, start: int, end: int) -> bytes:
        """Bytes [start, end] (inclusive, as url_range) of a stored xorb."""
        with open(self.xorb_path(xorb), "rb") as fh:
            fh.seek(start)
            return fh.read(end - start + 1)

    # -- files ---------------------------------------------------------------------------------
    def file_record(self, file_id: str) -> dict | None:
        path = self.root / "files" / f"{file_id}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def file_by_sha256(self, sha256: str) -> str | None:
        path = self.root / "by-sha256" / sha256
        return path.read_text() if path.is_file() else None

    def put_shard(self, body: bytes, require_sha256: bool = True) -> int:
        """Verify a shard and record its files; returns how many were new."""
        files, xorbs = parse_shard(body)
        for info in xorbs:  # the xorbs it lists must be the ones the CAS holds, chunk for chunk
            key = hash_hex(info.hash)
            held = self.xorb_chunks(key)
            if held is None:
                raise XetFormatError(f"the shard lists xorb {key}, which was not uploaded")
            if [(h, s) for h, _, _, s in held] != [(hash_hex(h), size) for h, _, size in info.chunks]:
                raise XetFormatError(f"the shard's chunks of xorb {key} differ from the xorb's")
        new = 0
        for f in files:
            file_id = hash_hex(f.hash)
            chunks, terms = [], []
            for t in f.terms:
                key = hash_hex(t.xorb)
                held = self.xorb_chunks(key)
                if held is None:
                    raise XetFormatError(f"file {file_id}: a term names xorb {key}, which the CAS does not hold")
                if t.end > len(held):
                    raise XetFormatError(f"file {file_id}: chunks [{t.start}, {t.end}) of xorb {key}, which has "
                                         f"{len(held)}")
                span = held[t.start:t.end]
                hashes = [hex_hash(h) for h, _, _, _ in span]
                if sum(c[3] for c in span) != t.unpacked:
                    raise XetFormatError(f"file {file_id}: a term's size {t.unpacked} is not its chunks'")
                if t.verification is None:
                    raise XetFormatError(f"file {file_id}: no verification entries")
                if verification_hash(hashes) != t.verification:
                    raise XetFormatError(f"file {file_id}: a term's verification hash does not match xorb {key}")
                chunks += [(h, c[3]) for h, c in zip(hashes, span)]
                terms.append([key, t.start, t.end, t.unpacked])
            if file_hash(chunks) != f.hash:
                raise XetFormatError(f"file {file_id}: its chunks hash to {hash_hex(file_hash(chunks))}")
            if f.sha256 is None and require_sha256:
                raise XetFormatError(f"file {file_id}: no sha256 metadata (required for a repository)")
            if self.file_record(file_id) is not None:
                continue
            data = self.reconstruct(terms)
            sha256 = hashlib.sha256(data).hexdigest()
            # (the sha256 is stored as hashes are: its hex read as four little-endian words)
            if f.sha256 is not None and hash_hex(f.sha256) != sha256:
                raise XetFormatError(f"file {file_id}: its sha256 metadata is not the sha256 of its content")
            self.put_blob(data)
            with self.lock:
                (self.root / "by-sha256" / sha256).write_text(file_id)
                _write_json(self.root / "files" / f"{file_id}.json",
                            {"size": len(data), "sha256": sha256, "terms": terms})
            new += 1
        return new

    def reconstruct(self, terms: list[list]) -> bytes:
        out = bytearray()
        for xorb, start, end, _ in terms:
            held = self.xorb_chunks(xorb)
            raw = self.read_xorb(xorb, held[start][1], held[end - 1][2] - 1)
            for _, data in read_chunks(raw, start, end - start):
                out += data
        return bytes(out)

    def reconstruction(self, file_id: str, rng: tuple[int, int] | None, base_url: str, v2: bool = False) -> dict:
        """The QueryReconstructionResponse (v1) or its v2 form for a file, or a byte range of it
        (``rng`` inclusive, already checked against the size)."""
        record = self.file_record(file_id)
        first, last = rng if rng else (0, record["size"] - 1)
        terms, fetch, offset_into_first, at = [], {}, 0, 0
        for xorb, start, end, _ in record["terms"]:
            held = self.xorb_chunks(xorb)
            # the chunks of this term that overlap [first, last]
            lo = hi = None
            for i in range(start, end):
                size = held[i][3]
                if at + size > first and at <= last:
                    if lo is None:
                        lo = i
                        if not terms:
                            offset_into_first = first - at
                    hi = i + 1
                at += size
            if lo is None:
                continue
            terms.append({"hash": xorb, "unpacked_length": sum(held[i][3] for i in range(lo, hi)),
                          "range": {"start": lo, "end": hi}})
            url = f"{base_url}/transfer/xorbs/default/{xorb}"
            b0, b1 = held[lo][1], held[hi - 1][2] - 1
            if v2:
                fetch.setdefault(xorb, []).append({"url": url, "ranges": [
                    {"chunks": {"start": lo, "end": hi}, "bytes": {"start": b0, "end": b1}}]})
            else:
                fetch.setdefault(xorb, []).append({"range": {"start": lo, "end": hi}, "url": url,
                                                   "url_range": {"start": b0, "end": b1}})
        key = "xorbs" if v2 else "fetch_info"
        return {"offset_into_first_range": offset_into_first, "terms": terms, key: fetch}


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)
