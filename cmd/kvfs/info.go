package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvfs/kvfs/internal/bytesize"
	"github.com/kvfs/kvfs/nvme"
	"github.com/kvfs/kvfs/store"
)

// infoOptions are the flags of kvfs info.
type infoOptions struct {
	storeFlags
	json bool
}

// infoGeometry is the geometry as info reports it.
type infoGeometry struct {
	Layers      int    `json:"layers"`
	KVHeads     int    `json:"kv_heads"`
	HeadDim     int    `json:"head_dim"`
	BlockTokens int    `json:"block_tokens"`
	DType       string `json:"dtype"`
	Align       int    `json:"align"`
}

// infoReport is kvfs info's output.
type infoReport struct {
	Path           string       `json:"path"`
	UUID           string       `json:"uuid"`
	FormatVersion  uint32       `json:"format_version"`
	Engine         string       `json:"engine"`
	Geometry       infoGeometry `json:"geometry"`
	GroupsPerBlock int          `json:"groups_per_block"`
	GroupBytes     int          `json:"group_bytes"`
	GroupStride    int64        `json:"group_stride"`
	HeaderBytes    int64        `json:"header_bytes"`
	SlotBytes      int64        `json:"slot_bytes"`
	Slots          int64        `json:"slots"`
	UsedSlots      int64        `json:"used_slots"`
	FreeSlots      int64        `json:"free_slots"`
	Blocks         int          `json:"blocks"`
	Size           int64        `json:"size"`
	// WrittenBytes is how much of a store file holds written data
	// (store.WrittenBytes); absent for a device. The rest reads as zeros
	// without disk I/O and converts on its first write (format --zero).
	WrittenBytes *int64    `json:"written_bytes,omitempty"`
	Created      time.Time `json:"created"`
	fileBytes    int64     // the store file's size, with WrittenBytes
	FDP          *infoFDP  `json:"fdp,omitempty"` // only on the nvme engine
	// Attachment is how the NVMe namespace is attached: its controller
	// paths with transport (pcie, tcp, rdma, fc, loop) and address. Only
	// on the nvme engine, and only when sysfs says.
	Attachment *nvme.Attachment `json:"attachment,omitempty"`
	// Owner is the store's ownership lease (docs/scale-out.md), absent
	// when no writer ever took one.
	Owner *infoOwner `json:"owner,omitempty"`
	// MountedAt is the mount point of the daemon that holds the store,
	// when the report comes from its .kvfs/ files (the store is locked):
	// then Owner, FDP and Attachment are absent.
	MountedAt string `json:"mounted_at,omitempty"`
	// DRAM is the daemon's DRAM tier (kvfs mount --dram), from its
	// .kvfs/stats; absent without a tier or when the store is not mounted.
	DRAM *infoDRAM `json:"dram,omitempty"`
}

// infoDRAM is the DRAM tier's size and counters as info reports them. Hits
// and misses count groups.
type infoDRAM struct {
	Bytes         uint64 `json:"dram_bytes"`
	Blocks        uint64 `json:"dram_blocks"`
	Hits          uint64 `json:"dram_hits"`
	Misses        uint64 `json:"dram_misses"`
	Evictions     uint64 `json:"dram_evictions"`
	PromotedBytes uint64 `json:"dram_promoted_bytes"`
	WrittenBytes  uint64 `json:"dram_written_bytes"`
	HugePages     uint64 `json:"dram_huge_pages"` // 1: on reserved huge pages
	Registered    uint64 `json:"dram_registered"` // 1: registered with the store's io_uring engine
}

// infoOwner is the ownership lease record as info reports it.
type infoOwner struct {
	Host   string     `json:"host"`
	Live   bool       `json:"live"`
	Expiry *time.Time `json:"expiry,omitempty"` // absent once released
	Text   string     `json:"-"`
}

