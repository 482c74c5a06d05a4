#!/usr/bin/env bash
# Stop 25, first device call: the device tests of this build, pinned H2D
# against H2D straight from a tmpfs store file's mapping (bench-h2d --from),
# and nhd-ab.sh (inline bounced runs through the slots' chunk buffers).
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
for t in gpu.test gpupkg.test cuda.test; do
	if timeout 200 "$D/$t" -test.count=1 -test.timeout=190s -test.v >/tmp/$t.txt 2>&1; then r=PASS; else r=FAIL; fi
	echo "$t: $r ($(grep -c -- '--- PASS' /tmp/$t.txt) passed, $(grep -c -- '--- SKIP' /tmp/$t.txt) skipped)"
	[ $r = FAIL ] && grep -E -- '--- FAIL|panic|_test.go' /tmp/$t.txt | head -20
done
. "$(dirname "$0")/h200-lib.sh"
setup probe /dev/shm
fresh
"$K" bench-h2d --sizes 32KiB,256KiB,2MiB --seconds 1
"$K" bench-h2d --from "$S" --sizes 32KiB,256KiB,2MiB --seconds 1
rm -f "$S"
bash "$(dirname "$0")/nhd-ab.sh"
