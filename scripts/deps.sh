#!/usr/bin/env bash
# Installs the Debian packages kvfs's build, tests and `make run` use, when
# missing. Idempotent; needs root (or sudo) for apt-get.
set -euo pipefail
want=()
need() { command -v "$1" >/dev/null 2>&1 || want+=("$2"); }
need getfattr attr         # getfattr in the FUSE tests and the README session
need setfacl acl           # ACL deny entries in the control-path registration tests
need fusermount3 fuse3     # non-root mounts; the kernel's FUSE needs nothing else as root
need python3 python3       # the Python client's tests
need cc gcc                # the ABI test compiles include/kvfs.h
need hexdump bsdextrautils # hexdump in the FUSE tests
need fio fio               # kvfs bench --vs-fio and its tests
need rsync rsync           # rsync round trips through the mount (integration/fuse tools tests)
# The venvs of scripts/test-python.sh (Debian's python3 with venv and pip;
# what the tests import comes from python/requirements-test.txt through pip),
# and flock for its install lock; pip, setuptools and wheel for the README's
# offline `pip install --no-build-isolation --no-index ./python`
# (integration/readme runs it with Debian's python3).
needpkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed' || want+=("$1"); }
for p in python3-venv python3-pip python3-setuptools python3-wheel; do needpkg "$p"; done
need flock util-linux
need systemd-analyze systemd # systemd-analyze verify of dist/kvfs@.service (integration/fuse)
if [ ${#want[@]} -eq 0 ]; then exit 0; fi
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "deps: installing ${want[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${want[@]}" >/dev/null
