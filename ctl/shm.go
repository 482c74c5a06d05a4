package ctl

import (
	"fmt"
	"math"
	"strings"

	"golang.org/x/sys/unix"
)

// Access bits for mayAccess.
const (
	accX = 1
	accW = 2
	accR = 4
)

// mayAccess reports whether a process with uid and (primary) gid may access
// a file of the given mode and owner with the wanted rwx bits, as the
// kernel's permission check would decide without supplementary groups,
// ACLs or capabilities other than uid 0's.
//
// The policy of REGISTER_HOST is exactly this check with read and write on
// the file and search on every directory from the shared-memory dir down:
// a caller may register a file it could open read-write itself. FUSE passes
// only the caller's uid and primary gid, so a file reachable through a
// supplementary group only is refused.
func mayAccess(mode, fileUID, fileGID, uid, gid, want uint32) bool {
	if uid == 0 {
		// Root may read and write anything; search needs some x bit on a
		// directory, which holds for every directory we walk here.
		return true
	}
	var perm uint32
	switch {
	case fileUID == uid:
		perm = mode >> 6 & 7
	case fileGID == gid:
		perm = mode >> 3 & 7
	default:
		perm = mode & 7
	}
	return perm&want == want
}

const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

func openat2(dir int, name string, flags int) (int, error) {
	for {
		fd, err := unix.Openat2(dir, name, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: resolveFlags})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// pathError wraps an errno from resolving a path in the matching sentinel.
func pathError(path string, err error) error {
	switch err {
	case unix.ELOOP:
		return fmt.Errorf("%w: %s", ErrSymlink, path)
	case unix.EXDEV:
		return fmt.Errorf("%w: %s crosses a mount point", ErrFilesystem, path)
	}
	return fmt.Errorf("ctl: open %s: %w", path, err)
}

// splitShm checks that path names a file strictly inside dir and returns
// its components below dir.
func splitShm(dir, path string) ([]string, error) {
	dir = strings.TrimRight(dir, "/")
	rel, ok := strings.CutPrefix(path, dir+"/")
	if !ok {
		return nil, fmt.Errorf("%w: %s (want %s/…)", ErrOutside, path, dir)
	}
	parts := strings.Split(rel, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			return nil, fmt.Errorf("%w: %s has an empty, . or .. component", ErrOutside, path)
		}
	}
	return parts, nil
}

// shmFile is an opened, checked registration candidate.
type shmFile struct {
	fd   int
	size int64
	dev  uint64
	ino  uint64
}

// openShm opens path read-write for a caller with uid and gid. path must be
// an absolute name of a regular file inside dir, reached without following
// any symbolic link, without leaving dir's mount, through directories the
// caller may search, and the caller must be allowed to read and write the
// file (mayAccess). dir must be on tmpfs or hugetlbfs. The file is first
// opened O_PATH (no side effects on a FIFO or device), checked, then opened
// read-write and checked to be the same inode.
func openShm(dir, path string, uid, gid uint32) (*shmFile, error) {
	parts, err := splitShm(dir, path)
	if err != nil {
		return nil, err
	}
	root, err := unix.Openat2(unix.AT_FDCWD, strings.TrimRight(dir, "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, pathError(dir, err)
	}
	cur := root
	defer func() { unix.Close(cur) }()
	var fs unix.Statfs_t
	if err := unix.Fstatfs(root, &fs); err != nil {
		return nil, fmt.Errorf("ctl: statfs %s: %w", dir, err)
	}
	if fs.Type != unix.TMPFS_MAGIC && fs.Type != unix.HUGETLBFS_MAGIC {
		return nil, fmt.Errorf("%w: %s (type %#x)", ErrFilesystem, dir, fs.Type)
	}
	var st unix.Stat_t
	if err := unix.Fstat(root, &st); err != nil {
		return nil, fmt.Errorf("ctl: stat %s: %w", dir, err)
	}
	if !mayAccess(st.Mode, st.Uid, st.Gid, uid, gid, accX) {
		return nil, fmt.Errorf("%w: %s is not searchable", ErrAccess, dir)
	}
	for _, p := range parts[:len(parts)-1] {
		fd, err := openat2(cur, p, unix.O_PATH|unix.O_NOFOLLOW)
		if err != nil {
			return nil, pathError(path, err)
		}
		unix.Close(cur)
		cur = fd
		if err := unix.Fstat(cur, &st); err != nil {
			return nil, fmt.Errorf("ctl: stat %s: %w", path, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
		case unix.S_IFLNK:
			return nil, fmt.Errorf("%w: %s: %s", ErrSymlink, path, p)
		default:
			return nil, fmt.Errorf("%w: %s: %s is not a directory", ErrNotRegular, path, p)
		}
		if !mayAccess(st.Mode, st.Uid, st.Gid, uid, gid, accX) {
			return nil, fmt.Errorf("%w: directory %s of %s is not searchable", ErrAccess, p, path)
		}
	}
	name := parts[len(parts)-1]
	pfd, err := openat2(cur, name, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return nil, pathError(path, err)
	}
	err = unix.Fstat(pfd, &st)
	unix.Close(pfd)
	if err != nil {
		return nil, fmt.Errorf("ctl: stat %s: %w", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFLNK:
		return nil, fmt.Errorf("%w: %s", ErrSymlink, path)
	default:
		return nil, fmt.Errorf("%w: %s (mode %#o)", ErrNotRegular, path, st.Mode)
	}
	if !mayAccess(st.Mode, st.Uid, st.Gid, uid, gid, accR|accW) {
		return nil, fmt.Errorf("%w: %s (owner %d:%d mode %#o, caller %d:%d)", ErrAccess, path, st.Uid, st.Gid, st.Mode&0o7777, uid, gid)
	}
	dev, ino := st.Dev, st.Ino
	fd, err := openat2(cur, name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, pathError(path, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ctl: stat %s: %w", path, err)
	}
	if st.Dev != dev || st.Ino != ino || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: %s was replaced while it was checked", ErrNotRegular, path)
	}
	return &shmFile{fd: fd, size: st.Size, dev: dev, ino: ino}, nil
}

// mapShm maps length bytes (0: the whole file) of f shared and read-write.
func mapShm(f *shmFile, length uint64) ([]byte, error) {
	if length == 0 {
		length = uint64(f.size)
	}
	if length == 0 || length > uint64(f.size) || length > math.MaxInt {
		return nil, fmt.Errorf("%w: %d bytes of a %d-byte file", ErrLength, length, f.size)
	}
	mem, err := unix.Mmap(f.fd, 0, int(length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("ctl: mmap %d bytes: %w", length, err)
	}
	return mem, nil
}
