#!/usr/bin/env bash
# The measurements of docs/performance.md, on any machine, as Markdown table
# rows on stdout (progress and skips on stderr). Run as root from the
# repository root (it formats stores, mounts FUSE and reads /dev/shm).
#
#   scripts/measure.sh SCENARIO...
#
# Scenarios (docs/performance.md has a section for each):
#   engine       the uring engine against fio: 1 MiB and 128 KiB O_DIRECT
#                random reads at QD 32 of one file on DISK
#   store        the store's batched reads (kvfs bench --blocks 1 --qd 16,
#                unmounted) against the engine's 1 MiB and 4 KiB reads, on DISK
#   load-v1      v1 LOAD of 511 groups per call (JOBS callers) from a tmpfs
#                store, against fio with as many jobs
#   load-blocks  LOAD_BLOCKS of BPC whole blocks into host targets, HND and
#                NHD, 8 callers, from a tmpfs store, against fio 8 jobs run
#                right after each build
#   stores       STORE_BLOCKS of STORE_BPC whole blocks per call from host
#                targets, NHD and HND, STORE_JOBS callers, into a tmpfs store
#                and a store on DISK, against fio random 2 MiB writes with as
#                many jobs (on DISK O_DIRECT, an fdatasync per STORE_BPC
#                writes, as each call is durable when it returns)
#   sweep        LOAD_BLOCKS HND and NHD and v1 LOAD at 1, 2, 4, 8, 16
#                callers, and fio at as many jobs (tmpfs)
#   cold         the first loads after a mount against the same loads warm
#   disk         one caller's LOAD_BLOCKS of DISK_BPC random blocks from a
#                store on DISK (into host memory; into GPU memory, HND and
#                NHD, when a GPU is present) against fio QD 32 O_DIRECT
#   load-gpu     LOAD_BLOCKS of GPU_BPC blocks into GPU memory, HND and NHD,
#                1 and 8 callers, direct and staged, against the pinned H2D
#                rate of the same run (needs a GPU)
#   layers       one prefix of LAYER_BPC different blocks loaded by one
#                caller layer by layer (K layers per LOAD_BLOCKS, K = 1, 2,
#                4, 8, then all in one call) into an HF target: host memory
#                and, with a GPU, REGISTER_CUDA; what kvfs.hf's layer-by-
#                layer loader pays for its calls; blocks of the fill
#                (random slots) and prefixes the caller stored first
#                (bench-load --stored-prefixes: consecutive slots)
#   dram         LOAD_BLOCKS of DRAM_BPC blocks, HND, 8 callers, from a
#                store on DISK without and with a DRAM tier of DRAM_SIZE
#                (kvfs mount --dram; DRAM_WS blocks stored, read once before
#                measuring so the tier holds them), and from a tmpfs store
#                of the same blocks; into host memory and, with a GPU, into
#                GPU memory (REGISTER_CUDA) against the pinned H2D rate of
#                the same run
#   dram-zipf    LOAD_BLOCKS as dram, each call's blocks drawn with Zipf(1.0)
#                popularity from DRAM_ZIPF_WS stored blocks (4 × the tier),
#                from the store on DISK without and with the tier (kvfs
#                bench-load --zipf 1.0 --working-set N), after as many
#                calls unmeasured with another seed
#   ttft         time to first token with a Llama-3-8B-shaped model,
#                integration/gpu/run_torch.sh (needs a GPU, torch, transformers)
#   ttft-cpu     integration/gpu/ttft.py on the CPU with a tiny random Llama
#                from a small tmpfs store (PY: a python with torch and
#                transformers, e.g. the venv `make test-python` builds)
#   python-threads scripts/ioctl-threads.py: what a Python client call leaves to the
#                process's other threads (Client.ioctl against fcntl.ioctl)
#   peers        LMCache's disk storage (local disk, buffered and O_DIRECT;
#                raw-block) against kvfs on DISK: PEER_CHUNKS chunks of 32
#                MiB stored, synced, page cache dropped, read back into host
#                memory, ROUNDS rounds (scripts/lmcache-vs-kvfs.py; needs
#                LMCACHE_PY, a python with lmcache installed)
#   control      the control path in process: ctl's BenchmarkLoadBlocks
#                (LOAD_BLOCKS, ns per block) and integration/ctl's
#                TestMeasureLoad (v1 LOAD, µs per group; needs the go tool)
#   all          every scenario above; those that need a GPU say so and skip
#
# Every row carries the daemon's CPU per GB moved (core-s/GB) where there is
# a daemon.
#
# Environment (defaults in brackets):
#   BIN=DIR        take kvfs (and ctl.test, ctlint.test) from DIR instead of
#                  building them (CGO_ENABLED=0 go build) into WORK
#   BUILDS="a b"   binaries in BIN (or WORK) measured in turn in each round on
#                  the same store, e.g. BUILDS="kvfs-base kvfs" [kvfs]
#   REVS="r1 r2"   git revisions to build as kvfs-r1, kvfs-r2 and measure in
#                  turn (sets BUILDS); e.g. REVS="main HEAD"
#   FIO=PATH       fio [fio from PATH]; FIO_SECONDS [3]; FIO_WARMUP seconds of
#                  fio unmeasured before each measured run [2]
#   ROUNDS [3]  BENCH_SECONDS per kvfs bench run [3]  WARMUP calls per caller [1]
#   SHM [/dev/shm]  DISK [/var/tmp]  directories of the tmpfs and disk stores
#   SIZE [6GiB]  FILL blocks stored [2048]  BPC [128]  CALLS per caller [20]
#   JOBS for load-v1 ["1 8"]  STORE_BPC [16]  STORE_JOBS ["1 4"]  DISK_BPC [1000]  GPU_BPC [1024]  LAYER_BPC [1024]
#   LAYER_SIZE: the layers store [10GiB: the fill and two prefixes of LAYER_BPC blocks]
#   DRAM_SIZE [768MiB]  DRAM_WS [192]  DRAM_BPC [16]  DRAM_ZIPF_WS [1536]
#   MOUNT_FLAGS    extra flags of every kvfs mount (e.g. --cpuprofile F)
#   TOKENS         ttft's token counts [4096,16384,32768; ttft-cpu: 256,1024]
#   PY             the python of ttft-cpu and python-threads [python3]
#   LMCACHE_PY     the python of peers, with lmcache [/var/tmp/lmc-venv/bin/python]
#   PEER_CHUNKS    peers' 32 MiB chunks per round [16]
#   WORK           scratch directory [a new one under /tmp, removed at exit]
#
# The store has the Llama-3-8B shape (32 layers, 8 KV heads, head_dim 128,
# 16 tokens per block, bf16: 2 MiB blocks of 512 groups of 4 KiB), formatted
# --zero so that fio reads only written space (never-written space reads
# from the zero page on tmpfs and costs no I/O on a disk, which inflates it).
set -uo pipefail