func ownerReport(s *store.Store, now time.Time) (*infoOwner, error) {
	rec, err := store.ReadLease(s.Engine())
	if err != nil || rec == nil || rec.UUID != s.Superblock().UUID {
		return nil, err
	}
	o := &infoOwner{Host: rec.Host, Live: rec.Live(rec.UUID, now)}
	if !rec.Expiry.IsZero() {
		o.Expiry = &rec.Expiry
	}
	switch {
	case o.Live:
		o.Text = fmt.Sprintf("owner: %s, lease live until %s (%s from now)", rec.Host, rec.Expiry.UTC().Format(time.RFC3339), rec.Expiry.Sub(now).Round(time.Second))
	case rec.Expiry.IsZero():
		o.Text = fmt.Sprintf("owner: none (released by %s)", rec.Host)
	default:
		o.Text = fmt.Sprintf("owner: none (lease of %s expired at %s)", rec.Host, rec.Expiry.UTC().Format(time.RFC3339))
	}
	return o, nil
}

// attachReporter is implemented by the nvme engine.
type attachReporter interface {
	Attachment() *nvme.Attachment
}

// infoFDP is the NVMe Flexible Data Placement state of the namespace.
type infoFDP struct {
	Enabled bool            `json:"enabled"`
	Reason  string          `json:"reason,omitempty"` // why not, when disabled
	Handles []infoFDPHandle `json:"handles,omitempty"`
	Text    string          `json:"-"`
}

type infoFDPHandle struct {
	PID            uint16 `json:"pid"`
	Role           string `json:"role"` // meta (superblocks, slot headers) or data (payloads)
	AvailableBytes int64  `json:"available_bytes"`
}

// fdpReporter is implemented by the nvme engine.
type fdpReporter interface {
	FDPInfo() (*nvme.FDPInfo, error)
}

func fdpReport(e store.Engine) (*infoFDP, error) {
	f, ok := e.(fdpReporter)
	if !ok {
		return nil, nil
	}
	fi, err := f.FDPInfo()
	if err != nil {
		return nil, err
	}
	r := &infoFDP{Enabled: fi.Enabled, Reason: fi.Reason, Text: fi.String()}
	for i, h := range fi.Handles {
		role := "data"
		if i == 0 {
			role = "meta"
		}
		r.Handles = append(r.Handles, infoFDPHandle{PID: h.PID, Role: role, AvailableBytes: fi.AvailableBytes(i)})
	}
	return r, nil
}

