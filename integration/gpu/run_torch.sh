#!/bin/bash
# PyTorch + kvfs on a GPU machine: formats stores, mounts
# them, runs hf_roundtrip.py (pin=True and REGISTER_CUDA), python/tests/
# test_hf_prefix.py on the GPU (both paths), tp_shards.py
# (tensor-parallel shard loads, one rank killed) and ttft.py, prints a
# summary. Needs root (mount(2), tmpfs), python3 with torch and transformers,
# a CUDA driver; no Go toolchain, no network.
#
#   integration/gpu/run_torch.sh KVFS_BIN WORKDIR [TTFT_TOKENS]
#
# WORKDIR holds the tmpfs store (a tmpfs mounted at WORKDIR/tmpfs) and the
# mount points; the disk store lives in /var/tmp (KVFS_DISK_DIR overrides).
# TTFT_TOKENS defaults to 4096,16384,32768. Exit status: 0 when the round trips
# passed (a REGISTER_CUDA column is n/a where the daemon lacks it) and the
# TTFT table was produced.
set -u
KVFS=$(readlink -f "${1:?usage: run_torch.sh KVFS_BIN WORKDIR [TTFT_TOKENS]}")
WORK=$(mkdir -p "${2:?WORKDIR}" && readlink -f "$2")
TOKENS=${3:-4096,16384,32768}
DISK_DIR=${KVFS_DISK_DIR:-/var/tmp/kvfs-torch}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH="$HERE/../../python${PYTHONPATH:+:$PYTHONPATH}"
mounts=()
fail=0
summary=()