usage() {
	sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 2
}
[ $# -ge 1 ] || usage
case "$1" in -h | --help | help) usage ;; esac

ROOT=$(pwd)
[ -f "$ROOT/go.mod" ] && [ -d "$ROOT/cmd/kvfs" ] || {
	echo "measure.sh: run from the repository root" >&2
	exit 2
}
ROUNDS=${ROUNDS:-3}
SECONDS_RUN=${BENCH_SECONDS:-3}
WARMUP=${WARMUP:-1}
SHM=${SHM:-/dev/shm}
DISK=${DISK:-/var/tmp}
SIZE=${SIZE:-6GiB}
FILL=${FILL:-2048}
BPC=${BPC:-128}
CALLS=${CALLS:-20}
JOBS=${JOBS:-1 8}
STORE_BPC=${STORE_BPC:-16}
STORE_JOBS=${STORE_JOBS:-1 4}
DISK_BPC=${DISK_BPC:-1000}
GPU_BPC=${GPU_BPC:-1024}
LAYER_BPC=${LAYER_BPC:-1024}
LAYER_SIZE=${LAYER_SIZE:-10GiB}
DRAM_SIZE=${DRAM_SIZE:-768MiB}
DRAM_WS=${DRAM_WS:-192}
DRAM_BPC=${DRAM_BPC:-16}
DRAM_ZIPF_WS=${DRAM_ZIPF_WS:-1536}
FIO=${FIO:-fio}
FIO_SECONDS=${FIO_SECONDS:-3}
FIO_WARMUP=${FIO_WARMUP:-2}
MOUNT_FLAGS=${MOUNT_FLAGS:-}
OWN_WORK=0
if [ -z "${WORK:-}" ]; then
	WORK=$(mktemp -d /tmp/kvfs-measure.XXXXXX)
	OWN_WORK=1
fi
mkdir -p "$WORK"
M=$WORK/mnt
mkdir -p "$M"
STORES=()
MOUNTED=""

log() { echo "measure: $*" >&2; }

