#!/usr/bin/env bash
# The disk store on the H200 host against a fair fio (stop 24). A store
# file is fallocated, not written: fio's random reads of the whole file
# found never-written space, which the file system answers with zeros and
# no disk I/O, so stop 23's reference was inflated. This run shows that
# effect, then measures on a file formatted with --zero (every byte
# written):
# - fio 2 MiB random O_DIRECT reads at QD 8 to 64 on the file without and
#   with --zero, with the file's written fraction;
# - one LOAD_BLOCKS of 1,000 random whole blocks by one caller into host
#   and GPU targets (checksums on the CPU and on the GPU), with the daemon's
#   CPU; and larger LOAD_BLOCKS windows (kvfs-exp, KVFS_EXP_LOADWIN groups
#   per store call, when BIN holds it), on the disk and on tmpfs;
# - STORE_BLOCKS of 1,000 blocks into fresh slots, without and with --zero
#   (first writes into unwritten extents convert them).
#
# BIN (default out/h200) holds kvfs and fio (and optionally kvfs-exp),
# built with CGO_ENABLED=0. Run as root from the repo root; about four
# minutes.
set -u
. "$(dirname "$0")/h200-lib.sh"
setup disk /var/tmp
BL_TIMEOUT=60
fioqd() {
	"$D/fio" --name=r --filename="$S" --rw=randread --bs=2M --ioengine=io_uring --iodepth="$1" --direct=1 \
		--time_based --runtime=3 --output-format=terse --terse-version=3 | awk -F';' '{printf "%.2f GB/s", $7*1024/1e9}'
}
written() {
	python3 -c '
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY); size = os.fstat(fd).st_size; off = holes = 0
while off < size:
    try: lo = os.lseek(fd, off, os.SEEK_HOLE)
    except OSError: break
    if lo >= size: break
    try: hi = os.lseek(fd, lo, os.SEEK_DATA)
    except OSError: hi = size
    holes += hi - lo; off = hi
print("%.1f%% of %d GiB written" % (100 * (size - holes) / size, size >> 30))' "$S"
}
storeblocks() {
	"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force "$@" >/dev/null
	mnt "$K"
	echo "STORE_BLOCKS 1000 into fresh slots $*: $(bl --blocks-per-call 1000 --layout hnd --calls 1 --warmup 0 --jobs 1 --store)"
	"$K" umount "$M"
}
df -T /var/tmp | tail -1
for z in "" --zero; do
	rm -f "$S"
	storeblocks $z
done
for z in "" --zero; do
	rm -f "$S"
	t0=$(date +%s%N)
	fresh $z
	echo "== format ${z:-(no --zero)} + fill 2048 blocks: $(( ($(date +%s%N) - t0) / 1000000 )) ms; $(written)"
	for qd in 8 16 32 64; do
		echo "fio 2M QD$qd O_DIRECT: $(fioqd $qd)"
	done
	mnt "$K"
	echo "disk host: $(bl --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1)"
	[ -n "$z" ] && echo "disk host again: $(bl --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1)"
	[ -n "$z" ] && echo "disk cuda verify cpu: $(bl --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1 --into cuda)"
	"$K" umount "$M"
	[ -z "$z" ] && continue
	mnt "$K" --gpu-verify gpu
	echo "disk cuda verify gpu: $(bl --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1 --into cuda)"
	"$K" umount "$M"
	if [ -x "$D/kvfs-exp" ]; then
		for w in 16384 131072 1048576; do
			KVFS_EXP_LOADWIN=$w mnt "$D/kvfs-exp"
			echo "disk host window $w groups: $(bl --blocks-per-call 1000 --layout hnd --calls 2 --jobs 1)"
			"$D/kvfs-exp" umount "$M"
		done
	fi
	echo "fio 2M QD32 O_DIRECT again: $(fioqd 32)"
done
rm -f "$S"
# Larger windows on tmpfs, where the store's per-call memory would show.
if [ -x "$D/kvfs-exp" ]; then
	S=/dev/shm/kvfs-zero.kvfs
	fresh
	for w in 16384 1048576; do
		KVFS_EXP_LOADWIN=$w mnt "$D/kvfs-exp"
		for j in 1 8; do
			echo "tmpfs host window $w groups, $j callers: $(bl --blocks-per-call 1024 --layout hnd --calls 3 --jobs $j)"
		done
		"$D/kvfs-exp" umount "$M"
	done
	rm -f "$S"
fi
