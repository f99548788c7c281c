"""Reading a directory's tar stream from a sandbox, which is not trusted,
and writing it under a local directory.

The reader is hiloop's own, not tarfile's: it reads ustar, GNU and PAX
headers strictly and in linear time, holds at most MAX_META bytes of a
header in memory, counts every byte it consumes, and tells sparse files
apart so they can be refused. The writer resolves every name one
component at a time from a directory descriptor, never following a
symbolic link, and writes only directories and regular files."""

import errno
import os
import posixpath
import secrets
import shutil
import tarfile
from typing import IO, BinaryIO, Dict, Optional, Tuple

from .errors import ConflictError, ExtractError, LimitError

BLOCK = 512
# The largest PAX or GNU long-name header read (archive/tar's limit too).
MAX_META = 1 << 20
# How many extension headers may precede one entry.
_MAX_META_RUN = 16
_CHUNK = 1 << 20

FILE, DIR, OTHER = "file", "dir", "other"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# What opening a link with O_NOFOLLOW (or a file as a directory) fails with.
_NOT_A_DIR = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)


def _bad(msg: str) -> ExtractError:
    return ExtractError(msg, code="invalid_tar")


class Entry:
    """One entry of the stream: its name, what it is, its permission bits
    and the size of its data."""

    def __init__(self, name: str, kind: str, mode: int, size: int, sparse: bool) -> None:
        self.name, self.kind, self.mode, self.size, self.sparse = name, kind, mode, size, sparse


