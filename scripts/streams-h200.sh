#!/usr/bin/env bash
# Copy streams per GPU (--gpu-streams 1 against 4) and staging buffer size
# (16 against 64 MiB) for 1, 8 and 16 callers loading into GPU memory on a
# tmpfs store, host loads beside (stop 22).
#
# BIN (default out/h200) holds kvfs built with CGO_ENABLED=0. Run as root
# from the repo root; about three minutes.
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
K=$D/kvfs
M=/mnt/kvfs-st
S=/dev/shm/kvfs-st.kvfs
mkdir -p "$M"
mnt() {
	out=$("$K" mount "$S" "$M" --daemon "$@")
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
}
bl() {
	timeout 60 "$K" bench-load "$M" --warmup 1 --daemon-pid "$pid" "$@" 2>&1 | grep -E 'GB/s|cpu' | head -2 |
		awk '{printf "%s %s ", $1, $2} /cpu/ {print $5}'
}
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
mnt
"$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
echo "host hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8)"
"$K" umount "$M"
for cfg in "1 16MiB 128" "4 16MiB 128" "4 64MiB 32"; do
	set -- $cfg
	mnt --gpu-streams $1 --gpu-staging-size $2 --gpu-staging-buffers $3
	for j in 1 8 16; do
		echo "streams $1 staging $3 x $2: cuda hnd $j callers: $(bl --blocks-per-call 1024 --layout hnd --calls $((j == 1 ? 3 : 1)) --jobs $j --into cuda)"
	done
	echo "streams $1 staging $3 x $2: cuda hnd 8 callers scatter: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8 --into cuda --scatter)"
	echo "streams $1 staging $3 x $2: cuda nhd 8 callers: $(bl --blocks-per-call 1024 --layout nhd --calls 1 --jobs 8 --into cuda)"
	"$K" umount "$M"
done
rm -f "$S"
