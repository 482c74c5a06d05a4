#!/usr/bin/env bash
# Installs the Python client the way users do (pip install ./python, into a
# venv under out/) and runs its pytest suite against that install: first the
# tests that need no mount, then, through integration/ctl's
# TestPythonClient, the whole suite against a real kvfs mount (needs root and
# /dev/fuse; skipped by that test otherwise).
#
# What the tests run with (torch, transformers, numpy, pytest:
# python/requirements-test.txt, every version pinned) lives in a second venv
# outside the checkout, so that a fresh clone on the same machine does not
# download several GB again:
#
#   $KVFS_PY_CACHE/pyvenv-<hash>     KVFS_PY_CACHE defaults to /var/cache/kvfs
#                                    as root, else $XDG_CACHE_HOME/kvfs
#                                    (~/.cache/kvfs)
#
# <hash> covers the requirements file and the interpreter (path, version,
# machine), so a changed pin or Python builds a new venv; one whose key is no
# longer used is removed after a day. The venv is built in a temporary
# directory and renamed into place only once complete and checked (pip check,
# the imports), under a lock, so a killed or failed install is never reused
# and two runs never install at once. out/pyvenv reaches its packages through
# a .pth file and holds only the kvfs client, installed fresh from ./python on
# every run.
#
# With deps, pytest requires them: a missing torch, transformers or numpy is
# an error, and in the mounted run a skipped test fails (python/tests/
# conftest.py), so nothing that CI means to test is skipped silently.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-/usr/bin/python3}
req=python/requirements-test.txt

if [ "$(id -u)" -eq 0 ]; then
	cache=${KVFS_PY_CACHE:-/var/cache/kvfs}
else
	cache=${KVFS_PY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfs}
fi
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
key=$({
	cat "$req"
	readlink -f "$(command -v "$PY")"
	"$PY" -c 'import platform, sys; print(sys.version, platform.machine())'
} | sha256sum | cut -c1-16)
deps=$cache/pyvenv-$key

# install_deps builds the venv in a temporary directory next to $deps and
# renames it into place; called with the lock held.
install_deps() {
	local tmp attempt
	tmp=$(mktemp -d "$cache/.pyvenv-$key.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	echo "test-python: installing $req into $deps (once per requirements file)" >&2
	local t0=$SECONDS
	chmod 755 "$tmp"
	"$PY" -m venv --prompt kvfs-test "$tmp"
	for attempt in 1 2 3; do
		if "$tmp/bin/python" -m pip install -q --retries 10 --timeout 60 --no-input \
			--disable-pip-version-check -r "$req"; then
			break
		fi
		if [ "$attempt" -eq 3 ]; then
			echo "test-python: pip install -r $req failed 3 times" >&2
			return 1
		fi
		echo "test-python: pip install failed (attempt $attempt); retrying" >&2
		sleep $((attempt * 10))
	done
	"$tmp/bin/python" -m pip check
	(cd / && "$tmp/bin/python" -c 'import numpy, pytest, torch, transformers')
	# Entry-point scripts and activate name the directory they were built in.
	{ grep -rlI --null -F "$tmp" "$tmp/bin" || true; } | xargs -0 -r sed -i "s|$tmp|$deps|g"
	mv -T "$tmp" "$deps"
	trap - EXIT
	echo "test-python: installed in $((SECONDS - t0)) s" >&2
}

exec 9>"$cache/.lock"
flock 9
# Holding the lock, any temporary venv is one a killed run left behind.
rm -rf "$cache"/.pyvenv-*
if [ ! -x "$deps/bin/python" ]; then
	install_deps
else
	echo "test-python: reusing $deps" >&2
fi
touch "$deps"
find "$cache" -mindepth 1 -maxdepth 1 -name 'pyvenv-*' ! -name "pyvenv-$key" -mtime +0 \
	-exec rm -rf {} + 2>/dev/null || true
flock -u 9

venv=out/pyvenv
rm -rf "$venv"
"$PY" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
depsite=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# "import" lines of a .pth file run at startup; addsitedir also runs the .pth
# files of the deps' site-packages (the nvidia wheels and setuptools use them).
echo "import site; site.addsitedir('$depsite')" >"$site/kvfs-test-deps.pth"
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation --no-index ./python
rm -rf python/build python/*.egg-info
# The installed package, not the checkout: run from a directory where
# "import kvfs" cannot find python/kvfs.
py=$(cd "$venv/bin" && pwd)/python
(cd / && "$py" -c 'import kvfs, sys; print("kvfs client installed at", kvfs.__file__, file=sys.stderr)')
export PYTHONDONTWRITEBYTECODE=1
export KVFS_TEST_REQUIRE=numpy,torch,transformers
root=$PWD
(cd "$venv" && "$py" -m pytest -p no:cacheprovider -q "$root/python/tests")
KVFS_PYTHON="$py" ${GO:-go} test -race -count=1 -run '^TestPythonClient$' -v ./integration/ctl/
