package crc32c

import _ "embed"

// PTX is the compiled kernel module (crc32c.ptx, generated from crc32c.cu by
// scripts/gen-ptx.py), loaded with cuModuleLoadData.
//
//go:embed crc32c.ptx
var PTX []byte

// The kernels' names in PTX.
const (
	kernelInit   = "kvfs_crc32c_init"
	kernelSum    = "kvfs_crc32c"
	kernelVerify = "kvfs_crc32c_verify"
	kernelZero   = "kvfs_zero_groups"
	kernelLand   = "kvfs_crc32c_land"
)