def _str(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _number(field: bytes, what: str) -> int:
    """A numeric header field: octal digits, or base-256 for a large one."""
    if field and field[0] & 0x80:
        if field[0] == 0xFF:
            raise _bad("negative %s in a tar header" % what)
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    s = field.split(b"\0", 1)[0].strip(b" ")
    if s.strip(b"01234567"):
        raise _bad("%s %r in a tar header is not octal" % (what, s))
    return int(s, 8) if s else 0


def _pax(data: bytes) -> Dict[bytes, bytes]:
    """The records "<length> <key>=<value>\\n" of a PAX header."""
    out: Dict[bytes, bytes] = {}
    pos = 0
    while pos < len(data):
        sp = data.find(b" ", pos, pos + 20)
        digits = data[pos:sp]
        if sp < 0 or not digits.isdigit():
            raise _bad("a PAX record without its length")
        end = pos + int(digits)
        rec = data[sp + 1:end]
        if end > len(data) or end <= sp + 1 or data[end - 1:end] != b"\n":
            raise _bad("a PAX record of a wrong length")
        key, eq, value = rec[:-1].partition(b"=")
        if not key or not eq:
            raise _bad("a PAX record without a key")
        out[key] = value
        pos = end
    return out


class Reader:
    """Reads entries from src, at most max_entries of them and max_bytes of
    their data and extension headers in all, written or skipped. The sizes
    the stream declares serve only to refuse early; every byte is counted
    as it is read."""

    def __init__(self, src: BinaryIO, max_bytes: int, max_entries: int) -> None:
        self._src = src
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.bytes = 0
        self.entries = 0
        self._left = 0  # data of the current entry not yet read
        self._pad = 0  # its padding to the block

    def _exact(self, n: int) -> bytes:
        parts, got = [], 0
        while got < n:
            b = self._src.read(n - got)
            if not b:
                raise _bad("the tar stream ended inside an entry")
            parts.append(b)
            got += len(b)
        return b"".join(parts)

    def _charge(self, n: int) -> None:
        if self.bytes + n > self.max_bytes:
            raise LimitError("the directory holds more than max_bytes (%d bytes)" % self.max_bytes,
                             code="extract_limit")
        self.bytes += n

    def read(self, n: int = _CHUNK) -> bytes:
        """Up to n bytes of the current entry's data; b"" at its end."""
        n = min(n, self._left)
        if n <= 0:
            return b""
        self._charge(n)
        b = self._exact(n)
        self._left -= n
        return b

    def _skip(self) -> None:
        while self.read():
            pass
        if self._pad:
            self._exact(self._pad)
            self._pad = 0

    def _data(self, size: int) -> None:
        if size > self.max_bytes - self.bytes:
            self._charge(size)  # raises: it cannot fit
        self._left, self._pad = size, -size % BLOCK

    def _meta(self, size: int) -> bytes:
        """The whole data of an extension header."""
        if size > MAX_META:
            raise _bad("a tar extension header of %d bytes, more than %d" % (size, MAX_META))
        self._data(size)
        out = b"".join(iter(self.read, b""))
        self._skip()
        return out

    def next(self) -> Optional[Entry]:
        """The next entry, with its data to read; None at the end of the
        archive. A stream that ends without the end-of-archive block is
        invalid: a transfer cut between two entries must not look whole."""
        self._skip()
        pax: Dict[bytes, bytes] = {}
        long_name: Optional[str] = None
        for _ in range(_MAX_META_RUN + 1):
            h = self._src.read(BLOCK)
            if not h:
                raise _bad("the tar stream ended before its end-of-archive block")
            if len(h) < BLOCK:
                h += self._exact(BLOCK - len(h))
            if h == bytes(BLOCK):
                return None
            want = _number(h[148:156], "checksum")
            unsigned = sum(h[:148]) + 8 * 32 + sum(h[156:])
            # Some old writers summed the bytes as signed chars.
            signed = unsigned - 256 * sum(1 for b in h[:148] + h[156:] if b & 0x80)
            if want not in (unsigned, signed):
                raise _bad("a tar header with a wrong checksum")
            flag = h[156:157]
            size = _number(h[124:136], "size")
            if flag in (b"x", b"g"):
                records = _pax(self._meta(size))
                if flag == b"x":
                    pax.update(records)
                continue
            if flag in (b"L", b"K"):
                data = self._meta(size)
                if flag == b"L":
                    long_name = _str(data)
                continue
            self.entries += 1
            if self.entries > self.max_entries:
                raise LimitError("the directory holds more than max_entries (%d entries)" % self.max_entries,
                                 code="extract_limit")
            name = _str(h[0:100])
            if h[257:263] == b"ustar\0" and h[345] != 0:
                name = _str(h[345:500]) + "/" + name
            if long_name is not None:
                name = long_name
            if pax.get(b"path"):
                name = pax[b"path"].decode("utf-8", "surrogateescape")
            if b"size" in pax:
                if not pax[b"size"].isdigit() or len(pax[b"size"]) > 20:
                    raise _bad("a PAX size that is not a number")
                size = int(pax[b"size"])
            sparse = flag == b"S" or any(k.startswith(b"GNU.sparse.") for k in pax)
            kind = OTHER
            if flag == b"5" or (flag == b"\0" and name.endswith("/")):
                kind = DIR
            elif flag in (b"0", b"\0"):
                kind = FILE
            self._data(size)
            return Entry(name, kind, _number(h[100:108], "mode"), size, sparse)
        raise _bad("more than %d extension headers before one entry" % _MAX_META_RUN)


# MAX_NAME and MAX_DEPTH bound a tar entry's name, as in the Go SDK
# (api.MaxPathBytes, api.MaxTarDepth): a few deep names would otherwise make
# a directory per component.
MAX_NAME = 4096
MAX_DEPTH = 128


def local_parts(name: str) -> Tuple[str, ...]:
    """The components of a tar entry's name below the destination; () for
    the destination itself. A name that leaves it, is longer than MAX_NAME
    or deeper than MAX_DEPTH directories is refused."""
    clean = posixpath.normpath(name)
    if "\0" in name or clean.startswith("/") or clean == ".." or clean.startswith("../"):
        raise ExtractError("tar entry %r lands outside the destination" % name, code="invalid_path")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME or clean.count("/") > MAX_DEPTH:
        raise ExtractError("tar entry %.64r... is longer than %d bytes or deeper than %d directories"
                           % (name, MAX_NAME, MAX_DEPTH), code="invalid_path")
    if clean == ".":
        return ()
    return tuple(clean.split("/"))


def _conflict(name: str, what: str) -> ExtractError:
    return ExtractError("tar entry %r: %s" % (name, what), code="path_conflict")


def make_temp_dir(parent: str) -> str:
    """Makes a fresh directory .hiloop-<hex> in parent, with the mode a
    mkdir gives (0777 less the umask), and returns its path."""
    while True:
        path = os.path.join(parent, ".hiloop-" + secrets.token_hex(8))
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue


class _Writer:
    """Writes entries under the directory open as root."""

    def __init__(self, root: int, overwrite: bool) -> None:
        self.root = root
        self.overwrite = overwrite
        # The last parent directory opened, since a tar lists a
        # directory's entries together.
        self._parent: Tuple[Tuple[str, ...], int] = ((), -1)

    def close(self) -> None:
        if self._parent[1] >= 0:
            os.close(self._parent[1])
        self._parent = ((), -1)

    def _open_dir(self, at: int, comp: str, name: str, mode: int) -> int:
        """Opens the directory comp in at, made with mode if missing; a
        link or anything else in its place is a conflict."""
        try:
            return os.open(comp, _DIR_FLAGS, dir_fd=at)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno in _NOT_A_DIR:
                raise _conflict(name, "%r is a symbolic link or not a directory" % comp) from None
            raise
        try:
            os.mkdir(comp, mode, dir_fd=at)
        except FileExistsError:
            pass
        try:
            return os.open(comp, _DIR_FLAGS, dir_fd=at)
        except OSError as e:
            if e.errno in _NOT_A_DIR:
                raise _conflict(name, "%r is a symbolic link or not a directory" % comp) from None
            raise

    def _parent_of(self, parts: Tuple[str, ...], name: str) -> int:
        dirs = parts[:-1]
        if not dirs:
            return self.root
        if self._parent[0] == dirs:
            return self._parent[1]
        self.close()
        fd = self.root
        try:
            for comp in dirs:
                nfd = self._open_dir(fd, comp, name, 0o777)
                if fd != self.root:
                    os.close(fd)
                fd = nfd
        except BaseException:
            if fd != self.root:
                os.close(fd)
            raise
        self._parent = (dirs, fd)
        return fd

    def mkdir(self, parts: Tuple[str, ...], name: str, mode: int) -> None:
        at = self._parent_of(parts, name)
        os.close(self._open_dir(at, parts[-1], name, (mode & 0o777) | 0o700))

    def write(self, parts: Tuple[str, ...], name: str, mode: int, r: Reader) -> None:
        at = self._parent_of(parts, name)
        leaf = parts[-1]
        # Over an existing path, write beside it and rename over it: the
        # old entry (a file, a hard link, a symbolic link) is replaced, not
        # written through, and the new file gets the mode the umask allows.
        tmp = ".hiloop-" + secrets.token_hex(8) if self.overwrite else leaf
        try:
            fd = os.open(tmp, _NEW_FLAGS, mode & 0o777, dir_fd=at)
        except FileExistsError:
            raise _conflict(name, "already written (a tar lists it twice, or a directory of its name)") from None
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in iter(r.read, b""):
                    out.write(chunk)
            if self.overwrite:
                try:
                    os.rename(tmp, leaf, src_dir_fd=at, dst_dir_fd=at)
                except IsADirectoryError:
                    raise _conflict(name, "a directory is in its place") from None
        except BaseException:
            if self.overwrite:
                try:
                    os.unlink(tmp, dir_fd=at)
                except OSError:
                    pass
            raise


def extract(src: BinaryIO, dest: str, overwrite: bool, max_bytes: int, max_entries: int) -> None:
    """Writes the directories and regular files of the tar stream src into
    the existing directory dest. Other entries (links, devices, fifos) are
    skipped; sparse files are refused. Without overwrite a file is never
    replaced (O_EXCL). Modes are the tar's permission bits, less the umask
    and never setuid, setgid or sticky."""
    root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    w = _Writer(root, overwrite)
    try:
        r = Reader(src, max_bytes, max_entries)
        while True:
            e = r.next()
            if e is None:
                return
            if e.sparse:
                raise ExtractError("tar entry %r is a sparse file, which download_dir does not write" % e.name,
                                   code="sparse_entry")
            if e.kind == OTHER:
                continue
            parts = local_parts(e.name)
            if not parts:
                continue
            if e.kind == DIR:
                w.mkdir(parts, e.name, e.mode)
            else:
                w.write(parts, e.name, e.mode, r)
    finally:
        w.close()
        os.close(root)



# -- the local side of upload_dir and download_dir, for both clients ------

TAR_MEDIA_TYPE = "application/x-tar"


def _no_owner(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def pack(local: str, f: IO[bytes]) -> int:
    """Writes the local directory's entries into f as a PAX tar naming no
    owner, and returns its size with f rewound."""
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for entry in sorted(os.listdir(local)):
            tf.add(os.path.join(local, entry), arcname=entry, filter=_no_owner)
    size = f.tell()
    f.seek(0)
    return size


def destination(local: str, overwrite: bool) -> Tuple[str, bool]:
    """download_dir's absolute destination and whether it exists, refused
    with FileExistsError, before anything is asked of the server, when it
    exists and overwrite is not given."""
    dest = os.path.abspath(local)
    exists = os.path.lexists(dest)
    if exists and not overwrite:
        raise FileExistsError(errno.EEXIST, "download_dir writes a new directory (overwrite=True writes into "
                                            "an existing one)", local)
    return dest, exists


def unpack(r: BinaryIO, content_type: str, path: str, local: str, dest: str, exists: bool, max_bytes: int,
           max_entries: int) -> None:
    """Writes the tar stream r, the directory at path, as download_dir
    does: into dest when it exists, else into a temporary directory beside
    it, renamed into place once whole."""
    if not content_type.startswith(TAR_MEDIA_TYPE):
        raise ConflictError("%s is a file, not a directory" % path, code="path_conflict", status=409)
    if exists:
        extract(r, dest, True, max_bytes, max_entries)
        return
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    tmp = make_temp_dir(parent)
    try:
        extract(r, tmp, False, max_bytes, max_entries)
        # A directory made at local meanwhile is not merged into: the
        # rename fails on anything but an empty one.
        if os.path.lexists(dest):
            raise FileExistsError(errno.EEXIST, "made while download_dir wrote it", local)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
