#!/usr/bin/env bash
# GPU path on the H200 (issue 12): device tests, pinned H2D, bench-load host
# vs cuda (IPC) vs pinned (client-pinned host targets, client's own copy) on
# a tmpfs and a disk store, fio beside the disk store.
# BIN (default: this script's folder) holds kvfs, gpu.test (integration/gpu),
# ctl.test, fio, ipc_probe.py (or PROBE=path). As out/dev-gpu/run.sh: run from
# the repo root with out/dev-gpu carried. Needs root, /dev/fuse, python3+torch
# (for the IPC probe only). About 5 minutes.
set -uo pipefail
D=${BIN:-$(cd "$(dirname "$0")" && pwd)}
KVFS=$D/kvfs
FIO=$D/fio
R=${OUT:-/tmp}/dev-gpu-results
mkdir -p "$R"
SUM=$R/summary.txt
: >"$SUM"
say() { echo "$*" | tee -a "$SUM"; }
MNT=${MNT:-/mnt/kvfs-gpu}
# Sizes (defaults: the H200 run): store file, blocks filled, blocks per call.
SIZE=${SIZE:-6GiB}
FILL=${FILL:-2048}
BPC=${BPC:-1024}
DISKBPC=${DISKBPC:-1000}
NHDBPC=${NHDBPC:-256}
DIRS=${DIRS:-/dev/shm /var/tmp}
mkdir -p "$MNT"

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader | tee "$R/gpu.txt"
say "gpu: $(head -1 "$R/gpu.txt")"
nproc; uname -r

echo "== integration/gpu tests"
if "$D/gpu.test" -test.v -test.count=1 -test.timeout=300s >"$R/gpu-tests.txt" 2>&1; then
	say "integration/gpu: PASS ($(grep -c '^--- PASS' "$R/gpu-tests.txt") passed, $(grep -c '^--- SKIP' "$R/gpu-tests.txt") skipped)"
else
	say "integration/gpu: FAIL"
fi
grep -E '^(=== RUN|--- |PASS|FAIL|ok)|_test.go' "$R/gpu-tests.txt" | tail -40
"$D/ctl.test" -test.count=1 -test.run 'CUDA' >"$R/ctl-tests.txt" 2>&1 && say "ctl CUDA tests (fake devices): PASS" || say "ctl CUDA tests: FAIL"

echo "== IPC handle probe"
timeout 120 python3 "${PROBE:-$(dirname "$0")/ipc-probe.py}" 2>&1 | tee "$R/ipc-probe.txt" | grep ipc-probe
grep ipc-probe "$R/ipc-probe.txt" >>"$SUM"

echo "== pinned H2D"
"$KVFS" bench-h2d --sizes 256KiB,1MiB,4MiB,16MiB --seconds 1 | tee "$R/h2d.txt"
sed 's/^/h2d: /' "$R/h2d.txt" >>"$SUM"

fio_disk() { # file bs qd
	"$FIO" --name=r --filename="$1" --rw=randread --bs="$2" --ioengine=io_uring --iodepth="$3" --direct=1 \
		--time_based --runtime=3 --output-format=terse --terse-version=3 | awk -F';' '{printf "%.2f", $7*1024/1e9}'
}

