#!/usr/bin/env bash
# The H200 measurements of docs/performance.md ("H200 host: LOAD_BLOCKS
# against fio" and the second GPU table): the integration/gpu device tests,
# scripts/ipc-probe.py, v2 LOAD_BLOCKS sweeps (NHD, HND) and v1 LOAD against
# fio on a tmpfs store, GPU loads (host vs cuda vs pinned) for HND, NHD and
# HF targets, and the in-process control-path benchmark.
#
# BIN (default out/h200) holds kvfs, gpu.test (go test -c ./integration/gpu),
# ctl.test (go test -c ./ctl), fio (../shared/tools/fio) and ipc-probe.py,
# built on a development machine with CGO_ENABLED=0. Run as root from the
# repo root, BIN carried; about 5 minutes. Output on stdout.
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
K=$D/kvfs
export PATH=$D:$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nproc
if [ -x "$D/gpu.test" ]; then
	echo "== integration/gpu"
	timeout 120 "$D/gpu.test" -test.v -test.count=1 -test.timeout=110s 2>&1 | grep -E '^(--- |PASS|FAIL|ok|panic)|_test.go:' | tail -20
fi
if [ -f "$D/ipc-probe.py" ]; then
	echo "== ipc-probe"
	timeout 60 python3 "$D/ipc-probe.py" 2>&1 | grep -E 'ipc-probe (open|child)'
fi
if [ -x "$D/ctl.test" ]; then
	echo "== control path (in process, ctl-ns per block)"
	"$D/ctl.test" -test.run '^$' -test.bench BenchmarkLoadBlocks -test.benchtime 20x -test.count 2 2>&1 | grep -E 'Benchmark'
fi
S=/dev/shm/kvfs-h200.kvfs
M=/mnt/kvfs-h200
mkdir -p "$M"
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
out=$("$K" mount "$S" "$M" --daemon --gpu-staging-buffers 32 --gpu-staging-size 16MiB --gpu-depth 16)
echo "$out"
pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
"$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
echo "== v2 host sweeps (tmpfs, 128 blocks per call), v1 LOAD, fio"
for l in nhd hnd; do timeout 60 "$K" bench-load "$M" --blocks-per-call 128 --layout $l --calls 20 --sweep --daemon-pid "$pid"; done
timeout 40 "$K" bench-load "$M" --groups-per-call 511 --calls 300 --sweep --daemon-pid "$pid"
for j in 1 2 4 8 16; do
	fio --name=r --filename="$S" --rw=randread --bs=2M --ioengine=io_uring --iodepth=16 --numjobs=$j --direct=0 \
		--time_based --runtime=3 --group_reporting --output-format=terse --terse-version=3 |
		awk -F';' -v j=$j '{printf "fio 2M QD16 jobs=%d %.2f GB/s\n", j, $7*1024/1e9}'
done
if [ -x "$D/kvfs-old" ]; then
	# Before this change, same store, same run: an earlier build.
	"$K" umount "$M"
	out=$("$D/kvfs-old" mount "$S" "$M" --daemon)
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
	echo "== before (kvfs-old), 8 callers, 128 blocks per call"
	for l in nhd hnd; do timeout 60 "$D/kvfs-old" bench-load "$M" --blocks-per-call 128 --layout $l --calls 20 --jobs 8 --warmup 1 --daemon-pid "$pid" 2>&1 | grep -E 'GB/s|cpu' | sed "s/^/$l /"; done
	"$D/kvfs-old" umount "$M"
	out=$("$K" mount "$S" "$M" --daemon --gpu-staging-buffers 32 --gpu-staging-size 16MiB --gpu-depth 16)
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
fi
echo "== GPU vs host (tmpfs)"
"$K" bench-h2d --sizes 1MiB,4MiB,16MiB --seconds 1
row() { timeout 45 "$K" bench-load "$M" --warmup 1 --daemon-pid "$pid" "$@" 2>&1 | grep -E 'GB/s|cpu|cuda|error' | head -4; }
for j in 1 8 16; do
	c=$((j == 1 ? 6 : (j == 8 ? 2 : 1)))
	echo "-- hnd 1024 bpc jobs=$j"
	row --blocks-per-call 1024 --layout hnd --calls $c --jobs $j --into host
	row --blocks-per-call 1024 --layout hnd --calls $c --jobs $j --into cuda
done
for j in 1 8; do
	c=$((j == 1 ? 4 : 1))
	echo "-- nhd 1024 bpc jobs=$j"
	for into in host cuda pinned; do row --blocks-per-call 1024 --layout nhd --calls $c --jobs $j --into $into; done
done
echo "-- hf 1024 bpc jobs=1"
for into in host cuda; do row --blocks-per-call 1024 --layout hf --calls 4 --jobs 1 --into $into; done
"$K" umount "$M"
rm -f "$S"
# The disk store: one caller, 1,000 random whole blocks per call, against fio
# 2 MiB random O_DIRECT reads at QD 32 of the same file (and before/after).
S=/var/tmp/kvfs-h200.kvfs
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
for k in "$K" "$D/kvfs-old"; do
	[ -x "$k" ] || continue
	echo "== disk store: $(basename "$k")"
	out=$("$k" mount "$S" "$M" --daemon --gpu-staging-buffers 32 --gpu-staging-size 16MiB --gpu-depth 16)
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
	[ "$k" = "$K" ] && "$k" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
	intos="host"
	[ "$k" = "$K" ] && intos="host cuda"
	for r in 1 2; do
		for into in $intos; do
			echo "-- hnd 1000 bpc jobs=1 into=$into"
			timeout 60 "$k" bench-load "$M" --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1 --warmup 1 --into $into --daemon-pid "$pid" 2>&1 | grep -E 'GB/s|cpu|cuda|error' | head -3
		done
		fio --name=r --filename="$S" --rw=randread --bs=2M --ioengine=io_uring --iodepth=32 --direct=1 \
			--time_based --runtime=3 --output-format=terse --terse-version=3 | awk -F';' '{printf "fio disk 2M QD32 O_DIRECT %.2f GB/s\n", $7*1024/1e9}'
	done
	"$k" umount "$M"
done
rm -f "$S"