cleanup() {
	[ -n "$MOUNTED" ] && "$MOUNTED" umount "$M" >/dev/null 2>&1
	for s in "${STORES[@]}"; do rm -f "$s"; done
	[ "$OWN_WORK" = 1 ] && rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- binaries ---------------------------------------------------------------

gobuild() { # OUT: build kvfs into OUT
	command -v go >/dev/null || {
		echo "measure.sh: no go tool; set BIN to a folder holding the binaries" >&2
		exit 2
	}
	CGO_ENABLED=0 go build -o "$1" ./cmd/kvfs
}

if [ -n "${REVS:-}" ]; then
	BUILDS=""
	for r in $REVS; do
		name=kvfs-$(echo "$r" | tr -c 'A-Za-z0-9._\n-' '_')
		log "building $r as $name"
		src=$WORK/src-$name
		mkdir -p "$src"
		git archive "$r" | tar -x -C "$src" || exit 1
		(cd "$src" && gobuild "$WORK/$name") || exit 1
		rm -rf "$src"
		BUILDS="$BUILDS $name"
	done
	D=$WORK
elif [ -n "${BIN:-}" ]; then
	D=$(cd "$BIN" && pwd)
else
	log "building kvfs (CGO_ENABLED=0)"
	gobuild "$WORK/kvfs" || exit 1
	D=$WORK
fi
BUILDS=${BUILDS:-kvfs}
FIRST=$(echo $BUILDS | cut -d' ' -f1)
K=$D/$FIRST
for b in $BUILDS; do
	[ -x "$D/$b" ] || {
		echo "measure.sh: $D/$b is not an executable" >&2
		exit 2
	}
done
if ! command -v "$FIO" >/dev/null; then
	log "no fio ($FIO): reference columns stay empty (set FIO=path)"
	FIO=""
fi
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && COMMIT="$COMMIT+dirty"

have_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }
needs_gpu() {
	have_gpu && return 0
	log "$1 needs a GPU (nvidia-smi found none): skipped"
	echo
	echo "$1: skipped, needs a GPU"
	return 1
}

# --- helpers ----------------------------------------------------------------

num() { # KEY: the first number of "KEY": in stdin (one JSON object)
	sed -n "s/.*\"$1\": *\([-0-9.e+]*\).*/\1/p" | head -1
}
ratio() { # A B: A/B to two places, or - when either is missing
	awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'
}
fmt() { awk -v x="${1:-}" 'BEGIN { if (x == "") print "-"; else printf "%.2f", x }'; }
fmt3() { awk -v x="${1:-}" 'BEGIN { if (x == "") print "-"; else printf "%.3f", x }'; }

# fio_gbps FILE BS QD JOBS DIRECT [FLAGS...]: random reads of FILE, GB/s.
# FIO_WARMUP seconds go first, unmeasured (a fio run right after a daemon
# exits reads below the next ones on a busy machine).
fio_gbps() {
	[ -n "$FIO" ] || return 0
	local f=$1 bs=$2 qd=$3 j=$4 direct=$5
	shift 5
	local a=(--name=r --filename="$f" --rw=randread --bs="$bs" --ioengine=io_uring --iodepth="$qd" --numjobs="$j"
		--direct="$direct" --time_based --group_reporting --randrepeat=0 --norandommap
		--output-format=terse --terse-version=3 "$@")
	[ "$FIO_WARMUP" -gt 0 ] && "$FIO" "${a[@]}" --runtime="$FIO_WARMUP" >/dev/null 2>&1
	"$FIO" "${a[@]}" --runtime="$FIO_SECONDS" 2>/dev/null | awk -F';' 'NF > 7 { printf "%.2f", $7 * 1024 / 1e9; exit }'
}

# fio_write_gbps FILE JOBS DIRECT [FLAGS...]: random 2 MiB writes of FILE,
# QD 16 per job, GB/s; FIO_WARMUP seconds first, unmeasured.
fio_write_gbps() {
	[ -n "$FIO" ] || return 0
	local f=$1 j=$2 direct=$3
	shift 3
	local a=(--name=w --filename="$f" --rw=randwrite --bs=2M --ioengine=io_uring --iodepth=16 --numjobs="$j"
		--direct="$direct" --time_based --group_reporting --randrepeat=0 --norandommap
		--output-format=terse --terse-version=3 "$@")
	[ "$FIO_WARMUP" -gt 0 ] && "$FIO" "${a[@]}" --runtime="$FIO_WARMUP" >/dev/null 2>&1
	"$FIO" "${a[@]}" --runtime="$FIO_SECONDS" 2>/dev/null | awk -F';' 'NF > 48 { printf "%.2f", $48 * 1024 / 1e9; exit }'
}

# fresh NAME DIR: format the store DIR/kvfs-measure-NAME.kvfs (S) --zero and
# store FILL random blocks in it through a mount of the first build.
fresh() {
	S=$2/kvfs-measure-$1.kvfs
	STORES+=("$S")
	log "formatting $S ($SIZE) and storing $FILL blocks"
	"$K" format "$S" --size "$SIZE" --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 \
		--force --zero >/dev/null || exit 1
	mnt "$K" || exit 1
	"$K" bench-load "$M" --groups-per-call 511 --calls 1 --warmup 0 --fill "$FILL" >/dev/null || exit 1
	umnt
}

# mnt KVFS [FLAGS...]: mount S on M as a daemon; pid is its process.
mnt() {
	local k=$1 out
	shift
	# shellcheck disable=SC2086
	out=$("$k" mount "$S" "$M" --daemon $MOUNT_FLAGS "$@") || {
		echo "measure.sh: mount failed: $out" >&2
		return 1
	}
	pid=$(echo "$out" | sed -n 's/.*(pid \([0-9]*\),.*/\1/p')
	MOUNTED=$k
}
umnt() {
	"$MOUNTED" umount "$M" >/dev/null
	MOUNTED=""
}

