#!/usr/bin/env bash
# Where the daemon's time goes on a tmpfs store under many callers: per
# thread kind CPU (Go threads vs io-wq workers), a Go CPU and mutex profile,
# perf (when the machine has it), and the v2 LOAD_BLOCKS rate for several
# ring counts and IOSQE_ASYNC choices, beside fio on the same file.
#
# BIN (default out/prof) holds kvfs and fio, built with CGO_ENABLED=0, and
# optionally kvfs-old (an earlier build, for a before/after in the same
# run). Run as root from the repo root; profiles go to $OUT (default /tmp).
set -u
D=$(cd "${BIN:-out/prof}" && pwd)
K=$D/kvfs
O=${OUT:-/tmp}
export PATH=$D:$PATH
nproc; uname -r
lscpu | grep -E 'Model name|NUMA node|Socket|Thread|L3' || true
command -v perf || echo "no perf"
S=/dev/shm/kvfs-prof.kvfs
M=/mnt/kvfs-prof
mkdir -p "$M"
"$K" format "$S" --size 6GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 --force >/dev/null
# threads PID: CPU ticks per thread kind (comm without digits).
threads() {
	cat /proc/"$1"/task/*/stat 2>/dev/null | awk '{c=$2; gsub(/[()]/,"",c); sub(/[-_:0-9]+$/,"",c); u[c]+=$14; s[c]+=$15; n[c]++}
		END{for(k in u) printf "  %s threads=%d user=%d sys=%d\n",k,n[k],u[k],s[k]}'
}
mountit() {
	out=$("$K" mount "$S" "$M" --daemon "$@")
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
	echo "mount $* -> pid $pid"
}
bl() {
	echo "-- $*  (threads before)"
	threads "$pid"
	timeout 60 "$K" bench-load "$M" --warmup 1 --daemon-pid "$pid" "$@" 2>&1 | grep -E 'GB/s|cpu|error' | head -3
	echo "   (threads after)"
	threads "$pid"
}
mountit --cpuprofile "$O/cpu.pprof" --mutexprofile "$O/mutex.pprof"
"$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill 2048 >/dev/null
bl --blocks-per-call 128 --layout hnd --calls 20 --jobs 8
bl --blocks-per-call 128 --layout nhd --calls 20 --jobs 8
if command -v perf >/dev/null; then
	"$K" bench-load "$M" --blocks-per-call 128 --layout hnd --calls 60 --jobs 8 >/dev/null 2>&1 &
	sleep 1
	perf record -a -g -o "$O/perf.data" -- sleep 3 >/dev/null 2>&1
	wait
	perf report -i "$O/perf.data" --stdio --no-children --sort comm,sym 2>/dev/null | grep -v '^$' | grep -E '^ +[0-9]' | head -60
fi
"$K" umount "$M"
for bin in kvfs-old kvfs; do
	[ -x "$D/$bin" ] || continue
	K=$D/$bin
	cfgs=("--rings 0")
	[ "$bin" = kvfs ] && cfgs+=("--inline-reads off")
	for cfg in "${cfgs[@]}"; do
		echo "== $bin $cfg"
		mountit $cfg
		for l in hnd nhd; do
			for j in 8 16; do
				echo "-- $l jobs=$j"
				timeout 60 "$K" bench-load "$M" --warmup 1 --daemon-pid "$pid" --blocks-per-call 128 --layout $l --calls $((160 / j)) --jobs $j 2>&1 | grep -E 'GB/s|cpu|error' | head -3
			done
		done
		"$K" umount "$M"
	done
done
for j in 8 16; do
	fio --name=r --filename="$S" --rw=randread --bs=2M --ioengine=io_uring --iodepth=16 --numjobs=$j --direct=0 \
		--time_based --runtime=3 --group_reporting --output-format=terse --terse-version=3 |
		awk -F';' -v j=$j '{printf "fio 2M QD16 jobs=%d %.2f GB/s usr=%s sys=%s\n", j, $7*1024/1e9, $88, $89}'
done
rm -f "$S"
# The disk store against fio: the last section of scripts/measure-h200.sh.
