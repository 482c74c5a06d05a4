#!/usr/bin/env bash
# Where a single caller's GPU load spends the daemon's time against a host
# load of the same blocks (tmpfs store, head-major, 1,024 blocks per call):
# one mount per case with --cpuprofile, the profiles written to $OUT
# (default /tmp) as cpu-host.pprof and cpu-cuda.pprof, with the rates.
#
# BIN (default out/h200) holds kvfs built with CGO_ENABLED=0. Run as root
# from the repo root; about a minute. Read the profiles with
# go tool pprof -top FILE (Go profiles carry their symbols).
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
K=$D/kvfs
O=${OUT:-/tmp}
S=/dev/shm/kvfs-profgpu.kvfs
M=/mnt/kvfs-profgpu
mkdir -p "$M" "$O"
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
"$K" mount "$S" "$M" --daemon >/dev/null
"$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
"$K" umount "$M"
for into in host cuda; do
	out=$("$K" mount "$S" "$M" --daemon --gpu-staging-buffers 32 --gpu-staging-size 16MiB --gpu-depth 16 "$@" --cpuprofile "$O/cpu-$into.pprof")
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
	echo "$into hnd 1 caller: $(timeout 90 "$K" bench-load "$M" --warmup 1 --daemon-pid "$pid" --blocks-per-call 1024 --layout hnd --calls 8 --jobs 1 --into $into 2>&1 | grep -E 'GB/s|cpu' | head -2 | tr '\n' ' ')"
	"$K" umount "$M"
	sleep 1
done
rm -f "$S"