# load LABEL JOBS CALLS INTO BLOCKS_PER_CALL [LAYOUT]: one bench-load line, JSON kept.
load() {
	local label=$1 jobs=$2 calls=$3 into=$4 bpc=$5 lay=${6:-hnd}
	local f="$R/load-$label-$into-$lay-j$jobs-b$bpc.json"
	# A row that runs past ROWTIMEOUT seconds is cut (and reported FAILED)
	# so one slow path cannot take the whole device budget.
	if timeout "${ROWTIMEOUT:-45}" "$KVFS" bench-load "$MNT" --blocks-per-call "$bpc" --layout "$lay" --calls "$calls" --warmup 1 --jobs "$jobs" \
		--into "$into" --daemon-pid "$pid" --json >"$f" 2>"$f.err"; then
		python3 - "$f" "$label" <<'PY' | tee -a "$SUM"
import json, sys
r = json.load(open(sys.argv[1]))
line = f"load {sys.argv[2]:8s} {r['layout']} into={r.get('into','host'):7s} jobs={r['jobs']:2d} blocks/call={r['blocks_per_call']} {r['gbps']:7.2f} GB/s {r['us_per_block']:8.2f} us/block daemon {r['cpu_s_per_gb']:.3f} core-s/GB not_ok={r.get('not_ok_blocks',0)}"
for d in r.get("per_device") or []:
    line += f" | cuda:{d['device']} {d['gbps']:.2f} GB/s, pinned H2D {d['h2d_gbps']:.2f} GB/s at {d['h2d_chunk']} B, ratio {d['gbps']/d['h2d_gbps']:.2f}"
print(line)
PY
	else
		say "load $label into=$into jobs=$jobs: FAILED: $(tail -2 "$f.err")"
	fi
}

for dir in $DIRS; do
	label=tmpfs
	[ "$dir" = /var/tmp ] && label=disk
	store=$dir/kvfs-gpu.kvfs
	rm -f "$store"
	echo "== store in $dir ($label)"
	"$KVFS" format "$store" --size "$SIZE" --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 >/dev/null || { say "format $dir failed"; continue; }
	out=$("$KVFS" mount "$store" "$MNT" --daemon --gpu-staging-buffers 32 --gpu-staging-size 16MiB --gpu-depth 16) || { say "mount failed: $out"; continue; }
	echo "$out"
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
	"$KVFS" bench-load "$MNT" --groups-per-call 511 --calls 1 --warmup 0 --fill "$FILL" >/dev/null || say "fill failed"
	if [ "$label" = tmpfs ]; then
		for j in 1 8 16; do
			calls=$((j == 1 ? 6 : (j == 8 ? 2 : 1)))
			load tmpfs $j $calls host "$BPC"
			load tmpfs $j $calls cuda "$BPC"
			load tmpfs $j $calls pinned "$BPC"
		done
		# vLLM's NHD layout: one 2D copy per group (HND: one copy per
		# (layer, kind) of a block).
		load tmpfs 8 1 host "$NHDBPC" nhd
		load tmpfs 8 1 cuda "$NHDBPC" nhd
	else
		for round in 1 2; do
			load disk 1 2 host "$DISKBPC"
			load disk 1 2 cuda "$DISKBPC"
			load disk 1 2 pinned "$DISKBPC"
			say "fio disk bs=2M QD32 O_DIRECT: $(fio_disk "$store" 2M 32) GB/s"
		done
		load disk 8 1 host "$DISKBPC"
		load disk 8 1 cuda "$DISKBPC"
		say "fio disk bs=2M QD128 O_DIRECT: $(fio_disk "$store" 2M 128) GB/s"
	fi
	cp "$(sed -n 's/.*log \(.*\))$/\1/p' <<<"$out")" "$R/daemon-$label.log" 2>/dev/null
	"$KVFS" umount "$MNT"
	# The same store with the checksum on the GPU (--gpu-verify gpu): the
	# store reads unverified, the CRC32C kernel checks where groups land.
	out=$("$KVFS" mount "$store" "$MNT" --daemon --gpu-staging-buffers 32 --gpu-staging-size 16MiB --gpu-depth 16 --gpu-verify gpu) || { say "mount --gpu-verify gpu failed: $out"; rm -f "$store"; continue; }
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
	if [ "$label" = tmpfs ]; then
		for j in 1 8 16; do
			calls=$((j == 1 ? 6 : (j == 8 ? 2 : 1)))
			load tmpfs-gv $j $calls cuda "$BPC"
		done
	else
		load disk-gv 1 2 cuda "$DISKBPC"
		load disk-gv 8 1 cuda "$DISKBPC"
	fi
	cp "$(sed -n 's/.*log \(.*\))$/\1/p' <<<"$out")" "$R/daemon-$label-gv.log" 2>/dev/null
	"$KVFS" umount "$MNT"
	rm -f "$store"
done

echo
echo "================ SUMMARY ================"
cat "$SUM"
