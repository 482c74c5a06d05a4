#!/usr/bin/env bash
# GPU loads straight from a store file in memory (stop 25): the device
# tests of this build, then a tmpfs store loaded into a host target and
# into GPU memory (checksums on the GPU) with --gpu-direct (the file
# registered with the GPU, copies from it; 4 and 8 submitters per load) and
# without (staged: the CPU copies every byte into pinned staging first),
# 1 and 8 callers, 1,024 whole blocks per LOAD_BLOCKS, two rounds (MODES
# picks: direct:N for N submitters, staged). bench-load prints the pinned
# H2D rate of the same run beside each GPU figure.
#
# BIN (default out/h200) holds kvfs and the test binaries gpu.test
# (integration/gpu), gpupkg.test (gpu), ctl.test and crc32c.test (each
# optional), built with
# CGO_ENABLED=0. Run as root from the repo root; about five minutes.
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in gpu.test gpupkg.test ctl.test crc32c.test; do
	[ -x "$D/$t" ] || continue
	run=.
	[ $t = ctl.test ] && run='CUDA|Direct'
	# crc32c.test compares the PTX with crc32c.cu: run it in its folder.
	dir=.
	[ $t = crc32c.test ] && dir=gpu/crc32c
	if (cd $dir && timeout 250 "$D/$t" -test.count=1 -test.timeout=240s -test.v -test.run "$run") >/tmp/$t.txt 2>&1; then r=PASS; else r=FAIL; fi
	echo "$t: $r ($(grep -c -- '--- PASS' /tmp/$t.txt) passed, $(grep -c -- '--- SKIP' /tmp/$t.txt) skipped)"
	[ $t = gpu.test ] && grep -E -- '--- (PASS|FAIL|SKIP)' /tmp/$t.txt
	[ $r = FAIL ] && grep -E -- '--- FAIL|panic|_test.go' /tmp/$t.txt | head -20
done
. "$(dirname "$0")/h200-lib.sh"
setup direct /dev/shm
fresh
BL_TIMEOUT=60
for round in $(seq ${ROUNDS:-2}); do
	for mode in ${MODES:-direct:4 direct:8 staged}; do
		flag="--gpu-direct=true --gpu-direct-workers ${mode#direct:}"
		[ $mode = staged ] && flag=--gpu-direct=false
		mnt "$K" --gpu-verify gpu $flag --log-file /tmp/kvfs-direct.log
		# The first GPU registration opens the device and, with
		# --gpu-direct, starts registering the store file: let it finish.
		"$K" bench-load "$M" --blocks-per-call 64 --layout hnd --calls 1 --into cuda >/dev/null 2>&1
		sleep 3
		[ $mode = staged ] || grep -h "GPU loads copy straight\|cannot register" /tmp/kvfs-direct.log | tail -1 | cut -c1-300
		for j in 1 8; do
			[ $mode = staged ] && echo "round $round host $j callers: $(bl --blocks-per-call 1024 --layout hnd --calls 5 --jobs $j)"
			echo "round $round cuda $mode $j callers: $(bl --blocks-per-call 1024 --layout hnd --calls 5 --jobs $j --into cuda)"
		done
		"$K" umount "$M"
	done
done
for mode in direct staged; do
	mnt "$K" --gpu-verify gpu --gpu-direct=$([ $mode = direct ] && echo true || echo false)
	"$K" bench-load "$M" --blocks-per-call 64 --layout nhd --calls 1 --into cuda >/dev/null 2>&1
	sleep 3
	for j in 1 8; do
		echo "cuda nhd $mode $j callers: $(bl --blocks-per-call 1024 --layout nhd --calls 5 --jobs $j --into cuda)"
	done
	"$K" umount "$M"
done
rm -f "$S"