# bl ARGS...: one kvfs bench-load against the mount; sets GBPS, CPU (daemon
# core-s/GB) and H2D (the pinned H2D rate of GPU runs) from its JSON, and
# BL_JSON to the JSON.
bl() {
	local j
	j=$(timeout "${BL_TIMEOUT:-180}" "$MOUNTED" bench-load "$M" --daemon-pid "$pid" --json "$@" 2>"$WORK/bl.err")
	BL_JSON=$j
	GBPS=$(echo "$j" | num gbps)
	CPU=$(echo "$j" | num cpu_s_per_gb)
	H2D=$(echo "$j" | num h2d_gbps)
	[ -n "$GBPS" ] || log "bench-load $* failed: $(tail -2 "$WORK/bl.err")"
}

# bench ARGS...: one kvfs bench (unmounted store); sets GBPS, CPU (the
# process's core-s/GB).
bench() {
	local j
	j=$("$1" bench "$S" --seconds "$SECONDS_RUN" --json "${@:2}" 2>"$WORK/b.err")
	GBPS=$(echo "$j" | num gbps)
	CPU=$(echo "$j" | num cpu_s_per_gb)
	[ -n "$GBPS" ] || log "bench ${*:2} failed: $(tail -2 "$WORK/b.err")"
}

header() { # TITLE COLUMNS...
	echo
	echo "$1 ($(hostname), $(nproc) cores, $(date -u +%Y-%m-%d), commit $COMMIT)"
	echo
	shift
	row "$@"
	echo "|$(printf -- '---|%.0s' "$@")"
}
row() {
	local out="|" x
	for x in "$@"; do out+=" $x |"; done
	echo "$out"
}

# --- scenarios --------------------------------------------------------------

s_engine() {
	fresh engine "$DISK"
	header "Engine against fio: O_DIRECT random reads, QD 32, $DISK" round build "io size" "kvfs GB/s (core-s/GB)" "fio GB/s" "÷ fio"
	for r in $(seq "$ROUNDS"); do
		for io in 1MiB 128KiB; do
			for b in $BUILDS; do
				bench "$D/$b" --engine uring --io-size "$io" --qd 32
				local g=$GBPS c=$CPU
				local f
				f=$(fio_gbps "$S" "${io/iB/}" 32 1 1 --fixedbufs --registerfiles)
				row "$r" "$b" "$io" "$(fmt "$g") ($(fmt3 "$c"))" "${f:--}" "$(ratio "$g" "$f")"
			done
		done
	done
}

s_store() {
	fresh store "${STORE_DIR:-$DISK}"
	header "Store batched reads: whole blocks per store.Read, unmounted, $(dirname "$S")" round build "store.Read of 1 block, 16 in flight" "engine 1 MiB, QD 32" "engine 4 KiB, QD 32" "store ÷ engine 1 MiB"
	for r in $(seq "$ROUNDS"); do
		for b in $BUILDS; do
			bench "$D/$b" --engine uring --blocks 1 --qd 16
			local s=$GBPS sc=$CPU
			bench "$D/$b" --engine uring --io-size 1MiB --qd 32
			local e=$GBPS
			bench "$D/$b" --engine uring --io-size 4KiB --qd 32
			row "$r" "$b" "$(fmt "$s") ($(fmt3 "$sc"))" "$(fmt "$e")" "$(fmt "$GBPS")" "$(ratio "$s" "$e")"
		done
	done
}

s_load_v1() {
	fresh v1 "$SHM"
	header "v1 LOAD: 511 groups per call into host memory, tmpfs store" round build callers "GB/s (core-s/GB)" "fio 2 MiB QD 16, jobs = callers" "÷ fio"
	for r in $(seq "$ROUNDS"); do
		for b in $BUILDS; do
			local line=()
			mnt "$D/$b" || return 1
			for j in $JOBS; do
				bl --groups-per-call 511 --calls $((CALLS * 10)) --jobs "$j" --warmup "$WARMUP"
				line+=("$j:$GBPS:$CPU")
			done
			umnt
			for x in "${line[@]}"; do
				IFS=: read -r j g c <<<"$x"
				local f
				f=$(fio_gbps "$S" 2M 16 "$j" 0)
				row "$r" "$b" "$j" "$(fmt "$g") ($(fmt3 "$c"))" "${f:--}" "$(ratio "$g" "$f")"
			done
		done
	done
}

