// Package nvmeint holds kvfs's tests that run inside QEMU's emulated NVMe
// controller (see run.sh): a store formatted on an NVMe namespace through
// the nvme engine, and a power-cut crash test. Outside the emulator (no
// /dev/ng0n1 and KVFS_NVME_DEV unset) every test skips.
package nvmeint
