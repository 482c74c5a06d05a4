# Helpers the stop-23 and stop-24 H200 measurement scripts source
# (wait-h200.sh, gpu-cpu-h200.sh, ab-h200.sh, disk-h200.sh, zero-, gc-,
# mapped-, mapped-load-, slots-, profile-disk-h200.sh, ratio8.sh,
# nhd-ab.sh). The caller sets K (kvfs), M (the mount point) and S (the
# store file) before calling them, itself or with setup.

# setup NAME DIR: D is BIN (default out/h200) as an absolute path, K its
# kvfs, M the mount point /mnt/kvfs-NAME (created), S the store file
# DIR/kvfs-NAME.kvfs.
setup() {
	D=$(cd "${BIN:-out/h200}" && pwd)
	K=$D/kvfs
	M=/mnt/kvfs-$1
	S=$2/kvfs-$1.kvfs
	mkdir -p "$M"
}

# mnt KVFS [FLAGS...]: mount S on M as a daemon with the binary KVFS; pid is
# the daemon's process (bench-load's --daemon-pid).
mnt() {
	local k=$1
	shift
	out=$("$k" mount "$S" "$M" --daemon "$@")
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
}

# bl ARGS...: one kvfs bench-load against the mount (one warm-up call), its
# summary on one line: GB/s, µs per group and block, the daemon's CPU and,
# for GPU targets, the pinned H2D rate of the same run. BL_TIMEOUT bounds it
# (default 90 s).
bl() {
	timeout "${BL_TIMEOUT:-90}" "$K" bench-load "$M" --warmup 1 --daemon-pid "$pid" "$@" 2>&1 | grep -E 'GB/s|cpu|H2D' |
		awk '{$1=$1; printf "%s | ", $0} END {print ""}' |
		sed -E 's/^bench-load[^|]*\| //; s/ [0-9.]+ µs\/ioctl \(p50 [0-9.]+, p99 [0-9.]+\)//; s/[0-9]+ bytes in [0-9.]+ s //'
}

# fresh [FORMAT FLAGS...]: format S with the Llama-3-8B shape (6 GiB) and
# store 2,048 blocks in it through a mount of K, unmounted again. On a disk,
# pass --zero when fio will read the file (never-written space reads
# without disk I/O).
fresh() {
	"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force "$@" >/dev/null
	mnt "$K"
	"$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
	"$K" umount "$M"
}

# alternate ROUNDS FN: ROUNDS rounds, each mounting S with kvfs-prev then
# kvfs (both in D), running FN ROUND BUILD against the mount, and
# unmounting: the build before and this one in turn on the same store.
alternate() {
	local rounds=$1 fn=$2 round b
	for round in $(seq "$rounds"); do
		for b in kvfs-prev kvfs; do
			mnt "$D/$b"
			"$fn" "$round" "$b"
			"$D/$b" umount "$M"
		done
	done
}