s_load_blocks() {
	fresh blocks "$SHM"
	header "LOAD_BLOCKS into host memory: $BPC whole blocks per call, 8 callers, tmpfs store" round build "HND GB/s (core-s/GB)" "NHD GB/s (core-s/GB)" "fio 8 jobs after it" "HND ÷ fio" "NHD ÷ fio"
	for r in $(seq "$ROUNDS"); do
		for b in $BUILDS; do
			mnt "$D/$b" || return 1
			bl --blocks-per-call "$BPC" --layout hnd --calls "$CALLS" --jobs 8 --warmup "$WARMUP"
			local h=$GBPS hc=$CPU
			bl --blocks-per-call "$BPC" --layout nhd --calls "$CALLS" --jobs 8 --warmup "$WARMUP"
			local n=$GBPS nc=$CPU
			umnt
			local f
			f=$(fio_gbps "$S" 2M 16 8 0)
			row "$r" "$b" "$(fmt "$h") ($(fmt3 "$hc"))" "$(fmt "$n") ($(fmt3 "$nc"))" "${f:--}" "$(ratio "$h" "$f")" "$(ratio "$n" "$f")"
		done
	done
}

s_layers() {
	local into=host SIZE=$LAYER_SIZE
	have_gpu && into="host cuda"
	fresh layers "$SHM"
	header "One prefix of $LAYER_BPC blocks loaded layer by layer into an HF target, one caller, tmpfs store: blocks of the fill (random slots), or prefixes the caller stored first, each with one STORE_BLOCKS (consecutive slots)" round build into blocks "1 layer per call GB/s (core-s/GB)" "2" "4" "8" "all 32 in one call" "1 ÷ all"
	for r in $(seq "$ROUNDS"); do
		for b in $BUILDS; do
			mnt "$D/$b" || return 1
			for i in $into; do
				for how in fill stored; do
					local cols=() g1="" a=(--into "$i")
					[ "$i" = host ] && a=()
					[ "$how" = stored ] && a+=(--stored-prefixes 2)
					for k in 1 2 4 8 32; do
						# the same bytes at each K: CALLS prefixes of 32 layers
						bl --blocks-per-call "$LAYER_BPC" --layout hf --layers-per-call "$k" --calls $((CALLS * 32 / k)) --jobs 1 --warmup $((32 / k)) "${a[@]}"
						cols+=("$(fmt "$GBPS") ($(fmt3 "$CPU"))")
						[ "$k" = 1 ] && g1=$GBPS
					done
					row "$r" "$b" "$i" "$how" "${cols[@]}" "$(ratio "$g1" "$GBPS")"
				done
			done
			umnt
		done
	done
}

s_stores() {
	local dir
	for dir in "$SHM" "$DISK"; do
		fresh "stores" "$dir"
		# fio writes a file of its own beside the store, as large
		local ff=$dir/kvfs-measure-stores.fio direct=0 sync=()
		STORES+=("$ff")
		[ "$dir" = "$DISK" ] && direct=1 sync=(--fdatasync="$STORE_BPC")
		# written whole first, as the store is: a first write of a page
		# (tmpfs) or an extent (a disk) costs more than the next ones
		[ -n "$FIO" ] && "$FIO" --name=lay --filename="$ff" --rw=write --bs=2M --size="$SIZE" --direct="$direct" >/dev/null 2>&1
		header "STORE_BLOCKS of $STORE_BPC whole blocks per call from host targets, store in $dir" round build callers "NHD GB/s (core-s/GB)" "HND GB/s (core-s/GB)" "fio 2 MiB writes, jobs = callers" "NHD ÷ fio"
		for r in $(seq "$ROUNDS"); do
			for b in $BUILDS; do
				local line=()
				mnt "$D/$b" || return 1
				for j in $STORE_JOBS; do
					bl --store --blocks-per-call "$STORE_BPC" --layout nhd --calls "$CALLS" --jobs "$j" --warmup "$WARMUP"
					local n=$GBPS nc=$CPU
					bl --store --blocks-per-call "$STORE_BPC" --layout hnd --calls "$CALLS" --jobs "$j" --warmup "$WARMUP"
					line+=("$j:$n:$nc:$GBPS:$CPU")
				done
				umnt
				for x in "${line[@]}"; do
					IFS=: read -r j n nc h hc <<<"$x"
					local f
					f=$(fio_write_gbps "$ff" "$j" "$direct" --size="$SIZE" "${sync[@]}")
					row "$r" "$b" "$j" "$(fmt "$n") ($(fmt3 "$nc"))" "$(fmt "$h") ($(fmt3 "$hc"))" "${f:--}" "$(ratio "$n" "$f")"
				done
			done
		done
		rm -f "$S" "$ff"
	done
}

# sweep_col LAYOUT|v1: bench-load --sweep; prints "callers gbps cpu" lines.
sweep_col() {
	local a=(--blocks-per-call "$BPC" --layout "$1" --calls "$CALLS")
	[ "$1" = v1 ] && a=(--groups-per-call 511 --calls $((CALLS * 10)))
	timeout "${BL_TIMEOUT:-600}" "$MOUNTED" bench-load "$M" "${a[@]}" --sweep --warmup "$WARMUP" --daemon-pid "$pid" --json 2>/dev/null |
		tr '}' '\n' | while read -r o; do
		local j g c
		j=$(echo "$o" | num jobs)
		g=$(echo "$o" | num gbps)
		c=$(echo "$o" | num cpu_s_per_gb)
		[ -n "$j" ] && echo "$j $g $c"
	done
}

