#!/usr/bin/env bash
# How a GPU load waits for its staging buffers' copies (stop 23):
# --gpu-wait spin (the driver's default: a core spins per waiting caller)
# against block (sleep until the GPU's interrupt), and the build before
# (kvfs-prev, which always spun), for 1, 8 and 16 callers on a tmpfs store,
# host loads beside and the pinned H2D rate of the same run; then the disk
# store with the checksums on the CPU and on the GPU against fio 2 MiB QD32
# O_DIRECT. Daemon CPU profiles of the 8-caller runs go to $OUT.
#
# BIN (default out/h200) holds kvfs, kvfs-prev (optional) and fio, built
# with CGO_ENABLED=0. Run as root from the repo root; about four minutes.
# Output: one bench-load summary per measurement (GB/s, the daemon's
# core-s/GB and, for cuda, the pinned H2D rate).
set -u
D=$(cd "${BIN:-out/h200}" && pwd)
K=$D/kvfs
O=${OUT:-/tmp}
export PATH=$D:$PATH
M=/mnt/kvfs-wait
mkdir -p "$M" "$O"
. "$(dirname "$0")/h200-lib.sh"
S=/dev/shm/kvfs-wait.kvfs
fresh
mnt "$K"
echo "host hnd 1 caller: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1)"
echo "host hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8)"
echo "host hnd 16 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 16)"
"$K" umount "$M"
for cfg in "kvfs-prev -" "kvfs spin" "kvfs block" "kvfs block 128"; do
	set -- $cfg
	[ -x "$D/$1" ] || continue
	tag="$1 wait $2 ${3:-32} buffers"
	args=()
	[ "$2" != - ] && args+=(--gpu-wait "$2")
	[ -n "${3:-}" ] && args+=(--gpu-staging-buffers "$3")
	mnt "$D/$1" "${args[@]}" --cpuprofile "$O/cpu-$1-$2-${3:-32}.pprof"
	echo "$tag cuda hnd 1 caller: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs 1 --into cuda)"
	echo "$tag cuda hnd 8 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 2 --jobs 8 --into cuda)"
	echo "$tag cuda hnd 16 callers: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 16 --into cuda)"
	echo "$tag cuda hnd 8 callers scatter: $(bl --blocks-per-call 1024 --layout hnd --calls 1 --jobs 8 --into cuda --scatter)"
	echo "$tag cuda nhd 8 callers: $(bl --blocks-per-call 1024 --layout nhd --calls 1 --jobs 8 --into cuda)"
	"$D/$1" umount "$M"
	sleep 1
done
rm -f "$S"
S=/var/tmp/kvfs-wait.kvfs
fresh
mnt "$K"
echo "disk host: $(bl --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1)"
echo "disk cuda verify cpu: $(bl --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1 --into cuda)"
"$K" umount "$M"
mnt "$K" --gpu-verify gpu
echo "disk cuda verify gpu: $(bl --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1 --into cuda)"
"$K" umount "$M"
fio --name=r --filename="$S" --rw=randread --bs=2M --ioengine=io_uring --iodepth=32 --direct=1 \
	--time_based --runtime=3 --output-format=terse --terse-version=3 | awk -F';' '{printf "fio disk 2M QD32 O_DIRECT %.2f GB/s\n", $7*1024/1e9}'
rm -f "$S"
