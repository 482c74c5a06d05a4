#!/usr/bin/env bash
# Installs the Python client the way users do (pip install ./python, into a
# venv under out/) and runs its pytest suite against that install: first the
# tests that need no mount, then, through integration/ctl's
# TestPythonClient, the whole suite against a real kvfs mount (needs root and
# /dev/fuse; skipped by that test otherwise).
#
# Uses Debian's python3, pytest and setuptools (scripts/deps.sh): the venv sees
# the system site-packages and pip installs with no index, so nothing is
# fetched from a Python package registry.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/usr/bin/python3}
venv=out/pyvenv
rm -rf "$venv"
"$PY" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q --no-build-isolation --no-index ./python
rm -rf python/build python/*.egg-info
# The installed package, not the checkout: run from a directory where
# "import kvfs" cannot find python/kvfs.
py=$(cd "$venv/bin" && pwd)/python
(cd / && "$py" -c 'import kvfs, sys; print("kvfs client installed at", kvfs.__file__, file=sys.stderr)')
export PYTHONDONTWRITEBYTECODE=1
root=$PWD
(cd "$venv" && "$py" -m pytest -p no:cacheprovider -q "$root/python/tests")
KVFS_PYTHON="$py" ${GO:-go} test -race -count=1 -run '^TestPythonClient$' -v ./integration/ctl/