func init() {
	var o infoOptions
	c := &cobra.Command{
		Use:   "info STORE",
		Short: "Show a store's geometry, sizes and slot usage",
		Long: `Show a store's geometry, sizes and slot usage. A store that a running
daemon holds (kvfs mount) is reported from the daemon's own view, the
mount's .kvfs/geometry and .kvfs/stats, found through /proc/mounts; the
ownership lease and the FDP state are shown only for a store not in use.`,
		Args: storeArg,
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	c.Flags().BoolVar(&o.json, "json", false, "print JSON (snake_case keys)")
	addEngineFlag(c, &o.engine)
	addCommand(c)
}

func (o *infoOptions) run(cmd *cobra.Command, path string) (err error) {
	r, err := o.report(cmd, path)
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	if o.json {
		return writeJSON(w, r)
	}
	g := r.Geometry
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, l := range [][2]string{
		{"store", r.Path},
		{"uuid", r.UUID},
		{"format version", fmt.Sprint(r.FormatVersion)},
		{"engine", r.Engine},
		{"geometry", fmt.Sprintf("layers=%d kv_heads=%d head_dim=%d block_tokens=%d dtype=%s align=%d",
			g.Layers, g.KVHeads, g.HeadDim, g.BlockTokens, g.DType, g.Align)},
		{"groups per block", fmt.Sprint(r.GroupsPerBlock)},
		{"group bytes", fmt.Sprintf("%d (%dx%d %s)", r.GroupBytes, g.BlockTokens, g.HeadDim, g.DType)},
		{"group stride", fmt.Sprint(r.GroupStride)},
		{"header bytes", fmt.Sprint(r.HeaderBytes)},
		{"slot bytes", fmt.Sprintf("%d (%s)", r.SlotBytes, bytesize.Format(r.SlotBytes))},
		{"slots", fmt.Sprintf("%d (%d used, %d free)", r.Slots, r.UsedSlots, r.FreeSlots)},
		{"blocks", fmt.Sprint(r.Blocks)},
		{"size", fmt.Sprintf("%d (%s)", r.Size, bytesize.Format(r.Size))},
		{"created", r.Created.Format(time.RFC3339)},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", l[0], l[1])
	}
	if r.MountedAt != "" {
		fmt.Fprintf(tw, "mounted at:\t%s (the daemon holds the store: these figures are its own, from %s)\n",
			r.MountedAt, filepath.Join(r.MountedAt, ".kvfs"))
	}
	if d := r.DRAM; d != nil {
		ratio := ""
		if n := d.Hits + d.Misses; n > 0 {
			ratio = fmt.Sprintf(", hit ratio %.3f", float64(d.Hits)/float64(n))
		}
		fmt.Fprintf(tw, "dram tier:\t%s holding %d blocks; %d groups hit, %d missed%s; %d evictions; %s promoted, %s kept from writes\n",
			bytesize.Format(int64(d.Bytes)), d.Blocks, d.Hits, d.Misses, ratio, d.Evictions, bytesize.Format(int64(d.PromotedBytes)),
			bytesize.Format(int64(d.WrittenBytes)))
	}
	if wb := r.WrittenBytes; wb != nil {
		line := fmt.Sprintf("%d (%s)", *wb, bytesize.Format(*wb))
		if fs := r.fileBytes; fs > 0 && *wb < fs {
			line += fmt.Sprintf(", %.1f %% of the file: the rest reads as zeros without disk I/O (format --zero writes it)", 100*float64(*wb)/float64(fs))
		}
		fmt.Fprintf(tw, "written:\t%s\n", line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Owner != nil {
		if _, err := fmt.Fprintln(w, r.Owner.Text); err != nil {
			return err
		}
	}
	if r.Attachment != nil {
		if _, err := fmt.Fprintln(w, attachmentText(r.Attachment)); err != nil {
			return err
		}
	}
	if r.FDP != nil {
		_, err = fmt.Fprintln(w, r.FDP.Text)
	}
	return err
}

// report opens the store read-only and reports on it; a store another
// process holds is reported from its mount (lockedInfo).
func (o *infoOptions) report(cmd *cobra.Command, path string) (r infoReport, err error) {
	s, closeAll, _, err := o.openStore(cmd, path, true)
	if errors.Is(err, store.ErrLocked) {
		return lockedInfo(path, err)
	}
	if err != nil {
		return r, err
	}
	defer closeInto(&err, closeAll)
	r = newInfoReport(path, s)
	if r.FDP, err = fdpReport(s.Engine()); err != nil {
		return r, err
	}
	if a, ok := s.Engine().(attachReporter); ok {
		r.Attachment = a.Attachment()
	}
	r.Owner, err = ownerReport(s, time.Now())
	return r, err
}

func newInfoReport(path string, s *store.Store) infoReport {
	in := s.Info()
	g := in.Geometry
	r := infoReport{
		Path: path, UUID: in.UUID, FormatVersion: in.Version, Engine: in.Engine,
		Geometry: infoGeometry{Layers: g.Layers, KVHeads: g.KVHeads, HeadDim: g.HeadDim,
			BlockTokens: g.BlockTokens, DType: g.DType.String(), Align: g.Align},
		GroupsPerBlock: g.GroupsPerBlock(), GroupBytes: in.GroupBytes, GroupStride: in.GroupStride,
		HeaderBytes: in.HeaderBytes, SlotBytes: in.SlotBytes, Slots: in.Slots,
		UsedSlots: in.UsedSlots, FreeSlots: in.FreeSlots, Blocks: len(s.Blocks()),
		Size: in.Size, Created: in.Created.UTC(),
	}
	// A store file's written bytes; nothing for a device.
	if w, size, err := store.WrittenBytes(path); err == nil {
		r.WrittenBytes, r.fileBytes = &w, size
	}
	return r
}

// attachmentText is info's attachment lines: "attachment: fabric, tcp …"
// then one line per controller path.
func attachmentText(a *nvme.Attachment) string {
	var b strings.Builder
	where := "local"
	if a.Fabric() {
		where = "fabric"
	}
	fmt.Fprintf(&b, "attachment: %s, transport %s, subsysnqn %s", where, a.Transport(), a.SubsysNQN)
	for _, p := range a.Paths {
		fmt.Fprintf(&b, "\n  path %s: %s %s (%s)", p.Name, p.Transport, p.Address, p.State)
	}
	return b.String()
}
