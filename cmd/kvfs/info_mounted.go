package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/store"
)

// A store a daemon holds cannot be opened by kvfs info (the daemon has its
// lock); info then answers from the daemon's own view, the mount's
// .kvfs/geometry and .kvfs/stats, after finding the mount of the store in
// /proc/mounts (kvfs mount names each mount after its store's absolute path).

// mountOf is the mount point of the kvfs mount serving the store at path,
// from /proc/mounts; "" when there is none.
func mountOf(path string) (string, error) {
	want, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || fields[2] != "fuse.kvfs" {
			continue
		}
		if fi, err := os.Stat(unescapeMount(fields[0])); err == nil && os.SameFile(fi, want) {
			return unescapeMount(fields[1]), nil
		}
	}
	return "", sc.Err()
}

// unescapeMount undoes /proc/mounts' octal escapes (\040 for a space, \011,
// \012, \134).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
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
