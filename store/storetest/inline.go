package storetest

import "github.com/kvfs/kvfs/store"

// Inline wraps an engine with store.InlineReader, as the ring and posix
// engines offer it on page-cache files: ReadInline performs one read with
// the inner engine's Do on the calling goroutine.
type Inline struct {
	store.Engine
}

// NewInline wraps e.
func NewInline(e store.Engine) *Inline { return &Inline{Engine: e} }

// InlineReads implements store.InlineReader.
func (n *Inline) InlineReads() bool { return true }

// ReadInline implements store.InlineReader.
func (n *Inline) ReadInline(io *store.IO) error {
	ios := []store.IO{*io}
	if err := n.Engine.Do(ios); err != nil {
		return err
	}
	io.Err = ios[0].Err
	return io.Err
}

// HostView reports the inner engine's host view (store.HostViewer), nil
// when it has none.
func (n *Inline) HostView() []byte {
	if v, ok := n.Engine.(store.HostViewer); ok {
		return v.HostView()
	}
	return nil
}

// VectorReads reports the inner engine's answer (store.VectorReader).
func (n *Inline) VectorReads() bool {
	v, ok := n.Engine.(store.VectorReader)
	return ok && v.VectorReads()
}

var _ store.InlineReader = (*Inline)(nil)