s_sweep() {
	fresh sweep "$SHM"
	for b in $BUILDS; do
		mnt "$D/$b" || return 1
		sweep_col nhd >"$WORK/nhd"
		sweep_col hnd >"$WORK/hnd"
		sweep_col v1 >"$WORK/v1"
		umnt
		header "Sweep: $b, $BPC whole blocks per LOAD_BLOCKS, v1 LOAD of 511 groups, tmpfs store" callers "NHD GB/s (core-s/GB)" "HND GB/s (core-s/GB)" "v1 LOAD GB/s" "fio, jobs = callers" "HND ÷ fio"
		for j in 1 2 4 8 16; do
			local n h v f
			n=$(awk -v j="$j" '$1 == j { printf "%.2f (%.3f)", $2, $3 }' "$WORK/nhd")
			h=$(awk -v j="$j" '$1 == j { printf "%.2f (%.3f)", $2, $3 }' "$WORK/hnd")
			v=$(awk -v j="$j" '$1 == j { printf "%.2f", $2 }' "$WORK/v1")
			f=$(fio_gbps "$S" 2M 16 "$j" 0)
			row "$j" "${n:--}" "${h:--}" "${v:--}" "${f:--}" "$(ratio "${h%% *}" "$f")"
		done
	done
}

s_cold() {
	fresh cold "$SHM"
	header "First loads after a mount: 8 callers × 2 calls of $BPC HND blocks, no warm-up, then the same again" round build "first loads GB/s (core-s/GB)" "again GB/s (core-s/GB)"
	for r in $(seq "$ROUNDS"); do
		for b in $BUILDS; do
			mnt "$D/$b" || return 1
			bl --blocks-per-call "$BPC" --layout hnd --calls 2 --jobs 8 --warmup 0
			local g=$GBPS c=$CPU
			bl --blocks-per-call "$BPC" --layout hnd --calls 2 --jobs 8 --warmup 0
			umnt
			row "$r" "$b" "$(fmt "$g") ($(fmt3 "$c"))" "$(fmt "$GBPS") ($(fmt3 "$CPU"))"
		done
	done
}

s_disk() {
	fresh disk "$DISK"
	local gpu=0
	have_gpu && gpu=1
	[ $gpu = 1 ] || log "disk: no GPU, host targets only"
	header "Disk store: one caller's LOAD_BLOCKS of $DISK_BPC random blocks, $DISK" round build "host GB/s (core-s/GB)" "cuda HND GB/s (core-s/GB)" "cuda NHD GB/s (core-s/GB)" "fio 2 MiB QD 32 O_DIRECT" "host ÷ fio" "cuda CPU ÷ host CPU"
	for r in $(seq "$ROUNDS"); do
		local rows=()
		for b in $BUILDS; do
			mnt "$D/$b" || return 1
			bl --blocks-per-call "$DISK_BPC" --layout hnd --calls 2 --jobs 1 --warmup 1
			local h=$GBPS hc=$CPU ch="-" nh="-" cc=""
			if [ $gpu = 1 ]; then
				bl --blocks-per-call "$DISK_BPC" --layout hnd --calls 2 --jobs 1 --warmup 1 --into cuda
				ch="$(fmt "$GBPS") ($(fmt3 "$CPU"))"
				cc=$CPU
				bl --blocks-per-call "$DISK_BPC" --layout nhd --calls 2 --jobs 1 --warmup 1 --into cuda
				nh="$(fmt "$GBPS") ($(fmt3 "$CPU"))"
			fi
			umnt
			rows+=("$b|$h|$hc|$ch|$nh|$cc")
		done
		local f
		f=$(fio_gbps "$S" 2M 32 1 1)
		for x in "${rows[@]}"; do
			IFS='|' read -r b h hc ch nh cc <<<"$x"
			row "$r" "$b" "$(fmt "$h") ($(fmt3 "$hc"))" "$ch" "$nh" "${f:--}" "$(ratio "$h" "$f")" "$(ratio "$cc" "$hc")"
		done
	done
}

