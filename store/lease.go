package store

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// The ownership lease: one 4 KiB record at LeaseOffset, in the gap between
// the two superblock copies that format version 1 leaves unused (zeros on
// every store, so no version bump: a store without a record is free). It
// names the host whose daemon writes the store and until when; that
// daemon renews it. A daemon on another host refuses to open the store
// for writing while the lease is live, unless forced (--force-takeover).
// The store's flock only covers one host; a namespace attached to two
// hosts (NVMe over Fabrics, a shared SAN LUN) needs this record.
const (
	LeaseOffset  = 32 << 10
	leaseMagic   = "KVFSLEAS"
	leaseVersion = 1
	leaseHostMax = 64
	// DefaultLeaseTTL is how long a lease lives without renewal.
	DefaultLeaseTTL = 30 * time.Second
)

var (
	// ErrLeaseHeld: another host's daemon holds a live lease on the store.
	ErrLeaseHeld = errors.New("store: owned by a daemon on another host (live lease; --force-takeover takes it over)")
	// ErrLeaseLost: the lease this store held was taken over or expired
	// unrenewed; the store refuses every write from then on.
	ErrLeaseLost = errors.New("store: ownership lease lost: another host may own the store; writes refused")
)

// LeaseRecord is the on-disk ownership record.
type LeaseRecord struct {
	UUID     [16]byte  // the store's UUID: a record of a former store is no lease
	Host     string    // owner's host id, at most 64 bytes
	Token    [16]byte  // random per acquisition: tells a takeover from a renewal
	Acquired time.Time // when this owner acquired it
	Expiry   time.Time // the lease is live until then; zero: released
}

// Live reports whether the record is a lease on the store uuid that has
// not expired at now.
func (r *LeaseRecord) Live(uuid [16]byte, now time.Time) bool {
	return r != nil && r.UUID == uuid && !r.Expiry.IsZero() && now.Before(r.Expiry)
}

// MarshalLease encodes r into SuperblockSize bytes:
// magic(8) version(4) pad(4) uuid(16) host(64, NUL padded) token(16)
// acquired ns(8) expiry ns(8, 0 = released) … CRC32C of bytes 0..4091 at 4092.
func MarshalLease(r *LeaseRecord) []byte {
	b := make([]byte, SuperblockSize)
	le := binary.LittleEndian
	copy(b, leaseMagic)
	le.PutUint32(b[8:], leaseVersion)
	copy(b[16:32], r.UUID[:])
	copy(b[32:32+leaseHostMax], r.Host)
	copy(b[96:112], r.Token[:])
	le.PutUint64(b[112:], uint64(r.Acquired.UnixNano()))
	if !r.Expiry.IsZero() {
		le.PutUint64(b[120:], uint64(r.Expiry.UnixNano()))
	}
	le.PutUint32(b[SuperblockSize-4:], CRC32C(b[:SuperblockSize-4]))
	return b
}

// UnmarshalLease decodes a lease record; (nil, nil) when b holds none (no
// magic: a store that never had an owner). A damaged record is an error
// wrapping ErrSuperblock.
func UnmarshalLease(b []byte) (*LeaseRecord, error) {
	if len(b) < SuperblockSize {
		return nil, fmt.Errorf("%w: lease record of %d bytes", ErrSuperblock, len(b))
	}
	if !bytes.Equal(b[:8], []byte(leaseMagic)) {
		return nil, nil
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[SuperblockSize-4:]), CRC32C(b[:SuperblockSize-4]); got != want {
		return nil, fmt.Errorf("%w: lease record checksum %08x, want %08x", ErrSuperblock, got, want)
	}
	if v := le.Uint32(b[8:]); v != leaseVersion {
		return nil, fmt.Errorf("%w: lease record version %d, this kvfs reads %d", ErrVersion, v, leaseVersion)
	}
	r := &LeaseRecord{Host: string(bytes.TrimRight(b[32:32+leaseHostMax], "\x00"))}
	copy(r.UUID[:], b[16:32])
	copy(r.Token[:], b[96:112])
	r.Acquired = time.Unix(0, int64(le.Uint64(b[112:])))
	if ns := le.Uint64(b[120:]); ns != 0 {
		r.Expiry = time.Unix(0, int64(ns))
	}
	return r, nil
}

