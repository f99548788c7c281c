"""A PEP 517 build backend of the standard library alone: it builds the
wheel of the pure-Python package hiloop, so installing needs no index."""

import base64
import hashlib
import os
import zipfile

NAME = "hiloop"
VERSION = "0.1.0"
HERE = os.path.dirname(os.path.abspath(__file__))
DIST_INFO = "%s-%s.dist-info" % (NAME, VERSION)
METADATA = (
    "Metadata-Version: 2.1\n"
    "Name: %s\n"
    "Version: %s\n"
    "Summary: Python client of the hiloop API: sandboxes, commands and files\n"
    "Requires-Python: >=3.9\n" % (NAME, VERSION)
)
WHEEL = "Wheel-Version: 1.0\nGenerator: hiloop build_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, DIST_INFO)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(METADATA)
    with open(os.path.join(d, "WHEEL"), "w") as f:
        f.write(WHEEL)
    return DIST_INFO


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    filename = "%s-%s-py3-none-any.whl" % (NAME, VERSION)
    files = []
    pkg = os.path.join(HERE, NAME)
    for entry in sorted(os.listdir(pkg)):
        if entry.endswith(".py") or entry == "py.typed":
            with open(os.path.join(pkg, entry), "rb") as f:
                files.append(("%s/%s" % (NAME, entry), f.read()))
    files.append((DIST_INFO + "/METADATA", METADATA.encode()))
    files.append((DIST_INFO + "/WHEEL", WHEEL.encode()))
    record = [_record_line(n, d) for n, d in files] + [DIST_INFO + "/RECORD,,"]
    files.append((DIST_INFO + "/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            z.writestr(name, data)
    return filename
