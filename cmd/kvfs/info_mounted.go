package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/store"
)

// A store a daemon holds cannot be opened by kvfs info (the daemon has its
// lock); info then answers from the daemon's own view, the mount's
// .kvfs/geometry and .kvfs/stats, after finding the mount of the store in
// the mount table (kvfs mount names each mount after its store's absolute path).

// mountOf is the mount point of the kvfs mount serving the store at path,
// from the mount table; "" when there is none.
func mountOf(path string) (string, error) {
	want, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	ms, err := fs.Mounts()
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.FSType != "fuse.kvfs" {
			continue
		}
		if fi, err := os.Stat(m.Source); err == nil && os.SameFile(fi, want) {
			return m.Mountpoint, nil
		}
	}
	return "", nil
}

// mountedInfo is info's report of a store held by the daemon mounted at
// mnt, read from mnt/.kvfs/geometry and mnt/.kvfs/stats. The ownership
// lease and the FDP state are not in them.
func mountedInfo(path, mnt string) (infoReport, error) {
	var geo fs.GeometryFile
	var stats struct {
		Engine    string `json:"engine"`
		SlotsUsed int64  `json:"slots_used"`
		SlotsFree int64  `json:"slots_free"`
		Blocks    int    `json:"blocks"`
		infoDRAM
	}
	for name, v := range map[string]any{"geometry": &geo, "stats": &stats} {
		b, err := os.ReadFile(filepath.Join(mnt, ".kvfs", name))
		if err != nil {
			return infoReport{}, err
		}
		if err := json.Unmarshal(b, v); err != nil {
			return infoReport{}, fmt.Errorf("%s: %w", filepath.Join(mnt, ".kvfs", name), err)
		}
	}
	created, err := time.Parse(time.RFC3339, geo.Created)
	if err != nil {
		return infoReport{}, fmt.Errorf("%s: created: %w", filepath.Join(mnt, ".kvfs", "geometry"), err)
	}
	r := infoReport{
		Path: path, MountedAt: mnt, UUID: geo.UUID, FormatVersion: geo.Version, Engine: stats.Engine,
		Geometry: infoGeometry{Layers: geo.Layers, KVHeads: geo.KVHeads, HeadDim: geo.HeadDim,
			BlockTokens: geo.BlockTokens, DType: geo.DType, Align: geo.Align},
		GroupsPerBlock: geo.GroupsPerBlock, GroupBytes: geo.GroupBytes,
		GroupStride: geo.GroupStride, HeaderBytes: geo.HeaderBytes, SlotBytes: geo.SlotBytes, Slots: geo.Slots,
		UsedSlots: stats.SlotsUsed, FreeSlots: stats.SlotsFree, Blocks: stats.Blocks,
		Size: geo.Size, Created: created.UTC(),
	}
	if stats.infoDRAM.Bytes > 0 {
		d := stats.infoDRAM
		r.DRAM = &d
	}
	if w, size, err := store.WrittenBytes(path); err == nil {
		r.WrittenBytes, r.fileBytes = &w, size
	}
	return r, nil
}

// lockedInfo answers kvfs info for a store another process holds (err, a
// store.ErrLocked): from its mount when it is mounted, else an error that
// says where to look.
func lockedInfo(path string, err error) (infoReport, error) {
	mnt, merr := mountOf(path)
	if merr != nil || mnt == "" {
		return infoReport{}, fmt.Errorf("%w; no kvfs mount of it is listed in /proc/mounts (a mount in another mount namespace: read MOUNT/.kvfs/geometry and MOUNT/.kvfs/stats there)", err)
	}
	r, rerr := mountedInfo(path, mnt)
	if rerr != nil {
		return infoReport{}, errors.Join(err, fmt.Errorf("mounted at %s, whose .kvfs/ could not be read: %w", mnt, rerr))
	}
	return r, nil
}
