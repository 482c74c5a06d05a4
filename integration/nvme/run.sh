#!/usr/bin/env bash
# Boots QEMU's emulated NVMe controller and runs kvfs's NVMe tests inside it.
#
#   integration/nvme/run.sh            (or: make test-nvme)
#
# Stages (each prints its time):
#   apt      QEMU >= 8 from bookworm-backports (installed on the host through a
#            private apt config under the cache dir; /etc/apt is not touched),
#            busybox-static and a Debian kernel downloaded and unpacked in the
#            cache dir.
#   build    static test binaries (CGO_ENABLED=0 go test -c -tags kvfs_nocuda: no libc in the guest).
#   initrd   busybox initramfs: /init mounts proc/sys/devtmpfs, insmods the
#            NVMe modules (dependencies from each module's depends=), waits
#            for /dev/ng0n1, runs the tests, reports their exit code through
#            isa-debug-exit.
#   fdp      boot with an FDP subsystem (8 reclaim unit handles): all tests,
#            then the crash writer, which prints each acknowledged batch;
#            QEMU is killed mid-write (a power cut).
#   nofdp    boot with a plain namespace (engine without placement).
#   crash-check  boot on the fdp boot's disk image: every acknowledged
#            group reads back, none reads corrupt.
#   fabric   boot with the FDP subsystem whose namespace the guest exports
#            through the kernel's NVMe over Fabrics target (nvmet-tcp,
#            configfs) on 127.0.0.1:4420 and connects to as a host
#            (nvme-tcp, /dev/nvme-fabrics): kvfs bench on the local then
#            the fabric namespace, all tests on the fabric namespace, then
#            the crash writer there; crash-check-fabric checks it through
#            the fabric after the power cut. See docs/scale-out.md.
#
# Environment: KVFS_NVME_CACHE (default integration/nvme/.cache),
# KVFS_NVME_RUN (go test -run regexp for the nvme and engine/nvme package tests),
# KVFS_NVME_BOOTS (which of "fdp nofdp fabric" to boot, default all),
# KVFS_NVME_TIMEOUT (seconds per boot, default 240), KVFS_NVME_CRASH_ACKS
# (acknowledged batches before the power cut, default 60), KVFS_NVME_KEEP=1
# keeps the work dir. Exit status: 0 when every boot's tests passed and
# every skip is one the boot declares (allowed_skips below). The last line
# is "N passed, N failed, N skipped (N undeclared)" over all boots.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${KVFS_NVME_CACHE:-$here/.cache}
boot_timeout=${KVFS_NVME_TIMEOUT:-240}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
work=$(mktemp -d "$cache/run.XXXXXX")
cleanup() {
	local p
	for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
	if [[ ${KVFS_NVME_KEEP:-0} != 1 ]]; then rm -rf "$work"; else echo "rig: kept $work"; fi
}
trap cleanup EXIT