// ReadLease reads the store's ownership record on e: nil when there is
// none.
func ReadLease(e Engine) (*LeaseRecord, error) {
	b, err := readAligned(e, LeaseOffset, SuperblockSize)
	if err != nil {
		return nil, fmt.Errorf("store: read lease: %w", err)
	}
	return UnmarshalLease(b)
}

func writeLease(e Engine, r *LeaseRecord) error {
	buf, err := AllocAligned(SuperblockSize)
	if err != nil {
		return err
	}
	defer FreeAligned(buf)
	copy(buf, MarshalLease(r))
	if err := doAll(e, []IO{{Op: OpWrite, Off: LeaseOffset, Buf: buf, Stream: StreamMeta}}); err != nil {
		return fmt.Errorf("store: write lease: %w", err)
	}
	if err := e.Sync(); err != nil {
		return fmt.Errorf("store: sync lease: %w", err)
	}
	return nil
}

// LeaseOptions make Open take the store's ownership lease (see
// LeaseOffset). Read-only opens never take it.
type LeaseOptions struct {
	// Host identifies this host; "" means os.Hostname(). Two hosts must
	// not share an id.
	Host string
	// TTL is how long the lease lives unrenewed (default DefaultLeaseTTL).
	// Hosts' clocks must agree to well within it (NTP).
	TTL time.Duration
	// RenewEvery is the renewal period (default TTL/3); negative: the
	// store does not renew by itself (the caller calls RenewLease).
	RenewEvery time.Duration
	// Force takes over a live lease of another host (its daemon, if it
	// still runs, finds the lease lost at its next renewal and stops
	// writing).
	Force bool
	// CheckOnly refuses the open while another host's lease is live but
	// takes no lease and writes nothing: for short writers (one kvfs put)
	// that must not change the store when their input turns out bad.
	CheckOnly bool
}

// lease is the store's held lease.
type lease struct {
	o    LeaseOptions
	mu   sync.Mutex // serialises renewals and the release
	rec  LeaseRecord
	exp  atomic.Int64 // rec.Expiry in unix ns, for the write path
	lost atomic.Bool
	stop chan struct{}
	done chan struct{}
}

// acquireLease takes the ownership lease of the open store (s.sb is read).
func (s *Store) acquireLease(o LeaseOptions) error {
	if o.Host == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("store: lease host id: %w", err)
		}
		o.Host = h
	}
	if len(o.Host) > leaseHostMax {
		return fmt.Errorf("%w: lease host id %q longer than %d bytes", ErrInvalid, o.Host, leaseHostMax)
	}
	if o.TTL <= 0 {
		o.TTL = DefaultLeaseTTL
	}
	if o.RenewEvery == 0 {
		o.RenewEvery = o.TTL / 3
	}
	cur, err := ReadLease(s.e)
	if err != nil {
		if !o.Force {
			return fmt.Errorf("%w (--force-takeover rewrites it)", err)
		}
		cur = nil
	}
	now := s.now()
	if cur.Live(s.sb.UUID, now) && cur.Host != o.Host {
		if !o.Force {
			return fmt.Errorf("%w: host %q until %s (%s from now)", ErrLeaseHeld, cur.Host,
				cur.Expiry.UTC().Format(time.RFC3339), cur.Expiry.Sub(now).Round(time.Second))
		}
		s.log.Warn("taking over a live ownership lease", zap.String("owner", cur.Host), zap.Time("expiry", cur.Expiry))
	}
	if o.CheckOnly {
		return nil
	}
	l := &lease{o: o, rec: LeaseRecord{UUID: s.sb.UUID, Host: o.Host, Acquired: now, Expiry: now.Add(o.TTL)}}
	if _, err := rand.Read(l.rec.Token[:]); err != nil {
		return fmt.Errorf("store: lease token: %w", err)
	}
	if err := writeLease(s.e, &l.rec); err != nil {
		return err
	}
	// Read back: of two hosts acquiring in the same instant, the later
	// write wins and the other sees a token that is not its own.
	if got, err := ReadLease(s.e); err != nil {
		return err
	} else if got == nil || got.Token != l.rec.Token {
		return fmt.Errorf("%w: another host wrote the lease while this one acquired it", ErrLeaseHeld)
	}
	l.exp.Store(l.rec.Expiry.UnixNano())
	s.lease = l
	s.log.Info("ownership lease acquired", zap.String("host", o.Host), zap.Duration("ttl", o.TTL), zap.Time("expiry", l.rec.Expiry))
	if o.RenewEvery > 0 {
		l.stop, l.done = make(chan struct{}), make(chan struct{})
		go s.renewLoop(l)
	}
	return nil
}

