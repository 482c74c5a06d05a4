// Package fs is kvfs's FUSE file system (go-fuse v2) over an open
// store.Store. It owns the tree, the file operations on groups, the
// extended attributes and the .kvfs/ control files; it keeps no state the
// store already has: every lookup, listing and read asks the store (reads,
// writes, unlinks and block renames through the DRAM tier in front of it
// when there is one, Options.Tier).
//
// # Invariants
//
//   - fs keeps no copy of the store's state beyond one operation (lookups,
//     listings, attributes and reads ask the store), except the pending
//     block and head directories and the staged files, which live in
//     memory only, and the read-ahead cache, whose snapshots are served
//     only while the index still names them.
//   - A staged file never reaches the store by itself: only a rename onto
//     K or V stores it, with the checks of a close of K or V.
//   - No byte reaches a reader that store.Read did not verify; one read(2)
//     returns bytes of one version, never older than the version current
//     when its READ arrived.
//   - A group is stored whole or not at all: exactly one group's bytes, at
//     close(2) or fsync(2).
//   - Only syscall.Errno crosses the FUSE boundary, made in one function.
//
// # Tree
//
//	layer-<L>/block-<16 hex>/head-<H>/K and V   one group each
//	.kvfs/ctl       ioctls, forwarded to Options.Ctl (a CtlHandler)
//	.kvfs/stats     JSON: counters and sizes (slots used, groups, reads, rejections…)
//	.kvfs/geometry  JSON
//
// Names come from package layout (zero-padded layer and head numbers, 16
// lowercase hex digits for a block). A name that does not parse, or is out
// of range, is ENOENT.
//
//   - Every layer directory exists (layer-00 … layer-31 for 32 layers).
//   - A layer directory lists the blocks that have at least one group in
//     that layer (not every block of the store), plus the pending block
//     directories of that layer (below).
//   - A block directory lists the heads that have a group in that layer,
//     plus the pending head directories (below); so a fresh block
//     directory is empty and cp -r of a saved block can make its heads.
//   - A head directory lists the groups present (K, V, both or neither)
//     and its staged files (below).
//   - A group's size is the group size, its mtime (= atime = ctime) the time
//     it was written; a block or head directory's mtime is the block's
//     latest write. Inode numbers are a hash of the name (see ino.go), so
//     they are stable across lookups and mounts.
//   - statfs reports the store: 4 KiB blocks, total and free slots' bytes.
//
// # Reading and the cache policy
//
// Group files are opened with FOPEN_DIRECT_IO: the kernel keeps no page
// cache for them, so every read(2) reaches the daemon. A handle takes the
// whole group once, as a snapshot labelled with the group's identity in
// the store's index (CRC, mtime, slot); every later READ on the handle
// first checks the index (store.Stat: in memory, no I/O) and takes the
// group again if it was rewritten since (by this file system or by the
// ioctl path), or fails with ESTALE if it was deleted or evicted. So no
// reader ever gets bytes older than the version current when its READ
// arrived, and one read(2) returns bytes of a single version (a read of
// the whole group is one READ: max_read is 1 MiB). Bytes come from
// store.Read, CRC32C verified: a mismatch is EIO, logged.
//
// Read-ahead (cache.go): a group not in the cache is read together with
// the rest of its layer's extent in the block (K and V of every head,
// contiguous in the slot: one I/O) when that is at most Options.ReadAhead
// bytes (1 MiB), and the snapshots go to an LRU of Options.CacheBytes
// (32 MiB). Snapshots are labelled before the read and served only while
// the index still gives that label, as above: the cache can cost a
// re-read, never a stale byte. It turns the walk of a tool (find | xargs
// cat goes head by head, K then V) into one I/O per block and layer, and
// re-reads of unchanged groups into no I/O.
//
// Attributes of groups and of block and head directories are never cached
// (timeout 0), and neither are missing names (negative timeout 0): stat
// shows a rewrite's mtime at once, and a group or block written through the
// ioctl path is visible at once. Existing names of groups, head directories
// and the static directories may be cached for Options.EntryTimeout (1 s):
// that only lets the kernel skip a LOOKUP, because Getattr, Open, Readdir
// and the lookups below a name all ask the store again and answer ENOENT
// for what is gone. Names that a rename moves in place (block
// directories, staged files) are not cached at all: after rename(2) the kernel
// keeps the moved node under the new name, and only a fresh LOOKUP
// replaces it with the node of what the name holds now (a LOOKUP asks the
// in-memory index: one round trip, no I/O). The static directories (root,
// layer-<L>, .kvfs) cache their attributes for EntryTimeout too.
// Read-only handles are FOPEN_NOFLUSH (close sends no FLUSH). mmap of a
// group is not supported (direct I/O).
//
// Files are for tools and inspection; bulk loads go through .kvfs/ctl. A
// file read costs five FUSE round trips (OPEN, GETATTR, READ, READ at EOF,
// RELEASE). Serving groups through the page cache instead of DIRECT_IO
// would need attributes cached (the kernel asks for them on every read(2)
// of a cached file) and invalidation hooks on the ioctl path to stay
// correct. What these choices cost and gain, measured: docs/performance.md,
// "Reading through files".
//
// # Writing
//
//   - mkdir -p layer-<L>/block-<id>/head-<H> makes a pending block
//     directory and a pending head directory in it: they live in memory
//     only (lost at unmount, at most Options.MaxPending block directories,
//     ENOSPC beyond), are listed empty, and become real when a group is
//     written into them. rmdir removes them. mkdir of a head that holds a
//     group, or is pending, is EEXIST.
//   - Opening K or V for writing (O_CREAT|O_TRUNC, as cp and dd do) gives
//     a handle that buffers its own bytes; Flush (close(2)) stores them with
//     one durable store.Write when they are exactly one group, and its
//     error is close(2)'s: EINVAL for any other total size (nothing is
//     stored), EFBIG after a write past the group (write(2) failed with
//     EFBIG already; nothing is stored). Fsync stores the same way. Two
//     writers of one group never mix: the last complete close wins. A
//     handle opened without O_TRUNC starts from the group's current bytes,
//     so dd conv=notrunc patches a group in place; O_RDWR reads its own
//     unstored bytes. truncate(2) by path is allowed only to the group size.
//   - Any other name created in a head directory is a staged file
//     (staged.go): rsync's .K.XXXXXX, editors' and installers' temporary
//     names. Its bytes (at most one group; EFBIG beyond) stay in memory;
//     a rename onto K or V of any head directory stores them as that group
//     (exactly the group size, else the rename fails with ERANGE and
//     stores nothing); unlink drops it; one never renamed disappears
//     Options.StageLinger (5 s) after its last close (rsync closes, sets
//     times, then renames), or at unmount. At most Options.MaxStaged
//     (1024) at once, ENOSPC beyond.
//   - rm of a group deletes it (durably). A head or block directory
//     emptied this way stays, empty and pending, until rmdir, as any
//     directory would; so rm -r layer-<L>/block-<id> (and rm -rf, and find
//     -delete) deletes that layer's groups of the block and then the
//     directories, without error. A block that loses its groups any other
//     way (eviction, the ioctl path) disappears at once. rmdir of a head
//     directory succeeds once it has no groups and no staged files; rmdir
//     of a block directory with groups or head directories is ENOTEMPTY.
//   - rename: layer-<L>/block-<A> onto block-<B> in the same layer
//     re-keys the block in the store (store.RenameBlock: one header write
//     and sync, no payload moved, crash-safe); a block holds every layer,
//     so it moves in every layer; ENOTEMPTY when B is a block already. A
//     group (onto K or V anywhere, its own head's other kind included), a
//     head directory, or a block to another layer is EXDEV, so mv copies
//     and deletes instead (for a group: one group's bytes through the
//     write path, then the delete; a crash between leaves both). A group
//     onto a temporary name, or a layer directory, is EPERM.
//     RENAME_NOREPLACE is honoured; RENAME_EXCHANGE is EINVAL. After a
//     rename the kernel keeps the moved node under the new name; names of
//     block directories and staged files are therefore never cached
//     (entry timeout 0, see below), so the next use of the name asks again
//     and gets the node of what it holds now.
//   - chmod, chown and setting times are accepted and ignored on every
//     group, staged file and directory: nothing is stored (a group is
//     always mode 0644, owned by the mount's user, with its write time as
//     every time), so cp -a, tar x and rsync -a restore without errors.
//     While a group is being written, its attributes exist by path too
//     (tar and cp -a set times by path before they close).
//   - Anything else is refused: other names outside head directories,
//     symlinks, hard links, mknod (EPERM); setxattr (accepted and ignored
//     for user.kvfs.* on groups, which are computed and which backups made
//     with cp -a or rsync -X carry; EPERM for other user.* names;
//     EOPNOTSUPP for other namespaces, as a file system without them
//     answers); removexattr (EPERM for user.kvfs.*, ENODATA otherwise).
//
// # Extended attributes
//
// Every group has user.kvfs.block (16 hex), user.kvfs.layer,
// user.kvfs.head, user.kvfs.kind (K or V), user.kvfs.dtype (bf16 …),
// user.kvfs.shape (tokens x head_dim, e.g. 16x128), user.kvfs.crc32c
// (8 hex, as recorded when written) and user.kvfs.slot (the slot holding
// the block now); listxattr lists them, so getfattr -d shows them. Every
// stored block's directory has user.kvfs.tag (32 hex, the tag it was
// stored under, zeros when untagged) and, when it names one,
// user.kvfs.parent (16 hex, the block before it in its sequence); both
// read-only (set: accepted and ignored, as on groups).
//
// # .kvfs/ctl
//
// Opening ctl calls Options.Ctl.Open with the caller's uid and gid and
// keeps the CtlSession for the handle; every ioctl on the handle goes to
// CtlSession.Ioctl (FUSE passes only restricted ioctls: _IOC_SIZE(cmd)
// bytes in and out, at most 16383, which MaxWrite = 1 MiB allows); the
// session is released when the handle is (also when the client is killed).
// Without a handler every ioctl is ENOTTY. ctl is mode 0600, owned by the
// mounting user, unless Options.CtlMode/CtlGID say otherwise; the kernel
// checks these modes (default_permissions) when the mount allows other
// users. Other files answer ioctls with ENOTTY.
//
// # Errors
//
// Store and layout errors become errnos in one function, toErrno
// (errno.go): not found ENOENT, checksum mismatch EIO, store full ENOSPC,
// store closed ESHUTDOWN, bad size or request EINVAL, a rename onto an
// existing block ENOTEMPTY; anything else is logged and becomes EIO. No
// input makes the daemon exit.
//
// A refusal whose errno alone does not explain it is logged as a warning
// ("fs: refused", with the op, the path and why, through FS.refuse): a
// name the tree has no place for (mkdir layer-00/foo, a create in a block
// directory), a link, a rename kvfs does not do, a write past the group,
// and a group file closed for good holding other than one group's bytes
// (logged at RELEASE, once: a shell's redirection never looks at the
// EINVAL of close(2), and a close of a dup'd descriptor flushes before the
// writes are done).
//
// # Locks
//
// FS.mu guards only the pending directories, the staged files' names and
// lifetimes, and the table of handles writing each group; it is a leaf,
// never held while calling the store. groupHandle.mu guards one handle's
// buffer and snapshot and may be held across store calls (Flush stores
// under it), as may staged.mu (a rename stores under it), so the order is
// groupHandle.mu or staged.mu → store's locks → FS.mu. groupFile.mu (the
// group a renamed node stands for) is a leaf.
package fs