cleanup() {
	for m in "${mounts[@]}"; do "$KVFS" umount "$m" >/dev/null 2>&1 || umount -l "$m" 2>/dev/null; done
	umount -l "$WORK/tmpfs" 2>/dev/null
	rm -f "$DISK_DIR"/*.store
}
trap cleanup EXIT

mkdir -p "$WORK/tmpfs" "$DISK_DIR"
if ! mountpoint -q "$WORK/tmpfs"; then
	mount -t tmpfs -o size=16g tmpfs "$WORK/tmpfs" || { echo "cannot mount a tmpfs on $WORK/tmpfs"; exit 1; }
fi

# mkstore NAME STORE_FILE SIZE GEOMETRY... -> mounts at $WORK/mnt-NAME, with
# the mount flags in $MOUNT_FLAGS.
mkstore() {
	local name=$1 file=$2 size=$3
	shift 3
	local mnt="$WORK/mnt-$name"
	mkdir -p "$mnt"
	"$KVFS" format "$file" --size "$size" --force "$@" || return 1
	# shellcheck disable=SC2086
	"$KVFS" mount "$file" "$mnt" --daemon --log-file "$WORK/$name.log" ${MOUNT_FLAGS:-} || { tail -20 "$WORK/$name.log"; return 1; }
	mounts+=("$mnt")
	echo "mounted $file ($size, $*) on $mnt"
}

echo "== environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
$PY -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' || exit 1
"$KVFS" --version 2>/dev/null || true

echo "== hf_roundtrip: random Llama (6 layers, GQA 8/2, head_dim 128), 1,024-token prompt, 32 greedy steps"
read -r -a HFGEO <<<"$($PY "$HERE/hf_roundtrip.py" --geometry)"
if mkstore hf "$WORK/tmpfs/hf.store" 256MiB "${HFGEO[@]}"; then
	for mode in pin cuda; do
		$PY "$HERE/hf_roundtrip.py" "$WORK/mnt-hf" "$WORK" --mode "$mode" 2>&1 | tee "$WORK/hf_$mode.out"
		rc=${PIPESTATUS[0]}
		case $rc in
		0) summary+=("hf_roundtrip $mode: PASS (logits bit-identical)") ;;
		3) summary+=("hf_roundtrip $mode: n/a (daemon without REGISTER_CUDA)") ;;
		*) summary+=("hf_roundtrip $mode: FAIL (exit $rc)"); fail=1 ;;
		esac
	done
else
	summary+=("hf_roundtrip: FAIL (store)"); fail=1
fi

echo "== test_hf_prefix on the GPU: kvfs.hf's prefix cache (REGISTER_CUDA, then pin=True), tiny random Llama"
if mkstore hp "$WORK/tmpfs/hp.store" 256MiB --layers 4 --kv-heads 2 --head-dim 128 --block-tokens 16 --dtype bf16; then
	for pin in 0 1; do
		(cd "$HERE/../../python/tests" && KVFS_TEST_DEVICE=cuda KVFS_TEST_PIN=$pin KVFS_BIN="$KVFS" \
			KVFS_MOUNT="$WORK/mnt-hp" PYTHONPATH="$HERE/../../python/tests:$PYTHONPATH" \
			$PY -m unittest -v test_hf_prefix) >"$WORK/hp_$pin.out" 2>&1
		rc=$?
		tail -3 "$WORK/hp_$pin.out"
		if [ $rc = 0 ]; then summary+=("test_hf_prefix pin=$pin: PASS ($(grep -o '^Ran [0-9]* tests' "$WORK/hp_$pin.out"))")
		else summary+=("test_hf_prefix pin=$pin: FAIL (exit $rc, $WORK/hp_$pin.out)"); fail=1; fi
	done
else
	summary+=("test_hf_prefix: FAIL (store)"); fail=1
fi

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
RANKS=$((NGPU > 2 ? NGPU : 2))
echo "== tp_shards: $RANKS tensor-parallel ranks on $NGPU GPU(s), one mount; one more rank killed mid-load"
read -r -a TPGEO <<<"$($PY "$HERE/tp_shards.py" --geometry)"
if mkstore tp "$WORK/tmpfs/tp.store" 512MiB "${TPGEO[@]}"; then
	for mode in pin cuda; do
		$PY "$HERE/tp_shards.py" "$WORK/mnt-tp" "$WORK" --ranks "$RANKS" --mode "$mode" --kill 2>&1 | tee "$WORK/tp_$mode.out"
		rc=${PIPESTATUS[0]}
		case $rc in
		0) summary+=("tp_shards $mode, $RANKS ranks on $NGPU GPU(s): PASS ($(grep -o '[0-9.]* GB/s' "$WORK/tp_$mode.out" | tr '\n' ' '))") ;;
		3) summary+=("tp_shards $mode: n/a (daemon without REGISTER_CUDA)") ;;
		*) summary+=("tp_shards $mode: FAIL (exit $rc)"); fail=1 ;;
		esac
	done
else
	summary+=("tp_shards: FAIL (store)"); fail=1
fi

echo "== ttft: Llama-3-8B-shaped, bf16, tokens $TOKENS"
read -r -a TGEO <<<"$($PY "$HERE/ttft.py" --geometry)"
ok=1
mkstore tmpfs "$WORK/tmpfs/ttft.store" 10GiB "${TGEO[@]}" || ok=0
mkstore disk "$DISK_DIR/ttft.store" 10GiB "${TGEO[@]}" || ok=0
MOUNT_FLAGS="--dram 12GiB" mkstore dram "$DISK_DIR/ttft-dram.store" 10GiB "${TGEO[@]}" || ok=0
if [ $ok = 1 ]; then
	$PY "$HERE/ttft.py" --tmpfs "$WORK/mnt-tmpfs" --disk "$WORK/mnt-disk" --dram "$WORK/mnt-dram" --tokens "$TOKENS" 2>&1 | tee "$WORK/ttft.out"
	rc=${PIPESTATUS[0]}
	if [ "$rc" = 0 ]; then summary+=("ttft: done (table above)"); else summary+=("ttft: FAIL (exit $rc)"); fail=1; fi
else
	summary+=("ttft: FAIL (stores)"); fail=1
fi

echo
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $fail
