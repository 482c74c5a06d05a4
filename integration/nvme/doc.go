// Package nvmeint holds kvfs's tests that run inside QEMU's emulated NVMe
// controller: a store formatted on an NVMe namespace and driven through the
// nvme engine, the kvfs CLI on the namespace, and a power-cut crash test
// spread over two boots. run.sh (make test-nvme) owns the rig: it installs
// QEMU and a guest kernel, builds static test binaries, boots with and
// without FDP, and reads the guest's exit status and its summary line.
//
// Outside the emulator (no /dev/ng0n1 and KVFS_NVME_DEV unset) every test
// skips, saying so; the crash tests run only in the boot that run.sh names
// through KVFS_MODE. Inside, a test may skip only for a reason it declares.
// The package holds no state between tests beyond the namespace itself,
// which each test formats first.
package nvmeint
