#!/usr/bin/env bash
# This build (kvfs) against the one before (kvfs-prev), same run, two
# rounds interleaved: host and GPU loads of 1,024 whole blocks per call
# (tmpfs store, head-major and token-major), 1 and 8 callers, more calls
# per caller than the other scripts for steadier one-caller figures; then
# the control path in process (ctl-old.test against ctl-new.test,
# BenchmarkLoadBlocks, all cores and one). Stop 23.
#
# BIN (default out/h200) holds the four binaries, built with
# CGO_ENABLED=0. Run as root from the repo root; about four minutes.
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
K=$D/kvfs
M=/mnt/kvfs-ab
mkdir -p "$M"
. "$(dirname "$0")/h200-lib.sh"
S=/dev/shm/kvfs-ab.kvfs
fresh
for round in 1 2; do
	for k in kvfs-prev kvfs; do
		mnt "$D/$k"
		for l in hnd nhd; do
			echo "round $round $k host $l 1 caller: $(bl --blocks-per-call 1024 --layout $l --calls 8 --jobs 1)"
			echo "round $round $k cuda $l 1 caller: $(bl --blocks-per-call 1024 --layout $l --calls 8 --jobs 1 --into cuda)"
		done
		echo "round $round $k host hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 2 --jobs 8)"
		echo "round $round $k cuda hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 2 --jobs 8 --into cuda)"
		"$D/$k" umount "$M"
		sleep 1
	done
done
rm -f "$S"
cd ctl
for v in old new old new; do
	"$D/ctl-$v.test" -test.run XXX -test.bench 'BenchmarkLoadBlocks/(hnd|nhd)/blocks' 2>&1 | grep Bench | sed "s/^/ctl-$v /"
done
for v in old new; do
	"$D/ctl-$v.test" -test.run XXX -test.bench 'BenchmarkLoadBlocks/(hnd|nhd)/blocks' -test.cpu 1 2>&1 | grep Bench | sed "s/^/ctl-$v /"
done
