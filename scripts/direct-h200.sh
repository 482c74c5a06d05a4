#!/usr/bin/env bash
# GPU loads straight from a store file in memory (stop 25): the device
# tests of this build, then a tmpfs store loaded into a host target and
# into GPU memory (checksums on the GPU) with --gpu-direct (the file
# registered with the GPU, copies from it) and without (staged: the CPU
# copies every byte into pinned staging first), 1 and 8 callers, 1,024
# whole blocks per LOAD_BLOCKS, two rounds. bench-load prints the pinned
# H2D rate of the same run beside each GPU figure.
#
# BIN (default out/h200) holds kvfs and the test binaries gpu.test
# (integration/gpu), gpupkg.test (gpu) and ctl.test, built with
# CGO_ENABLED=0. Run as root from the repo root; about five minutes.
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in gpu.test gpupkg.test ctl.test; do
	run=.
	[ $t = ctl.test ] && run='CUDA|Direct'
	if timeout 250 "$D/$t" -test.count=1 -test.timeout=240s -test.v -test.run "$run" >/tmp/$t.txt 2>&1; then r=PASS; else r=FAIL; fi
	echo "$t: $r ($(grep -c -- '--- PASS' /tmp/$t.txt) passed, $(grep -c -- '--- SKIP' /tmp/$t.txt) skipped)"
	[ $t = gpu.test ] && grep -E -- '--- (PASS|FAIL|SKIP)' /tmp/$t.txt
	[ $r = FAIL ] && grep -E -- '--- FAIL|panic|_test.go' /tmp/$t.txt | head -20
done
. "$(dirname "$0")/h200-lib.sh"
setup direct /dev/shm
fresh
BL_TIMEOUT=60
for round in 1 2; do
	for mode in direct staged; do
		flag=--gpu-direct=true
		[ $mode = staged ] && flag=--gpu-direct=false
		mnt "$K" --gpu-verify gpu $flag --log-file /tmp/kvfs-direct-$mode.log
		# The first GPU registration opens the device and, with
		# --gpu-direct, starts registering the store file: let it finish.
		"$K" bench-load "$M" --blocks-per-call 64 --layout hnd --calls 1 --into cuda >/dev/null 2>&1
		sleep 3
		grep -h "GPU loads copy straight\|cannot register" /tmp/kvfs-direct-$mode.log | tail -1 | cut -c1-300
		for j in 1 8; do
			[ $mode = direct ] && echo "round $round host $j callers: $(bl --blocks-per-call 1024 --layout hnd --calls 5 --jobs $j)"
			echo "round $round cuda $mode $j callers: $(bl --blocks-per-call 1024 --layout hnd --calls 5 --jobs $j --into cuda)"
		done
		"$K" umount "$M"
	done
done
mnt "$K" --gpu-verify gpu
echo "cuda nhd (staged) 1 caller: $(bl --blocks-per-call 1024 --layout nhd --calls 5 --jobs 1 --into cuda)"
"$K" umount "$M"
rm -f "$S"
