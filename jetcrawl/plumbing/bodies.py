"""Page bodies: a digest as WARC writes it, and the ``crawl_bodies`` object store.

A body is stored once per (fingerprint, digest) under the name ``<fp>/<digest>``, so a re-crawl
that finds the same content stores nothing new, and a result record carries only the name. The
object store chunks what it stores, so no NATS message exceeds the server's max payload whatever
the page size. Bodies are stored gzip-compressed (level 6): nats-server's S2 stream compression
only compresses sealed blocks, so it does little for a bucket that is mostly its active block.

Objects are written in nats-py's object store format (chunks on ``$O.<bucket>.C.<nuid>``, then
the meta message with a rollup on ``$O.<bucket>.M.<name>``) by :func:`_put`, not by
``ObjectStore.put``: that one purges chunks (a failed put's, or a raced put's old ones), and a
worker, the process that parses hostile pages, may purge no stream. A failed put leaves its
chunks behind: bytes on disk, never a wrong body, since only a meta message names chunks.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from datetime import UTC, datetime

from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError
from nats.js.kv import MSG_ROLLUP_SUBJECT
from nats.js.object_store import (
    OBJ_CHUNKS_PRE_TEMPLATE,
    OBJ_DEFAULT_CHUNK_SIZE,
    OBJ_DIGEST_TEMPLATE,
    OBJ_META_PRE_TEMPLATE,
    ObjectStore,
)
from nats.nuid import NUID

from jetcrawl.contract.errors import JetcrawlError
from jetcrawl.contract.topology import BODIES_BUCKET


class BodyNotFound(JetcrawlError):
    def __init__(self, ref: str) -> None:
        super().__init__(f"no stored body {ref!r} in {BODIES_BUCKET}")
        self.ref = ref


# Base32 (RFC 4648) two characters at a time: the 1,024 pairs of the alphabet, by 10-bit value,
# and where each pair's ten bits sit in a 160-bit digest.
_B32_SHIFTS = tuple(range(150, -1, -10))
_B32_PAIRS = [
    a + b for a in "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567" for b in "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
]


def payload_digest(body: bytes) -> str:
    """``sha1:<base32>``, the form of WARC-Payload-Digest.

    A SHA-1 is 160 bits, 32 base32 characters without padding, taken ten bits at a time from
    one integer: faster than ``base64.b32encode`` (Python code, five bytes a turn), for a digest
    made for every page.
    """
    n = int.from_bytes(hashlib.sha1(body).digest())
    pairs = _B32_PAIRS
    return "sha1:" + "".join([pairs[(n >> shift) & 0x3FF] for shift in _B32_SHIFTS])


def body_ref(fp: str, digest: str) -> str:
    return f"{fp}/{digest}"


class BodyStore:
    def __init__(self, js: JetStreamContext, store: ObjectStore) -> None:
        self._js = js
        self._store = store
        self._nuid = NUID()

    @classmethod
    async def open(cls, js: JetStreamContext) -> BodyStore:
        return cls(js, await js.object_store(BODIES_BUCKET))

    async def put(self, fp: str, body: bytes) -> tuple[str, str]:
        """Store ``body`` unless the same content is there already; ``(ref, digest)``."""
        digest = payload_digest(body)
        ref = body_ref(fp, digest)
        try:
            await self._store.get_info(ref)
        except NotFoundError:
            await self._put(ref, gzip.compress(body, compresslevel=6))
        return ref, digest

    async def _put(self, name: str, data: bytes) -> None:
        """``data`` as the object ``name``, as ``ObjectStore.put`` writes it, without purging."""
        nuid = self._nuid.next().decode()
        chunks = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=BODIES_BUCKET, obj=nuid)
        size = OBJ_DEFAULT_CHUNK_SIZE
        for start in range(0, len(data), size):
            await self._js.publish(chunks, data[start : start + size])
        info = api.ObjectInfo(
            name=name,
            bucket=BODIES_BUCKET,
            nuid=nuid,
            size=len(data),
            chunks=-(-len(data) // size),
            mtime=datetime.now(UTC).isoformat(),
            digest=OBJ_DIGEST_TEMPLATE.format(
                digest=base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
            ),
            options=api.ObjectMetaOptions(max_chunk_size=size),
        )
        meta = OBJ_META_PRE_TEMPLATE.format(
            bucket=BODIES_BUCKET, obj=base64.urlsafe_b64encode(name.encode()).decode()
        )
        await self._js.publish(
            meta,
            json.dumps(info.as_dict()).encode(),
            headers={api.Header.ROLLUP: MSG_ROLLUP_SUBJECT},
        )

    async def get(self, ref: str) -> bytes:
        try:
            result = await self._store.get(ref)
        except NotFoundError:
            raise BodyNotFound(ref) from None
        return gzip.decompress(result.data or b"")