t_all=$(date +%s.%N)
declare -a summary=()
stage_start() { t_stage=$(date +%s.%N); echo "=== rig: $1"; }
stage_end() {
	local d
	d=$(awk -v a="$t_stage" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
	summary+=("$(printf '%-8s %6ss  %s' "$1" "$d" "${2:-}")")
	echo "=== rig: $1 took ${d}s ${2:-}"
}
die() { echo "rig: $*" >&2; exit 2; }

# ---------------------------------------------------------------- apt
stage_start apt
export DEBIAN_FRONTEND=noninteractive
apt_dir=$cache/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/sources.list.d" "$apt_dir/deb"
# The Debian mirror the host already uses (bookworm-backports lives on it).
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
	[[ -f $f ]] || continue
	mirror=$(awk '/^URIs:/{print $2}' "$f" | grep -v -- '-security' | head -1 || true)
	[[ -n $mirror ]] && break
done
if [[ -z $mirror && -f /etc/apt/sources.list ]]; then
	mirror=$(awk '$1=="deb" && $3 ~ /^bookworm/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list || true)
fi
[[ -n $mirror ]] || die "no Debian mirror found in /etc/apt"
cat >"$apt_dir/sources.list.d/kvfs-nvme.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt_opts=(-q -o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$apt_dir/sources.list.d"
	-o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir" -o "Dir::Cache::archives=$apt_dir/archives"
	-o Acquire::Languages=none -o APT::Sandbox::User=root -o DPkg::Lock::Timeout=600)
apt_updated=0
apt_update() {
	if [[ $apt_updated == 0 ]]; then
		apt-get "${apt_opts[@]}" -o 'Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false' update >"$work/apt-update.log" 2>&1 ||
			{ cat "$work/apt-update.log"; die "apt-get update failed"; }
		apt_updated=1
		touch "$apt_dir/updated"
		rm -f "$cache/kernel.pkg" # re-resolve the kernel against the new lists
	fi
}
# Lists older than a day are refreshed; fresh ones are reused.
if ! find "$apt_dir/updated" -mmin -1440 2>/dev/null | grep -q .; then
	apt_update
fi
qemu_ok() {
	command -v qemu-system-x86_64 >/dev/null || return 1
	local v
	v=$(qemu-system-x86_64 --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p' | head -1)
	[[ -n $v && $v -ge 8 ]]
}
if ! qemu_ok; then
	echo "rig: installing qemu-system-x86 from bookworm-backports"
	apt-get "${apt_opts[@]}" -y --no-install-recommends -t bookworm-backports install qemu-system-x86 >"$work/apt-install.log" 2>&1 ||
		{ tail -30 "$work/apt-install.log"; die "installing qemu-system-x86 failed"; }
	qemu_ok || die "qemu-system-x86_64 >= 8 not found after install"
fi
qemu_version=$(qemu-system-x86_64 --version | head -1)

# apt_fetch PACKAGE: download PACKAGE's .deb into the cache (once) and print its path.
apt_fetch() {
	local pkg=$1 deb
	deb=$(ls "$apt_dir/deb/${pkg}_"*.deb 2>/dev/null | head -1 || true)
	if [[ -z $deb ]]; then
		(cd "$apt_dir/deb" && apt-get "${apt_opts[@]}" download "$pkg" >"$work/apt-download.log" 2>&1) || {
			apt_update
			(cd "$apt_dir/deb" && apt-get "${apt_opts[@]}" download "$pkg" >"$work/apt-download.log" 2>&1) ||
				{ cat "$work/apt-download.log"; die "apt-get download $pkg failed"; }
		}
		deb=$(ls "$apt_dir/deb/${pkg}_"*.deb | head -1)
	fi
	echo "$deb"
}

bb=$cache/busybox/bin/busybox
if [[ ! -x $bb ]]; then
	deb=$(apt_fetch busybox-static)
	rm -rf "$cache/busybox.tmp" && mkdir -p "$cache/busybox.tmp"
	dpkg-deb -x "$deb" "$cache/busybox.tmp"
	mkdir -p "$cache/busybox/bin" && mv "$cache/busybox.tmp/bin/busybox" "$bb" && rm -rf "$cache/busybox.tmp"
fi

# The kernel: whatever linux-image-amd64 of bookworm-backports depends on.
kpkg_file=$cache/kernel.pkg
if [[ ! -s $kpkg_file ]]; then
	apt_update
	apt-cache "${apt_opts[@]}" show linux-image-amd64/bookworm-backports 2>/dev/null |
		sed -n 's/^Depends: *\(linux-image-[^ ,]*\).*/\1/p' | head -1 >"$kpkg_file"
fi
kpkg=$(cat "$kpkg_file")
[[ -n $kpkg ]] || die "cannot resolve the backports kernel package"
kdir=$cache/kernel/$kpkg
if [[ ! -f $kdir/.done ]]; then
	deb=$(apt_fetch "$kpkg")
	rm -rf "$kdir" && mkdir -p "$kdir"
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$kdir" --wildcards './boot/vmlinuz-*' './lib/modules/*'
	touch "$kdir/.done"
fi
vmlinuz=$(ls "$kdir"/boot/vmlinuz-* | head -1)
kver=${vmlinuz##*/vmlinuz-}
mods=$kdir/lib/modules/$kver
stage_end apt "($qemu_version; kernel $kver)"

# ---------------------------------------------------------------- build
stage_start build
mkdir -p "$work/root/bin"
# Stripped: the guest kernel unpacks every byte of the initramfs under TCG.
(cd "$repo" && CGO_ENABLED=0 go test -c -tags kvfs_nocuda -ldflags='-s -w' -o "$work/root/bin/nvme.test" ./nvme/)
(cd "$repo" && CGO_ENABLED=0 go test -c -tags kvfs_nocuda -ldflags='-s -w' -o "$work/root/bin/nvmeengine.test" ./engine/nvme/)
(cd "$repo" && CGO_ENABLED=0 go test -c -tags kvfs_nocuda -ldflags='-s -w' -o "$work/root/bin/nvmeint.test" ./integration/nvme/)
# The CLI, for TestStoreCLI. A CLI that does not build fails the rig (the
# test would only skip, which the rig does not accept either).
(cd "$repo" && CGO_ENABLED=0 go build -tags kvfs_nocuda -ldflags='-s -w' -o "$work/root/bin/kvfs" ./cmd/kvfs) ||
	die "cmd/kvfs does not build"
stage_end build

# ---------------------------------------------------------------- initrd
stage_start initrd
root=$work/root
mkdir -p "$root"/{proc,sys,dev,tmp,lib/modules,etc}
cp "$bb" "$root/bin/busybox"
# Modules to load, dependencies first; built-in drivers need nothing.
declare -A modpath=() loaded=()
order=()
while IFS= read -r f; do
	n=${f##*/}
	n=${n%.ko*}
	modpath[${n//_/-}]=$f
done < <(find "$mods/kernel" -name '*.ko*')
unxz() { if command -v xz >/dev/null; then xz -dc "$1"; else "$bb" xzcat "$1"; fi; }
add_mod() {
	local n=${1//_/-} d deps
	[[ -n ${loaded[$n]:-} ]] && return
	loaded[$n]=1
	local f=${modpath[$n]:-}
	if [[ -z $f ]]; then
		grep -qE "/${n//-/[-_]}\.ko$" "$mods/modules.builtin" 2>/dev/null && return
		die "module $n not found in $kver"
	fi
	case $f in
	*.xz) deps=$(unxz "$f" | tr '\0' '\n' | sed -n 's/^depends=//p') ;;
	*.zst) deps=$(zstd -dcq "$f" | tr '\0' '\n' | sed -n 's/^depends=//p') ;;
	*) deps=$(tr '\0' '\n' <"$f" | sed -n 's/^depends=//p') ;;
	esac
	for d in ${deps//,/ }; do add_mod "$d"; done
	case $f in
	*.xz) unxz "$f" >"$root/lib/modules/$n.ko" ;;
	*.zst) zstd -dcq "$f" >"$root/lib/modules/$n.ko" ;;
	*) cp "$f" "$root/lib/modules/$n.ko" ;;
	esac
	order+=("$n")
}
add_mod nvme
# NVMe over Fabrics on TCP, both ends: the target (nvmet, nvmet-tcp; they
# pull configfs) and the host (nvme-tcp, nvme-fabrics).
add_mod nvmet-tcp
add_mod nvme-tcp
printf '%s\n' "${order[@]}" >"$root/etc/modules"
cp "$here/init.sh" "$root/init"
chmod +x "$root/init"
# Uncompressed: copying is cheaper than inflating in the emulated CPU.
(cd "$root" && find . | "$bb" cpio -o -H newc 2>/dev/null >"$work/initrd.cpio")
stage_end initrd "(modules: ${order[*]:-built-in}; $(du -h "$work/initrd.cpio" | cut -f1))"

# ---------------------------------------------------------------- boots
# boot NAME DISK FDP(on|off) CMDLINE-VARS [KILL-AFTER-ACKS]
# Sets boot_rc to the tests' exit code (or 100+ for a rig failure).
boot() {
	local name=$1 disk=$2 fdp=$3 vars=$4 kill_after=${5:-0}
	local log=$work/$name.log devs
	if [[ $fdp == on ]]; then
		devs=(-device "nvme-subsys,id=subsys0,nqn=subsys0,fdp=on,fdp.runs=64M,fdp.nrg=1,fdp.nruh=8"
			-device "nvme,id=nvme0,serial=kvfsfdp,subsys=subsys0,mdts=7"
			-device "nvme-ns,drive=nvm,bus=nvme0,nsid=1,logical_block_size=4096,physical_block_size=4096,fdp.ruhs=0-7")
	else
		devs=(-device "nvme,id=nvme0,serial=kvfsplain,mdts=7"
			-device "nvme-ns,drive=nvm,bus=nvme0,nsid=1,logical_block_size=4096,physical_block_size=4096")
	fi
	: >"$log"
	qemu-system-x86_64 -accel tcg -cpu max -m 1536M -smp 1 \
		-display none -monitor none -serial "file:$log" -no-reboot \
		-kernel "$vmlinuz" -initrd "$work/initrd.cpio" \
		-append "console=ttyS0 panic=-1 loglevel=4 KVFS_BOOT=$name $vars" \
		-drive "file=$disk,if=none,id=nvm,format=raw,cache=writeback" \
		"${devs[@]}" \
		-device isa-debug-exit,iobase=0xf4,iosize=0x04 </dev/null 2>"$work/$name.qemu.err" &
	local qpid=$! killed=0 start=$SECONDS t0 booted=""
	t0=$(date +%s.%N)
	# Stream the console while QEMU runs (without go test's RUN lines).
	tail -n +1 -F "$log" --pid=$qpid 2>/dev/null |
		grep -a --line-buffered -vE '^=== (RUN|PAUSE|CONT|NAME)|seed#' | sed -u "s/^/[$name] /" &
	local tpid=$!
	# Watch for the power-cut point and the time limit.
	while kill -0 $qpid 2>/dev/null; do
		if [[ -z $booted ]] && grep -aq '^KVFS-RIG: /dev/ng0n1 after' "$log"; then
			booted=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
			echo "rig: $name: /init saw /dev/ng0n1 ${booted}s after QEMU started"
		fi
		if ((kill_after > 0)) && (($(grep -ac '^KVFS-ACK ' "$log" || true) >= kill_after)); then
			kill -KILL $qpid 2>/dev/null && killed=1
			break
		fi
		if ((SECONDS - start > boot_timeout)); then
			kill -KILL $qpid 2>/dev/null && killed=2
			break
		fi
		sleep 0.05
	done
	local qrc=0
	wait $qpid || qrc=$?
	wait $tpid 2>/dev/null || true
	[[ -s $work/$name.qemu.err ]] && sed "s/^/[$name] qemu: /" "$work/$name.qemu.err"
	local rc_line
	rc_line=$(tr -d '\r' <"$log" | grep -a '^KVFS-RC [0-9][0-9]*$' | tail -1 | awk '{print $2}' || true)
	local tests_rc
	tests_rc=$(tr -d '\r' <"$log" | grep -a '^KVFS-TESTS-RC [0-9][0-9]*$' | tail -1 | awk '{print $2}' || true)
	if ((killed == 1)); then
		boot_rc=${tests_rc:-0}
		echo "rig: $name: power cut (QEMU killed) after $(grep -ac '^KVFS-ACK ' "$log") acknowledged writes"
	elif ((killed == 2)); then
		boot_rc=101
		echo "rig: $name: timed out after ${boot_timeout}s"
	elif [[ -n $rc_line ]] && ((qrc == (((rc_line & 0x7f) << 1) | 1))); then
		boot_rc=$rc_line
	else
		boot_rc=100
		echo "rig: $name: QEMU exited $qrc without a test result (QEMU error, kernel panic or init failure?)"
		tail -20 "$log" | sed "s/^/[$name] /"
	fi
}

results=()
overall=0
record() { # NAME RC
	local s=pass
	(($2 != 0)) && { s="FAIL ($2)"; overall=1; }
	results+=("$(printf '%-12s %s' "$1" "$s")")
}
# The skips each boot declares: "TestName=text of its skip message". Any
# other skip (a missing binary, a device that did not appear, a test that
# lost its precondition) fails the rig: inside the rig every test has what
# it needs, so a skip means something is broken.
declare -A allowed_skips=(
	[fdp]="TestEngineNoFDP=booted with FDP"
	[nofdp]="TestEnginePlacement=booted without FDP"
	[fabric]="TestEnginePlacement=booted without FDP"
	[crash-check-fabric]=""
	[crash-check]=""
)
n_pass=0 n_fail=0 n_skip=0 n_bad_skip=0
# skips LOG: one "TestName|message" line per top-level skip (go test -v
# prints the skip message on the line before the verdict).
skips() {
	tr -d '\r' <"$1" | awk '
		/^[ \t]+[^ \t]+_test\.go:[0-9]+: / { msg = $0; sub(/^[ \t]+[^ \t]+_test\.go:[0-9]+: /, "", msg); next }
		/^--- SKIP: / { print $3 "|" msg; msg = ""; next }
		/^(=== RUN|--- )/ { msg = "" }'
}
go_summary() { # NAME LOG: count the boot's top-level test verdicts, list failures and skips
	local p f k name msg ok a bad=0
	p=$(grep -ac '^--- PASS' "$2" || true)
	f=$(grep -ac '^--- FAIL' "$2" || true)
	k=$(grep -ac '^--- SKIP' "$2" || true)
	n_pass=$((n_pass + p)) n_fail=$((n_fail + f)) n_skip=$((n_skip + k))
	results+=("$(printf '  %-12s tests: %d passed, %d failed, %d skipped' "$1" "$p" "$f" "$k")")
	while IFS= read -r l; do results+=("      $l"); done < <(grep -aE '^--- FAIL' "$2" || true)
	while IFS='|' read -r name msg; do
		[[ -n $name ]] || continue
		ok=0
		while IFS= read -r a; do
			[[ -n $a && $name == "${a%%=*}" && $msg == *"${a#*=}"* ]] && ok=1
		done <<<"${allowed_skips[$1]:-}"
		if ((ok)); then
			results+=("      --- SKIP: $name (declared: $msg)")
		else
			results+=("      --- SKIP: $name: $msg  <- NOT a declared skip of this boot: rig fails")
			bad=$((bad + 1))
		fi
	done < <(skips "$2")
	if ((bad > 0)); then
		n_bad_skip=$((n_bad_skip + bad))
		overall=1
	fi
}

run_boot() { # NAME FDP VARS
	stage_start "$1"
	local disk=$work/$1.img
	truncate -s 1G "$disk"
	boot "$1" "$disk" "$2" "$3"
	record "$1" "$boot_rc"
	stage_end "$1" "(rc $boot_rc)"
	go_summary "$1" "$work/$1.log"
	rm -f "$disk"
}

run_re=${KVFS_NVME_RUN:-.}
boots=" ${KVFS_NVME_BOOTS:-fdp nofdp fabric} "
want_boot() { [[ $boots == *" $1 "* ]]; }
crash_disk=$work/crash.img

# crash_pair NAME VARS CHECK-VARS: boot NAME on an FDP namespace with VARS, all tests,
# then the crash writer until the rig cuts the power after some
# acknowledged batches; then boot crash-check-NAME on the same disk image:
# every acknowledged group must read back.
crash_pair() {
	local name=$1 vars=$2 checkvars=$3 disk=$work/$1.img acked check sfx=""
	[[ $name == fdp ]] || sfx=-$name
	check=crash-check$sfx
	stage_start "$name"
	truncate -s 1G "$disk"
	boot "$name" "$disk" on "KVFS_FDP=on KVFS_RUN=$run_re KVFS_MODE=crash-write $vars" "${KVFS_NVME_CRASH_ACKS:-60}"
	record "$name" "$boot_rc"
	go_summary "$name" "$work/$name.log"
	acked=$(tr -d '\r' <"$work/$name.log" | grep -a '^KVFS-ACK [0-9][0-9]*$' | awk '{print $2}' | sort -n | tail -1 || true)
	stage_end "$name" "(rc $boot_rc)"
	stage_start "$check"
	if [[ -z $acked ]]; then
		record "crash-write$sfx" 102
		results+=("$(printf '%-12s no batch was acknowledged before the power cut' "crash-write$sfx")")
	else
		results+=("$(printf '%-12s power cut after batch %s was acknowledged' "crash-write$sfx" "$acked")")
		boot "$check" "$disk" on "KVFS_FDP=on KVFS_MODE=crash-check KVFS_ACKED=$acked $checkvars"
		record "$check" "$boot_rc"
		go_summary "$check" "$work/$check.log"
		while IFS= read -r l; do results+=("      $l"); done < <(tr -d '\r' <"$work/$check.log" | grep -a '^KVFS-CRASH ' || true)
	fi
	stage_end "$check" "(rc $boot_rc)"
	rm -f "$disk"
}

# Boot 1 and 2: FDP namespace, then the power-cut check.
want_boot fdp && crash_pair fdp "" ""

# Boot 3: plain namespace (no FDP: the engine's fallback path).
want_boot nofdp && run_boot nofdp off "KVFS_FDP=off KVFS_RUN=$run_re"

# Boot 4 and 5: the FDP namespace exported by the kernel's NVMe/TCP target
# on the guest's loopback; the tests, the benchmarks (local namespace first,
# then the fabric one, same boot) and the power cut all on the fabric
# namespace.
if want_boot fabric; then
	crash_pair fabric "KVFS_FABRIC=on KVFS_BENCH=on" "KVFS_FABRIC=on"
	while IFS= read -r l; do results+=("      $l"); done < <(tr -d '\r' <"$work/fabric.log" | grep -a -e '^KVFS-BENCH ' -e '^KVFS-RIG: connected' || true)
fi

total=$(awk -v a="$t_all" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
echo
echo "=== rig summary (kernel $kver, $qemu_version)"
printf '  %s\n' "${summary[@]}"
printf '  %s\n' "${results[@]}"
echo "  total    ${total}s"
((n_fail > 0)) && overall=1
echo "$n_pass passed, $n_fail failed, $n_skip skipped ($n_bad_skip undeclared)"
exit $overall