s_load_gpu() {
	needs_gpu load-gpu || return 0
	fresh gpu "$SHM"
	header "LOAD_BLOCKS into GPU memory: $GPU_BPC whole blocks per call, tmpfs store; × H2D = ÷ the pinned H2D rate of the same run" round build path layout callers "GB/s (core-s/GB)" "× H2D" "host GB/s"
	for r in $(seq "$ROUNDS"); do
		for b in $BUILDS; do
			for mode in direct staged; do
				mnt "$D/$b" --gpu-direct=$([ $mode = direct ] && echo true || echo false) || return 1
				# The first GPU registration opens the device and, direct,
				# registers the store file with it in the background.
				"$MOUNTED" bench-load "$M" --blocks-per-call 64 --layout hnd --calls 1 --into cuda >/dev/null 2>&1
				sleep 3
				for l in hnd nhd; do
					for j in 1 8; do
						local c=$((j == 1 ? 5 : 2)) host="-"
						if [ $mode = direct ]; then
							bl --blocks-per-call "$GPU_BPC" --layout $l --calls $c --jobs $j --warmup 1
							host=$(fmt "$GBPS")
						fi
						bl --blocks-per-call "$GPU_BPC" --layout $l --calls $c --jobs $j --warmup 1 --into cuda
						row "$r" "$b" "$mode" "$l" "$j" "$(fmt "$GBPS") ($(fmt3 "$CPU"))" "$(ratio "$GBPS" "$H2D")" "$host"
					done
				done
				umnt
			done
		done
	done
}

s_dram() {
	local fill=$FILL sd ss into intos="host"
	have_gpu && intos="host cuda"
	FILL=$DRAM_WS
	fresh dram-disk "$DISK"
	sd=$S
	fresh dram-shm "$SHM"
	ss=$S
	FILL=$fill
	header "DRAM tier: LOAD_BLOCKS of $DRAM_BPC random blocks per call, HND, 8 callers, $DRAM_WS blocks stored, tier $DRAM_SIZE; × H2D = ÷ the pinned H2D rate of the same run" round build store into "GB/s (core-s/GB)" "tier hit ratio" "× H2D"
	for r in $(seq "$ROUNDS"); do
		for b in $BUILDS; do
			for cfg in disk dram tmpfs; do
				case $cfg in
				disk) S=$sd mnt "$D/$b" || return 1 ;;
				dram) S=$sd mnt "$D/$b" --dram "$DRAM_SIZE" || return 1 ;;
				tmpfs) S=$ss mnt "$D/$b" || return 1 ;;
				esac
				# Every block read a few times over, unmeasured: the tier
				# holds the working set before the measured calls.
				[ $cfg = dram ] && "$MOUNTED" bench-load "$M" --blocks-per-call 64 --layout hnd --jobs 1 --warmup 0 \
					--calls $((DRAM_WS * 4 / 64 + 1)) >/dev/null 2>&1
				for into in $intos; do
					bl --blocks-per-call "$DRAM_BPC" --layout hnd --jobs 8 --calls 8 --warmup 2 --into "$into"
					local hit="-" x="-"
					[ $cfg = dram ] && hit=$(fmt "$(echo "$BL_JSON" | num dram_hit_ratio)")
					[ "$into" = cuda ] && x=$(ratio "$GBPS" "$H2D")
					row "$r" "$b" "$cfg" "$into" "$(fmt "$GBPS") ($(fmt3 "$CPU"))" "$hit" "$x"
				done
				umnt
			done
		done
	done
}

s_dram_zipf() {
	local fill=$FILL ws=$DRAM_ZIPF_WS
	FILL=$ws
	fresh dram-zipf "$DISK"
	FILL=$fill
	header "DRAM tier, Zipf(1.0): LOAD_BLOCKS of $DRAM_BPC blocks per call drawn from $ws stored blocks, HND, 8 callers, tier $DRAM_SIZE" round build store "GB/s (core-s/GB)" "tier hit ratio"
	local z=(--blocks-per-call "$DRAM_BPC" --layout hnd --jobs 8 --zipf 1.0 --working-set "$ws")
	for r in $(seq "$ROUNDS"); do
		for b in $BUILDS; do
			for cfg in disk dram; do
				if [ $cfg = dram ]; then
					mnt "$D/$b" --dram "$DRAM_SIZE" || return 1
				else
					mnt "$D/$b" || return 1
				fi
				"$MOUNTED" bench-load "$M" "${z[@]}" --calls 16 --warmup 0 --seed 2 >/dev/null 2>&1
				bl "${z[@]}" --calls 16 --warmup 2
				local hit="-"
				[ $cfg = dram ] && hit=$(fmt "$(echo "$BL_JSON" | num dram_hit_ratio)")
				row "$r" "$b" "$cfg" "$(fmt "$GBPS") ($(fmt3 "$CPU"))" "$hit"
				umnt
			done
		done
	done
}

s_ttft() {
	needs_gpu ttft || return 0
	python3 -c 'import torch, transformers' 2>/dev/null || {
		log "ttft needs python3 with torch and transformers: skipped"
		return 0
	}
	echo
	echo "TTFT with a real model ($(hostname), $(date -u +%Y-%m-%d), commit $COMMIT)"
	bash integration/gpu/run_torch.sh "$K" "$WORK/torch" "${TOKENS:-4096,16384,32768}"
}

