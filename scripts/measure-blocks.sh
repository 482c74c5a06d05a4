#!/usr/bin/env bash
# Measurements of issue 11's ABI v2 (LOAD_BLOCKS) on a machine with many
# cores, as root: bench-load sweeps of v1 LOAD (511 groups per call) and v2
# LOAD_BLOCKS (NHD and HND targets) against fio on the same store file, the
# daemon's CPU per GB, one 1,000-block LOAD_BLOCKS from the disk store against
# fio, and the in-process control-path benchmark.
#
# Needs: KVFS (a kvfs binary), FIO (fio with io_uring), CTLTEST (the test
# binary of ./ctl: go test -c -o ctl.test ./ctl), STORE_DIRS (default "/dev/shm /var/tmp"). Output goes to stdout.
set -euo pipefail
KVFS=${KVFS:-bin/kvfs}
FIO=${FIO:-fio}
CTLTEST=${CTLTEST:-}
STORE_DIRS=${STORE_DIRS:-/dev/shm /var/tmp}
CALLS=${CALLS:-40}
BPC=${BPC:-128}
SIZE=${SIZE:-8GiB}
FILL=${FILL:-3000}
DISKBPC=${DISKBPC:-1000}
MNT=/mnt/kvfs-measure
mkdir -p "$MNT"

fio_sweep() { # file, direct, jobs...
	local f=$1 direct=$2
	shift 2
	for j in "$@"; do
		printf 'fio %s jobs=%d: ' "$(basename "$f")" "$j"
		"$FIO" --name=r --filename="$f" --rw=randread --bs=2M --ioengine=io_uring --iodepth=16 --numjobs="$j" \
			--direct="$direct" --time_based --runtime=3 --group_reporting --output-format=terse --terse-version=3 |
			awk -F';' '{printf "%.2f GB/s\n", $7*1024/1e9}'
	done
}

for dir in $STORE_DIRS; do
	store=$dir/kvfs-measure.kvfs
	rm -f "$store"
	echo "== store in $dir"
	# fio must not read never-written space: on a disk it costs no I/O, and
	# on tmpfs it is read from the zero page (cache-hot): on the 2-core VM
	# fio 8 jobs read a 6 GiB store file with 2,048 blocks stored at 36.2
	# GB/s as formatted, 17.6 with --zero.
	"$KVFS" format "$store" --size "$SIZE" --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --zero >/dev/null
	out=$("$KVFS" mount "$store" "$MNT" --daemon)
	echo "$out"
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
	"$KVFS" bench-load "$MNT" --groups-per-call 511 --calls 1 --fill "$FILL" >/dev/null
	if [ "$dir" = /dev/shm ]; then
		"$KVFS" bench-load "$MNT" --groups-per-call 511 --calls $((CALLS * 20)) --sweep --daemon-pid "$pid"
		"$KVFS" bench-load "$MNT" --blocks-per-call "$BPC" --layout nhd --calls "$CALLS" --sweep --daemon-pid "$pid"
		"$KVFS" bench-load "$MNT" --blocks-per-call "$BPC" --layout hnd --calls "$CALLS" --sweep --daemon-pid "$pid"
		fio_sweep "$store" 0 1 2 4 8 16
		"$KVFS" bench-load "$MNT" --blocks-per-call "$BPC" --layout hnd --calls "$CALLS" --jobs 8 --daemon-pid "$pid"
		fio_sweep "$store" 0 8
	else
		# One caller, one LOAD_BLOCKS of 1,000 random whole blocks, against
		# fio at QD 32, O_DIRECT, interleaved.
		for round in 1 2; do
			"$KVFS" bench-load "$MNT" --blocks-per-call "$DISKBPC" --layout hnd --calls 2 --warmup 0 --daemon-pid "$pid"
			"$FIO" --name=r --filename="$store" --rw=randread --bs=2M --ioengine=io_uring --iodepth=32 --direct=1 \
				--time_based --runtime=3 --output-format=terse --terse-version=3 |
				awk -F';' '{printf "fio disk QD32 O_DIRECT: %.2f GB/s\n", $7*1024/1e9}'
		done
	fi
	"$KVFS" umount "$MNT"
	rm -f "$store"
done

if [ -n "$CTLTEST" ]; then
	echo "== control path (in process)"
	"$CTLTEST" -test.run '^$' -test.bench BenchmarkLoadBlocks -test.benchtime 20x -test.count 3
fi