func (s *Store) renewLoop(l *lease) {
	defer close(l.done)
	t := time.NewTicker(l.o.RenewEvery)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			if err := s.RenewLease(); err != nil {
				s.log.Error("ownership lease renewal failed", zap.Error(err))
				if errors.Is(err, ErrLeaseLost) {
					return
				}
			}
		}
	}
}

// RenewLease extends the store's lease by its TTL. It fails with
// ErrLeaseLost, and the store refuses writes from then on, when another
// host has taken the lease over or the lease expired before it could be
// renewed. Without a lease it does nothing.
func (s *Store) RenewLease() error {
	l := s.lease
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost.Load() {
		return ErrLeaseLost
	}
	cur, err := ReadLease(s.e)
	now := s.now()
	if err == nil && (cur == nil || cur.Token != l.rec.Token) {
		l.lost.Store(true)
		owner := "nobody"
		if cur != nil {
			owner = fmt.Sprintf("%q", cur.Host)
		}
		return fmt.Errorf("%w: the record now names %s", ErrLeaseLost, owner)
	}
	if err == nil {
		next := l.rec
		next.Expiry = now.Add(l.o.TTL)
		if err = writeLease(s.e, &next); err == nil {
			l.rec = next
			l.exp.Store(next.Expiry.UnixNano())
			return nil
		}
	}
	if !now.Before(l.rec.Expiry) {
		l.lost.Store(true)
		return fmt.Errorf("%w: expired at %s unrenewed: %w", ErrLeaseLost, l.rec.Expiry.UTC().Format(time.RFC3339), err)
	}
	return fmt.Errorf("store: renew lease (still live until %s): %w", l.rec.Expiry.UTC().Format(time.RFC3339), err)
}

// Lease is the store's current ownership record, nil when it holds none.
func (s *Store) Lease() *LeaseRecord {
	l := s.lease
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rec
	return &r
}

// checkLease fails writes once the lease is lost.
func (s *Store) checkLease() error {
	if l := s.lease; l != nil && (l.lost.Load() || s.now().UnixNano() >= l.exp.Load()) {
		l.lost.Store(true)
		return ErrLeaseLost
	}
	return nil
}

// releaseLease stops renewing and, if the lease is still this store's,
// marks it released (expiry zero) so that another host may take the
// store at once.
func (s *Store) releaseLease() error {
	l := s.lease
	if l == nil {
		return nil
	}
	if l.stop != nil {
		close(l.stop)
		<-l.done
		l.stop = nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost.Load() {
		return nil
	}
	cur, err := ReadLease(s.e)
	if err != nil {
		return err
	}
	if cur == nil || cur.Token != l.rec.Token {
		return nil
	}
	rel := l.rec
	rel.Expiry = time.Time{}
	l.lost.Store(true)
	return writeLease(s.e, &rel)
}