s_ttft_cpu() {
	local py=${PY:-python3}
	"$py" -c 'import torch, transformers' 2>/dev/null || {
		log "ttft-cpu needs PY=python with torch and transformers: skipped"
		return 0
	}
	S=$SHM/kvfs-measure-ttft-cpu.kvfs
	STORES+=("$S")
	"$K" format "$S" --size 64MiB --layers 4 --kv-heads 2 --head-dim 128 --block-tokens 16 --dtype bf16 \
		--force >/dev/null || return 1
	mnt "$K" || return 1
	echo
	echo "TTFT on the CPU, tiny random Llama ($(hostname), $(nproc) cores, $(date -u +%Y-%m-%d), commit $COMMIT)"
	echo
	"$py" integration/gpu/ttft.py --device cpu --tiny --mount "$M" --tokens "${TOKENS:-256,1024}" \
		--repeat "$ROUNDS" | grep -v '^JSON: '
	local rc=${PIPESTATUS[0]}
	umnt
	return "$rc"
}

s_python_threads() {
	S=$SHM/kvfs-measure-threads.kvfs
	STORES+=("$S")
	"$K" format "$S" --size 1GiB --layers 32 --kv-heads 8 --head-dim 128 --block-tokens 16 --dtype bf16 \
		--force >/dev/null || return 1
	mnt "$K" || return 1
	echo
	echo "Python client calls and the process's other threads ($(hostname), $(nproc) cores, $(date -u +%Y-%m-%d), commit $COMMIT)"
	echo
	"${PY:-python3}" scripts/ioctl-threads.py "$M" --rounds "$ROUNDS"
	local rc=$?
	umnt
	return "$rc"
}

s_peers() {
	local py=${LMCACHE_PY:-/var/tmp/lmc-venv/bin/python}
	"$py" -c 'import lmcache' 2>/dev/null || {
		log "peers needs LMCACHE_PY=python with lmcache installed (see scripts/lmcache-vs-kvfs.py): skipped"
		return 0
	}
	echo
	echo "LMCache and kvfs on one disk, $DISK ($(hostname), $(nproc) cores, $(date -u +%Y-%m-%d), commit $COMMIT)"
	echo
	"$py" scripts/lmcache-vs-kvfs.py --kvfs "$K" --dir "$DISK" --chunks "${PEER_CHUNKS:-16}" --rounds "$ROUNDS"
}

s_control() {
	local ct=$D/ctl.test it=$D/ctlint.test
	if [ ! -x "$ct" ] || [ ! -x "$it" ]; then
		command -v go >/dev/null || {
			log "control needs ctl.test and ctlint.test in BIN, or the go tool: skipped"
			return 0
		}
		CGO_ENABLED=0 go test -c -o "$WORK/ctl.test" ./ctl || return 1
		CGO_ENABLED=0 go test -c -o "$WORK/ctlint.test" ./integration/ctl || return 1
		ct=$WORK/ctl.test it=$WORK/ctlint.test
	fi
	header "Control-path cost: LOAD_BLOCKS in process, 1,024 whole blocks per call" benchmark "ns per block outside the store (ctl-ns/block)"
	"$ct" -test.run '^$' -test.bench 'BenchmarkLoadBlocks' -test.benchtime 20x -test.count "$ROUNDS" 2>/dev/null |
		awk '/^BenchmarkLoadBlocks/ { for (i = 3; i < NF; i++) if ($(i + 1) == "ctl-ns/block") print "| " $1 " | " $i " |" }'
	echo
	echo "Control-path cost: v1 LOAD through the mount, tmpfs store, posix engine (integration/ctl TestMeasureLoad)"
	echo
	KVFS_MEASURE=1 KVFS_MEASURE_DIR="$SHM" KVFS_MEASURE_ENGINE=posix KVFS_MEASURE_ROUNDS="$ROUNDS" \
		"$it" -test.run 'TestMeasureLoad$' -test.v 2>&1 | grep -vE '^(=== RUN|--- PASS|PASS$|ok )'
}

run() {
	case "$1" in
	engine) s_engine ;;
	store) s_store ;;
	load-v1) s_load_v1 ;;
	load-blocks) s_load_blocks ;;
	layers) s_layers ;;
	stores) s_stores ;;
	sweep) s_sweep ;;
	cold) s_cold ;;
	disk) s_disk ;;
	load-gpu) s_load_gpu ;;
	dram) s_dram ;;
	dram-zipf) s_dram_zipf ;;
	ttft) s_ttft ;;
	ttft-cpu) s_ttft_cpu ;;
	python-threads) s_python_threads ;;
	peers) s_peers ;;
	control) s_control ;;
	all) for s in engine store load-v1 load-blocks layers stores sweep cold disk load-gpu dram dram-zipf control ttft ttft-cpu python-threads peers; do run $s; done ;;
	*)
		echo "measure.sh: unknown scenario $1" >&2
		usage
		;;
	esac
}

for s in "$@"; do
	run "$s"
	# Each scenario formats its own store; drop it before the next.
	for x in "${STORES[@]}"; do rm -f "$x"; done
	STORES=()
done
